"""Open runs and load steps into columnar form (docs/FORMAT.md).

Opening a run reads each worker's meta.pb only; step files load on demand. A run is a
directory, a bundle (`exp1.tessera.zip`, read in place) or an fsspec URL; every file is read
through `layout.run_files`, so the same code reads all three.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import columns, layout
from tessera_tb.trace.errors import SchemaVersionError, TraceFormatError
from tessera_tb.trace.schema_version import SCHEMA_MAJOR
from tessera_tb.trace.step import (
    ATTR_TYPE_NAMES,
    EVENT_COLUMNS,
    FLOW_COLUMNS,
    KIND,
    Attr,
    Capability,
    CounterSeries,
    StepData,
    TrackInfo,
)

_TRACK_KIND_NAMES = {pb.HOST_THREAD: "host_thread", pb.DEVICE_STREAM: "device_stream"}


def _check_version(path: str, major: int, minor: int) -> None:
    if major > SCHEMA_MAJOR:
        raise SchemaVersionError(
            path,
            f"written with schema version {major}.{minor}, newer than this reader's "
            f"{SCHEMA_MAJOR}.x: upgrade tessera-profiler to read it",
        )
    if major == 0:
        raise TraceFormatError(path, "not a Tessera file (no schema version)")


def _read(path: str) -> bytes:
    files = layout.run_files(path)
    try:
        return files.read_bytes(path)
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read ({exc.strerror or exc})") from None


def read_meta(path: str) -> pb.WorkerMeta:
    meta = pb.WorkerMeta()
    try:
        meta.ParseFromString(_read(path))
    except DecodeError as exc:
        raise TraceFormatError(path, f"corrupt worker metadata ({exc})") from None
    _check_version(path, meta.schema_major, meta.schema_minor)
    return meta


def read_step_file(path: str) -> StepData:
    """Load one step file into a StepData (epoch-ns times, numpy columns)."""
    msg = pb.Step()
    try:
        msg.ParseFromString(_read(path))
    except DecodeError as exc:
        raise TraceFormatError(path, f"corrupt step file ({exc})") from None
    _check_version(path, msg.schema_major, msg.schema_minor)
    try:
        return _step_from_proto(msg, path)
    except ValueError as exc:
        raise TraceFormatError(path, f"corrupt step file ({exc})") from None


def _step_from_proto(msg: pb.Step, path: str) -> StepData:
    base = msg.base_ns
    n = int(msg.events.count)
    events = {}
    for name in EVENT_COLUMNS:
        arr = columns.decode(getattr(msg.events, name), path=path, what=f"events.{name}")
        if arr.size != n:
            raise ValueError(f"events.{name} has {arr.size} values for {n} events")
        events[name] = arr
    events["start_ns"] = events["start_ns"] + base
    rows = np.arange(n, dtype=np.int64)
    for ref in ("parent", "launch"):
        rel = events[ref].astype(np.int64)
        target = np.where(rel != 0, rows - rel, -1)
        _check_ids(target[target != -1], n, f"events.{ref}")
        events[ref] = target.astype(np.int32)
    strings = columns.decode_strings(msg.strings)
    n_strings, n_tracks = len(strings), len(msg.tracks)
    for position, t in enumerate(msg.tracks):
        if t.id != position:
            raise ValueError(f"track {position} has id {t.id}")
    for name, limit in (("name_id", n_strings), ("cat_id", n_strings), ("track_id", n_tracks)):
        _check_ids(events[name], limit, f"events.{name}")
    _check_ids(events["kind"], len(KIND), "events.kind")
    attrs = []
    for a in msg.attrs:
        rows = columns.decode(a.rows, path=path, what=f"attr {a.key!r} rows")
        values = columns.decode(a.values, path=path, what=f"attr {a.key!r} values")
        kind = ATTR_TYPE_NAMES.get(a.type)
        if kind is None or rows.size != values.size:
            raise ValueError(f"attr {a.key!r} has an unknown type or mismatched lengths")
        _check_ids(rows, n, f"attr {a.key!r} rows")
        if rows.size > 1 and (np.diff(rows) <= 0).any():
            raise ValueError(f"attr {a.key!r} rows are not ascending")
        if kind in ("string", "json"):
            _check_ids(values, n_strings, f"attr {a.key!r} values")
        attrs.append(Attr(a.key, kind, rows, values))
    flows = {}
    if msg.HasField("flows"):
        for name in FLOW_COLUMNS:
            flows[name] = columns.decode(getattr(msg.flows, name), path=path, what=f"flows.{name}")
            if flows[name].size != msg.flows.count:
                raise ValueError(
                    f"flows.{name} has {flows[name].size} values for {msg.flows.count}"
                )
        _check_ids(flows["track_id"], n_tracks, "flows.track_id")
        _check_ids(flows["cat_id"], n_strings, "flows.cat_id")
        frow = flows["row"]
        _check_ids(frow[frow != -1], n, "flows.row")
        bound = frow >= 0
        anchor = np.where(bound, events["start_ns"][np.maximum(frow, 0)] if n else 0, base)
        flows["ts_ns"] = flows["ts_ns"] + anchor
    counters = []
    for c in msg.counters:
        ts = columns.decode(c.ts_ns, path=path, what=f"counter {c.name}") + base
        values = columns.decode(c.values, path=path, what=f"counter {c.name}")
        if ts.size != values.size:
            raise ValueError(f"counter {c.name!r} has {ts.size} times for {values.size} values")
        counters.append(CounterSeries(c.name, c.unit, c.source, c.device, ts, values))
    tracks = [
        TrackInfo(
            id=t.id,
            kind=_TRACK_KIND_NAMES.get(t.kind, "track_other"),
            pid=t.pid,
            tid=t.tid,
            device=t.device,
            stream=t.stream,
            name=t.name,
            sort_index=t.sort_index,
        )
        for t in msg.tracks
    ]
    return StepData(
        step=msg.step,
        start_ns=msg.start_ns + base,
        end_ns=msg.end_ns + base,
        strings=strings,
        tracks=tracks,
        events=events,
        attrs=attrs,
        flows=flows,
        counters=counters,
        capabilities=[Capability(c.name, c.status, c.reason) for c in msg.capabilities],
        span_index=msg.span_index,
    )


def _check_ids(ids: np.ndarray, limit: int, what: str) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        raise ValueError(f"{what} refers outside its table (0..{limit - 1})")


@dataclass
class WorkerInfo:
    """A worker (one process, usually one rank) of a run: its metadata and step index."""

    name: str
    directory: str
    meta: pb.WorkerMeta

    @property
    def rank(self) -> int:
        return self.meta.rank

    @property
    def steps(self) -> list[int]:
        return [e.step for e in self.meta.steps]

    def step_path(self, step: int) -> str:
        for e in self.meta.steps:
            if e.step == step:
                return os.path.join(self.directory, layout.step_file_name(e.step))
        raise KeyError(f"worker {self.name} has no step {step}")


class Run:
    """A run directory: workers and their steps. Steps are read only when asked for."""

    def __init__(self, path: str, workers: dict[str, WorkerInfo]):
        self.path = path
        self.workers = workers

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    @property
    def steps(self) -> list[int]:
        """Every step number that any worker has, ascending."""
        return sorted({s for w in self.workers.values() for s in w.steps})

    def worker(self, name: str) -> WorkerInfo:
        try:
            return self.workers[name]
        except KeyError:
            raise KeyError(f"run {self.path} has no worker {name!r}") from None

    def load_step(self, worker: str, step: int) -> StepData:
        return read_step_file(self.worker(worker).step_path(step))

    def iter_steps(
        self, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
    ) -> Iterator[tuple[str, StepData]]:
        """Yield (worker, step) for the chosen workers and steps, loading one file at a time."""
        wanted = set(steps) if steps is not None else None
        for name in workers if workers is not None else sorted(self.workers):
            w = self.worker(name)
            for s in w.steps:
                if wanted is None or s in wanted:
                    yield name, read_step_file(w.step_path(s))


def open_run(path: str) -> Run:
    """Open a run: a directory, a bundle (`*.tessera.zip`) or an fsspec URL (`s3://...`).
    Reads each worker's meta.pb, no step file."""
    files = layout.run_files(path)
    pdir = layout.plugin_dir(path)
    if not files.isdir(pdir):
        raise TraceFormatError(path, "not a Tessera run (no plugins/tessera directory)")
    workers = {}
    for name in sorted(files.listdir(pdir)):
        wdir = os.path.join(pdir, name)
        meta_path = os.path.join(wdir, layout.META_FILE)
        if name.startswith(".") or not files.isfile(meta_path):
            continue
        workers[name] = WorkerInfo(name=name, directory=wdir, meta=read_meta(meta_path))
    if not workers:
        raise TraceFormatError(path, "run has no workers (no plugins/tessera/<worker>/meta.pb)")
    return Run(path, workers)
