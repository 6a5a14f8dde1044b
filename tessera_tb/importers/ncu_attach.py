"""Attach Nsight Compute counters to a run's kernels (`tessera-prof import-ncu`).

Nsight Compute profiles a separate process (`--launch-skip S --launch-count N` of the same
training loop), so there is no correlation id to join on. Kernels are matched by name and
launch order: both sequences are reduced to spelling-independent keys
(`kernel_names.kernel_name_key`), and the profiled sequence is slid along the worker's kernels
(every step, in launch order) to the offset where the most names agree. Each profiled kernel
at that offset whose key equals the run kernel's is matched (whose base identifier alone
agrees: matched by base name); the others are reported. Where both sources record the launch
configuration (grid and block), it must agree too, so that e.g. a one-block fill kernel is
not taken for the same kernel filling a whole tensor. With fewer than half of the profiled
kernels matched, or with `counter_only`, the counters are stored unattached (counter-only).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tessera_tb.importers.kernel_names import kernel_base_name, kernel_name_key
from tessera_tb.importers.ncu_csv import counter_profile, read_ncu_csv
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import layout
from tessera_tb.trace.atomic import write_bytes_atomic
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.kernel_counters import (
    MATCH_BASE_NAME,
    MATCH_NAME,
    MATCH_NONE,
    METHOD_COUNTER_ONLY,
    METHOD_NAME_ORDER,
    METHOD_NVTX_STEP,
    CounterProfile,
    MatchReport,
    counters_path,
    write_kernel_counters,
)
from tessera_tb.trace.reader import Run, open_run
from tessera_tb.trace.step import KIND

MATCH_NOTE = "matched by kernel name and launch order from a separate process"
# Device work that Nsight Compute profiles as kernels (NCCL kernels are "collective" here).
_KERNEL_KINDS = np.array([KIND["kernel"], KIND["collective"]], dtype=np.uint8)
_MAX_PAIRS = 4_000_000  # bound on one outer product while counting diagonal agreements
_FIRST_MISMATCHES = 5


@dataclass
class RunKernels:
    """A worker's kernels over all its steps in launch order."""

    step: np.ndarray  # int64 step number
    row: np.ndarray  # int32 event row in that step file
    names: np.ndarray  # object
    launch_config: np.ndarray  # object: "grid x,y,z block x,y,z", None where not recorded


def run_kernel_sequence(run: Run, worker: str) -> RunKernels:
    """Kernels (and collective kernels) of every step, ordered by their launching call's start
    (the kernel's own start where it has no launching call), then by kernel start."""
    steps, rows, names, configs = [], [], [], []
    for step_num in run.worker(worker).steps:
        st = run.load_step(worker, step_num)
        ev = st.events
        sel = np.flatnonzero(np.isin(ev["kind"], _KERNEL_KINDS))
        launch = ev["launch"][sel]
        start = ev["start_ns"][sel]
        launched_at = np.where(launch >= 0, ev["start_ns"][np.maximum(launch, 0)], start)
        sel = sel[np.lexsort((start, launched_at))]
        steps.append(np.full(sel.size, step_num, dtype=np.int64))
        rows.append(sel.astype(np.int32))
        names.append(st.string_values(ev["name_id"][sel]))
        configs.append(
            launch_config(
                st.attr("grid").reindex(sel).to_numpy(object),
                st.attr("block").reindex(sel).to_numpy(object),
            )
        )
    if not steps:
        empty = np.zeros(0, object)
        return RunKernels(np.zeros(0, np.int64), np.zeros(0, np.int32), empty, empty)
    return RunKernels(
        np.concatenate(steps),
        np.concatenate(rows),
        np.concatenate(names),
        np.concatenate(configs),
    )


def _dims(value: object) -> str | None:
    """ "[256,1,1]" (Kineto) or "(256, 1, 1)" (ncu) -> "256,1,1"; None when not recorded."""
    if not isinstance(value, str):
        return None
    digits = value.strip("[]() ").replace(" ", "")
    return digits or None


def launch_config(grid: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Comparable launch configurations ("grid 8192,1,1 block 128,1,1"), None when unknown."""
    out = np.empty(len(grid), dtype=object)
    for i, (g, b) in enumerate(zip(grid, block)):  # one string per kernel, no arithmetic
        g, b = _dims(g), _dims(b)
        out[i] = f"grid {g} block {b}" if g and b else None
    return out


@dataclass
class Alignment:
    """Where the profiled sequence sits in the run's (see the module docstring)."""

    offset: int  # run index of profiled kernel 0
    run_index: np.ndarray  # int64 per profiled kernel, -1 where it falls outside the run
    match: np.ndarray  # uint8 MATCH_* per profiled kernel
    tied_offsets: int
    accepted: bool

    @property
    def matched(self) -> int:
        return int((self.match != MATCH_NONE).sum())


def _diagonal_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """counts[o + len(a) - 1] = #{i : a[i] == b[i + o]} for every offset o, without a loop
    over positions (one vectorised outer product per shared key)."""
    m, n = a.size, b.size
    counts = np.zeros(m + n - 1, dtype=np.int64)
    order_b = np.argsort(b, kind="stable")
    keys_b, starts_b = np.unique(b[order_b], return_index=True)
    ends_b = np.append(starts_b[1:], b.size)
    order_a = np.argsort(a, kind="stable")
    keys_a, starts_a = np.unique(a[order_a], return_index=True)
    ends_a = np.append(starts_a[1:], a.size)
    common, ia, ib = np.intersect1d(keys_a, keys_b, return_indices=True)
    for ka, kb in zip(ia, ib):
        pa = order_a[starts_a[ka] : ends_a[ka]]
        pb_ = order_b[starts_b[kb] : ends_b[kb]]
        chunk = max(1, _MAX_PAIRS // max(pb_.size, 1))
        for lo in range(0, pa.size, chunk):
            diffs = pb_[None, :] - pa[lo : lo + chunk, None] + (m - 1)
            counts += np.bincount(diffs.ravel(), minlength=counts.size)
    return counts


def align_kernels(
    profiled_names: np.ndarray,
    run_names: np.ndarray,
    profiled_config: np.ndarray | None = None,
    run_config: np.ndarray | None = None,
) -> Alignment:
    """Best offset of the profiled names along the run's: a name match scores 2, a base-name
    match 1; ties go to the earliest offset (the count of other best offsets is reported).

    Launch configurations, when given for every kernel on both sides, are part of both keys.
    """
    m, n = len(profiled_names), len(run_names)
    if m == 0 or n == 0:
        return Alignment(0, np.full(m, -1, np.int64), np.zeros(m, np.uint8), 0, False)
    names = list(profiled_names) + list(run_names)
    suffix = [""] * (m + n)
    if (
        profiled_config is not None
        and run_config is not None
        and all(c is not None for c in profiled_config)
        and all(c is not None for c in run_config)
    ):
        suffix = [" | " + c for c in list(profiled_config) + list(run_config)]
    keys = pd.factorize(np.array([kernel_name_key(s) + x for s, x in zip(names, suffix)]))[0]
    bases = pd.factorize(np.array([kernel_base_name(s) + x for s, x in zip(names, suffix)]))[0]
    full = _diagonal_counts(keys[:m], keys[m:])
    base = _diagonal_counts(bases[:m], bases[m:])
    score = full + base  # a full match also matches its base name
    best = int(score.max())
    ties = np.flatnonzero(score == best)
    offset = int(ties[0]) - (m - 1)
    idx = np.arange(m, dtype=np.int64) + offset
    inside = (idx >= 0) & (idx < n)
    match = np.zeros(m, dtype=np.uint8)
    j = idx[inside]
    same_base = bases[:m][inside] == bases[m:][j]
    same_key = keys[:m][inside] == keys[m:][j]
    match[inside] = np.where(same_key, MATCH_NAME, np.where(same_base, MATCH_BASE_NAME, 0))
    run_index = np.where(inside, idx, -1)
    accepted = best > 0 and int((match != MATCH_NONE).sum()) >= max(1, math.ceil(m / 2))
    return Alignment(offset, run_index, match, int(ties.size - 1), accepted)


def _short(name: str, width: int = 60) -> str:
    name = str(name)
    return name if len(name) <= width else name[: width - 3] + "..."


def attach(
    profile: CounterProfile, run_kernels: RunKernels, profiled_config: np.ndarray | None = None
) -> CounterProfile:
    """Fill the profile's step/row/match and report from the best alignment (in place)."""
    al = align_kernels(
        profile.kernel_names, run_kernels.names, profiled_config, run_kernels.launch_config
    )
    m = profile.count
    mismatched = (al.run_index >= 0) & (al.match == MATCH_NONE)
    outside = al.run_index < 0
    first = []
    for i in np.flatnonzero(mismatched | outside)[:_FIRST_MISMATCHES]:
        what = f"profiled #{profile.profiled_id[i]} {_short(profile.kernel_names[i])}"
        j = al.run_index[i]
        if j < 0:
            first.append(f"{what}: outside the run's kernels")
        else:
            first.append(
                f"{what} vs step {run_kernels.step[j]} row {run_kernels.row[j]} "
                f"{_short(run_kernels.names[j])}"
            )
    profile.report = MatchReport(
        profiled_kernels=m,
        run_kernels=int(run_kernels.names.size),
        matched=int((al.match == MATCH_NAME).sum()),
        matched_base_name=int((al.match == MATCH_BASE_NAME).sum()),
        mismatched=int(mismatched.sum()),
        outside=int(outside.sum()),
        offset=al.offset,
        tied_offsets=al.tied_offsets,
        first_mismatches=first,
    )
    if not al.accepted:
        profile.match_method = METHOD_COUNTER_ONLY
        profile.match_note = (
            f"counter-only: no alignment with the run's kernels matched at least half of the "
            f"{m} profiled kernels by name (best: {al.matched})"
        )
        return profile
    hit = al.match != MATCH_NONE
    j = al.run_index[hit]
    profile.step[hit] = run_kernels.step[j]
    profile.row[hit] = run_kernels.row[j]
    profile.match[:] = al.match
    profile.match_method = METHOD_NAME_ORDER
    profile.match_note = MATCH_NOTE
    return profile


@dataclass
class ImportNcuResult:
    path: str
    worker: str
    profile: CounterProfile
    notes: list[str] = field(default_factory=list)


def _choose_worker(run: Run, worker: str | None) -> str:
    if worker is not None:
        if worker not in run.workers:
            raise ValueError(
                f"run {run.path} has no worker {worker!r}; it has {', '.join(sorted(run.workers))}"
            )
        return worker
    if len(run.workers) > 1:
        raise ValueError(
            f"run {run.path} has workers {', '.join(sorted(run.workers))}: name the one the "
            "counters belong to with --worker"
        )
    return next(iter(run.workers))


def _set_capability(meta: pb.WorkerMeta, name: str, status: str, reason: str) -> None:
    kept = [c for c in meta.capabilities if c.name != name]
    del meta.capabilities[:]
    meta.capabilities.extend(kept)
    meta.capabilities.add(name=name, status=status, reason=reason)


def import_ncu(
    csv_path: str,
    run_dir: str,
    *,
    worker: str | None = None,
    counter_only: bool = False,
    overwrite: bool = False,
    ncu: str | None = None,
) -> ImportNcuResult:
    """Read a raw-page CSV (or a `.ncu-rep`, through `ncu --import` when ncu is found), match
    it with a worker's kernels and store it in the run.

    Rows inside the session's NVTX step ranges (`tessera_step_N`, as `tessera-prof counters`
    records them) are joined by step (ncu_step_join.py); other reports by name and launch
    order. Writes `<run>/plugins/tessera/<worker>/kernel_counters.pb` and records the match in
    the worker's capabilities (`ncu_counters`, `ncu_kernel_match`), each file atomically.
    Raises TraceFormatError (bad CSV or run) or ValueError (bad arguments); then nothing is
    written.
    """
    run = open_run(run_dir)
    worker = _choose_worker(run, worker)
    dest = counters_path(run_dir, worker)
    if os.path.exists(dest) and not overwrite:
        raise ValueError(f"{dest} exists: use --overwrite to replace it")
    if csv_path.endswith(".ncu-rep"):
        table = _read_report(csv_path, ncu)
    else:
        table = read_ncu_csv(csv_path)
    from tessera_tb.importers.ncu_step_join import join_steps, nvtx_steps

    if not counter_only and (nvtx_steps(table) >= 0).any():
        profile, _ = join_steps(table, run_kernel_sequence(run, worker), worker=worker)
    else:
        profile = counter_profile(table, worker)
        if not counter_only:
            config = None
            if "Grid Size" in table.text and "Block Size" in table.text:
                config = launch_config(table.text["Grid Size"], table.text["Block Size"])
            attach(profile, run_kernel_sequence(run, worker), config)
    path = store_counters(run_dir, run, profile)
    return ImportNcuResult(path=path, worker=worker, profile=profile, notes=list(table.notes))


def _read_report(report: str, ncu: str | None):
    """A `.ncu-rep` read through `ncu --import ... --csv --page raw` into a temporary CSV."""
    import tempfile

    from tessera_tb.importers.ncu_runner import NcuError, export_raw_csv, find_ncu

    if not os.path.isfile(report):
        raise TraceFormatError(report, "no such file")
    try:
        exe = find_ncu(ncu)
    except NcuError as exc:
        raise ValueError(
            f"{report}: reading a .ncu-rep needs ncu ({exc}); or export the CSV where ncu is: "
            f"ncu --import {report} --csv --page raw > REPORT.csv"
        ) from None
    with tempfile.TemporaryDirectory(prefix="tessera-ncu-") as tmp:
        csv_path = os.path.join(tmp, os.path.basename(report)[: -len(".ncu-rep")] + ".csv")
        try:
            export_raw_csv(exe, report, csv_path)
        except NcuError as exc:
            raise TraceFormatError(report, str(exc)) from None
        table = read_ncu_csv(csv_path)
    table.path = report
    return table


def store_counters(run_dir: str, run: Run, profile: CounterProfile) -> str:
    """Write the worker's kernel_counters.pb and its capabilities in meta.pb (both atomically;
    a failure writing meta.pb removes a counters file that did not exist before)."""
    worker = profile.worker
    dest = counters_path(run_dir, worker)
    existed = os.path.exists(dest)
    meta = pb.WorkerMeta()
    meta.CopyFrom(run.worker(worker).meta)
    r, n = profile.report, profile.count
    _set_capability(
        meta,
        "ncu_counters",
        "ok",
        f"Nsight Compute {profile.source}: {r.profiled_kernels or n} profiled kernels",
    )
    if profile.match_method == METHOD_NAME_ORDER:
        _set_capability(
            meta,
            "ncu_kernel_match",
            "ok",
            f"{MATCH_NOTE}: {r.matched + r.matched_base_name} of {n} profiled kernels",
        )
    elif profile.match_method == METHOD_NVTX_STEP:
        _set_capability(meta, "ncu_kernel_match", "ok", profile.match_note)
    else:
        _set_capability(meta, "ncu_kernel_match", "unavailable", profile.match_note)
    path = write_kernel_counters(run_dir, profile)
    try:
        write_bytes_atomic(
            os.path.join(layout.worker_dir(run_dir, worker), layout.META_FILE),
            meta.SerializeToString(deterministic=True),
        )
    except BaseException:
        if not existed:
            os.unlink(path)
        raise
    return path
