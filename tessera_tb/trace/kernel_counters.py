"""A worker's hardware counters per kernel (`<worker>/kernel_counters.pb`, docs/FORMAT.md,
"Kernel counters"): the in-memory form, the writer and the reader.

Counters come from a separate Nsight Compute process; each profiled kernel may point at the
run kernel it was matched with (step + event row). Values are float64 with NaN for "no value",
never 0; each metric carries its unit, where it came from and a capability tag.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from google.protobuf.message import DecodeError

from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import columns, layout
from tessera_tb.trace.atomic import write_bytes_atomic
from tessera_tb.trace.errors import SchemaVersionError, TraceFormatError
from tessera_tb.trace.schema_version import SCHEMA_MAJOR, SCHEMA_MINOR

KERNEL_COUNTERS_FILE = "kernel_counters.pb"

# `match` codes. MATCH_INSTANCE: the run kernel was not profiled itself; it has the counters
# of a profiled launch of the same kernel (name, grid, block) (ncu_step_join.py).
MATCH_NONE, MATCH_NAME, MATCH_BASE_NAME, MATCH_INSTANCE = 0, 1, 2, 3
MATCH_NAMES = {
    MATCH_NONE: "none",
    MATCH_NAME: "name",
    MATCH_BASE_NAME: "base_name",
    MATCH_INSTANCE: "same_kernel_instance",
}
# The capability a counter value of a linked kernel carries, by match code.
MEASURED = "measured"
MEASURED_SAME_INSTANCE = "measured:same-kernel-instance"
MATCH_CAPABILITY = {
    MATCH_NAME: MEASURED,
    MATCH_BASE_NAME: MEASURED,
    MATCH_INSTANCE: MEASURED_SAME_INSTANCE,
}

METHOD_NAME_ORDER = "name+order"
METHOD_NVTX_STEP = "nvtx-step"
METHOD_COUNTER_ONLY = "counter-only"
LINKED_METHODS = (METHOD_NAME_ORDER, METHOD_NVTX_STEP)


@dataclass
class CounterMetric:
    """One metric: `values[i]` belongs to profiled kernel i (NaN = no value)."""

    name: str
    unit: str
    values: np.ndarray
    source: str = ""
    source_unit: str = ""
    capability: str = "ok"

    @property
    def available(self) -> bool:
        return not self.capability.startswith("unavailable")


@dataclass
class MatchReport:
    """How the profiled kernels were matched with the run's (FORMAT.md, "Kernel counters")."""

    profiled_kernels: int = 0
    run_kernels: int = 0
    matched: int = 0
    matched_base_name: int = 0
    mismatched: int = 0
    outside: int = 0
    offset: int = 0
    tied_offsets: int = 0
    first_mismatches: list[str] = field(default_factory=list)


@dataclass
class CounterProfile:
    """The kernel counters of one worker. Arrays have one element per profiled kernel."""

    worker: str
    source: str
    source_format: str
    match_method: str
    match_note: str
    compute_capability: str
    device_name: str
    profiled_id: np.ndarray  # int64, the source's launch ID
    kernel_names: np.ndarray  # object: names as the source spells them
    step: np.ndarray  # int64: step of the matched run kernel (meaningful where row >= 0)
    row: np.ndarray  # int32: event row in that step file, -1 = not matched
    match: np.ndarray  # uint8 MATCH_* codes
    metrics: dict[str, CounterMetric]
    report: MatchReport = field(default_factory=MatchReport)

    @property
    def count(self) -> int:
        return int(self.profiled_id.size)

    def values(self, name: str) -> np.ndarray:
        """The metric's values, or all-NaN when the profile does not have it."""
        m = self.metrics.get(name)
        return m.values if m is not None else np.full(self.count, np.nan)

    def has(self, name: str) -> bool:
        """True when the metric is present and has at least one value."""
        m = self.metrics.get(name)
        return m is not None and m.available and bool(np.isfinite(m.values).any())

    def frame(self, metrics: list[str] | None = None) -> pd.DataFrame:
        """One row per profiled kernel: profiled_id, kernel_name, step, row, match, and the
        metric columns (all of them unless `metrics` names some)."""
        data = {
            "profiled_id": self.profiled_id,
            "kernel_name": self.kernel_names,
            "step": self.step,
            "row": self.row,
            "match": pd.Categorical.from_codes(
                self.match.astype(np.int16), categories=list(MATCH_NAMES.values())
            ),
        }
        for name in metrics if metrics is not None else list(self.metrics):
            data[name] = self.values(name)
        return pd.DataFrame(data)


def counters_path(run_dir: str, worker: str) -> str:
    return os.path.join(layout.worker_dir(run_dir, worker), KERNEL_COUNTERS_FILE)


def profile_to_proto(p: CounterProfile) -> pb.KernelCounters:
    names = [str(n) for n in p.kernel_names]
    strings = [""] + sorted(set(names))
    ids = {s: i for i, s in enumerate(strings)}
    msg = pb.KernelCounters(
        schema_major=SCHEMA_MAJOR,
        schema_minor=SCHEMA_MINOR,
        worker=layout.check_worker_name(p.worker),
        source=p.source,
        source_format=p.source_format,
        match_method=p.match_method,
        match_note=p.match_note,
        compute_capability=p.compute_capability,
        device_name=p.device_name,
        count=p.count,
    )
    columns.encode(p.profiled_id, "int64", out=msg.profiled_id)
    columns.encode(np.array([ids[n] for n in names], dtype=np.int32), "int32", out=msg.name_id)
    columns.encode(p.step, "int64", out=msg.step)
    columns.encode(p.row, "int32", out=msg.row)
    columns.encode(p.match, "uint8", out=msg.match)
    columns.encode_strings(strings, msg.strings)
    for m in p.metrics.values():
        values = np.asarray(m.values, dtype=np.float64)
        if values.size != p.count:
            raise ValueError(f"metric {m.name!r} has {values.size} values for {p.count} kernels")
        mm = msg.metrics.add(
            name=m.name,
            unit=m.unit,
            source_unit=m.source_unit,
            source=m.source,
            capability=m.capability,
        )
        columns.encode(values, "float64", out=mm.values)
    r = p.report
    msg.report.CopyFrom(
        pb.KernelMatchReport(
            profiled_kernels=r.profiled_kernels,
            run_kernels=r.run_kernels,
            matched=r.matched,
            matched_base_name=r.matched_base_name,
            mismatched=r.mismatched,
            outside=r.outside,
            offset=r.offset,
            tied_offsets=r.tied_offsets,
            first_mismatches=r.first_mismatches,
        )
    )
    return msg


def write_kernel_counters(run_dir: str, profile: CounterProfile) -> str:
    """Write `<run>/plugins/tessera/<worker>/kernel_counters.pb` atomically; returns its path."""
    path = counters_path(run_dir, profile.worker)
    write_bytes_atomic(path, profile_to_proto(profile).SerializeToString())
    return path


def read_kernel_counters(path: str) -> CounterProfile:
    """Read a kernel_counters.pb (in a run directory, a bundle or under a URL: see
    `layout.run_files`); every problem is a TraceFormatError naming the file."""
    msg = pb.KernelCounters()
    try:
        msg.ParseFromString(layout.run_files(path).read_bytes(path))
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read ({exc.strerror or exc})") from None
    except DecodeError as exc:
        raise TraceFormatError(path, f"corrupt kernel counters ({exc})") from None
    if msg.schema_major > SCHEMA_MAJOR:
        raise SchemaVersionError(
            path,
            f"written with schema version {msg.schema_major}.{msg.schema_minor}, newer than "
            f"this reader's {SCHEMA_MAJOR}.x: upgrade tessera-profiler to read it",
        )
    if msg.schema_major == 0:
        raise TraceFormatError(path, "not a Tessera file (no schema version)")
    try:
        return _profile_from_proto(msg, path)
    except ValueError as exc:
        raise TraceFormatError(path, f"corrupt kernel counters ({exc})") from None


def _profile_from_proto(msg: pb.KernelCounters, path: str) -> CounterProfile:
    n = int(msg.count)

    def col(c: pb.Column, what: str) -> np.ndarray:
        arr = columns.decode(c, path=path, what=what)
        if arr.size != n:
            raise ValueError(f"{what} has {arr.size} values for {n} kernels")
        return arr

    strings = np.array(columns.decode_strings(msg.strings), dtype=object)
    name_id = col(msg.name_id, "name_id")
    if name_id.size and (name_id.min() < 0 or name_id.max() >= strings.size):
        raise ValueError("name_id refers outside the string table")
    metrics = {
        m.name: CounterMetric(
            name=m.name,
            unit=m.unit,
            values=col(m.values, f"metric {m.name!r}").astype(np.float64, copy=False),
            source=m.source,
            source_unit=m.source_unit,
            capability=m.capability,
        )
        for m in msg.metrics
    }
    r = msg.report
    return CounterProfile(
        worker=msg.worker,
        source=msg.source,
        source_format=msg.source_format,
        match_method=msg.match_method,
        match_note=msg.match_note,
        compute_capability=msg.compute_capability,
        device_name=msg.device_name,
        profiled_id=col(msg.profiled_id, "profiled_id").astype(np.int64, copy=False),
        kernel_names=strings[name_id] if n else np.array([], dtype=object),
        step=col(msg.step, "step").astype(np.int64, copy=False),
        row=col(msg.row, "row").astype(np.int32, copy=False),
        match=col(msg.match, "match").astype(np.uint8, copy=False),
        metrics=metrics,
        report=MatchReport(
            profiled_kernels=r.profiled_kernels,
            run_kernels=r.run_kernels,
            matched=r.matched,
            matched_base_name=r.matched_base_name,
            mismatched=r.mismatched,
            outside=r.outside,
            offset=r.offset,
            tied_offsets=r.tied_offsets,
            first_mismatches=list(r.first_mismatches),
        ),
    )


def load_kernel_counters(run_dir: str, worker: str) -> CounterProfile | None:
    """The worker's kernel counters, or None when the run has none for it."""
    path = counters_path(run_dir, worker)
    if not layout.run_files(path).isfile(path):
        return None
    return read_kernel_counters(path)
