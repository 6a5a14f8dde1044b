"""Cross-rank analyses of a whole run as a map and a reduce, and the run's derived index.

The map reads one worker's step files (`collectives.worker_kernels`); the reduce matches
collective instances keyed by (process group, step, ordinal) (`collectives._match_instances`)
and sums per rank and step. `map_workers` runs the map as one Dask task per worker; without a
scheduler the same functions run here, one worker at a time.

The derived index (`RunSummary`) holds a whole run's results: per (worker, step) the step
time and its collective figures (time, waits, transfer, busbw, overlap, straggler counts),
the collective type x size table, the instances, the mismatches and the stragglers. It is
written once into the run as `plugins/tessera/.derived/run_summary.json` (a hidden name:
readers never take it for a worker), so the plugin opens a run of a thousand ranks without
reading its step files. Its `key` is a hash of every worker's meta.pb (the step index, which
changes whenever a step file is written), so an index of other step files is never used: it
is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tessera_tb.backend import collectives
from tessera_tb.trace import layout
from tessera_tb.trace.atomic import write_bytes_atomic
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.reader import Run, WorkerInfo, read_meta

SUMMARY_DIR = ".derived"
SUMMARY_FILE = "run_summary.json"
SUMMARY_VERSION = 1
_MAPS = {"collective_kernels": collectives.worker_kernels}


def _worker_map_task(run_path: str, worker: str, steps: list[int], what: str) -> pd.DataFrame:
    """One map task: the worker's meta.pb and selected step files, nothing else of the run."""
    wdir = layout.worker_dir(run_path, worker)
    meta = read_meta(os.path.join(wdir, layout.META_FILE))
    return worker_map(run_path, worker, meta, steps, what)


def worker_map(run_path: str, worker: str, meta, steps: list[int] | None, what: str):
    """The map `what` of one worker, given its meta.pb (parsed): `steps` None = all."""
    wdir = layout.worker_dir(run_path, worker)
    run = Run(run_path, {worker: WorkerInfo(worker, wdir, meta)})
    chosen = run.worker(worker).steps if steps is None else steps
    return _MAPS[what](run, worker, chosen)


def map_workers(dask, run: Run, workers: list[str], steps: list[int], what: str) -> list:
    """The map `what` ("collective_kernels") over `workers`, one Dask task each on the
    cluster of `dask` (see `dask_cluster.client_for`); results in worker order. The run must
    be at a path (or URL) the Dask workers can read."""
    from tessera_tb.dask_cluster import client_for

    path = run.path if layout.is_url(run.path) else os.path.abspath(run.path)
    with client_for(dask) as client:
        futures = client.map(
            _worker_map_task,
            [path] * len(workers),
            workers,
            [list(steps)] * len(workers),
            [what] * len(workers),
            pure=False,
        )
        return client.gather(futures)


# The derived index ------------------------------------------------------------------------


@dataclass
class RunSummary:
    """A whole run's cross-rank results (see the module doc). Tables:

    rank_step: worker, rank, host, step, step_time_ns (from the step index), event_count,
        then `collectives.collective_rank_step_table`'s n_kernels, collective_ns, wait_ns,
        transfer_ns, busbw_gbps, overlap_pct, and `collectives.straggler_counts` per step:
        n_instances, n_straggler, others_wait_ns.
    type_size, instances, mismatches, stragglers: the `collectives` tables of the whole run.
    """

    key: str
    num_kernels: int
    tables: dict[str, pd.DataFrame]


def run_key(run: Run) -> str:
    """Hash of every worker's name and meta.pb (step index), in name order."""
    h = hashlib.sha256()
    for name in sorted(run.workers):
        h.update(name.encode() + b"\0")
        h.update(run.workers[name].meta.SerializeToString(deterministic=True))
    return h.hexdigest()


def build_run_summary(
    run: Run, dask=None, kernel_frames: list[pd.DataFrame] | None = None
) -> RunSummary:
    """Compute the derived index of a run (every worker, every step): the map over every
    worker's step files (on Dask when `dask` is given; `kernel_frames`: the map's results
    already made, one per worker, as the Dask import's tasks hand them back), then the
    reduce."""
    if kernel_frames is not None:
        a = collectives.reduce_kernels(collectives.concat_kernels(kernel_frames))
    else:
        a = collectives.analyze_collectives(run, dask=dask)
    rows = [
        {
            "worker": w,
            "rank": int(info.rank),
            "host": info.meta.host,
            "step": int(e.step),
            "step_time_ns": int(e.end_ns - e.start_ns),
            "event_count": int(e.event_count),
        }
        for w, info in sorted(run.workers.items())
        for e in info.meta.steps
    ]
    steps = pd.DataFrame(
        rows, columns=["worker", "rank", "host", "step", "step_time_ns", "event_count"]
    )
    coll = collectives.collective_rank_step_table(a)
    counts = collectives.straggler_counts(a, ["worker", "rank", "step"])
    rank_step = steps.merge(coll.drop(columns=["rank"]), on=["worker", "step"], how="left")
    rank_step = rank_step.merge(
        counts.drop(columns=["rank", "wait_ns"]), on=["worker", "step"], how="left"
    )
    for c in ("n_kernels", "collective_ns", "n_instances", "n_straggler", "others_wait_ns"):
        rank_step[c] = rank_step[c].fillna(0).astype("int64")
    for c in ("wait_ns", "transfer_ns"):
        rank_step[c] = rank_step[c].astype("Int64")
    rank_step = rank_step.sort_values(["rank", "worker", "step"], ignore_index=True)
    return RunSummary(
        key=run_key(run),
        num_kernels=len(a.kernels),
        tables={
            "rank_step": rank_step,
            "type_size": collectives.collective_type_size_table(a),
            "instances": a.instances,
            "mismatches": a.mismatches,
            "stragglers": collectives.stragglers(None, analysis=a),
        },
    )


def summary_path(run_path: str) -> str:
    return os.path.join(layout.plugin_dir(run_path), SUMMARY_DIR, SUMMARY_FILE)


def _encode_table(df: pd.DataFrame) -> dict:
    cols = []
    for c in df.columns:
        s = df[c]
        values = s.astype(object).where(s.notna(), None).tolist()
        values = [v.item() if isinstance(v, np.generic) else v for v in values]
        if s.dtype.kind == "f":
            values = [None if v is None or not np.isfinite(v) else float(v) for v in values]
        cols.append({"name": str(c), "dtype": str(s.dtype), "values": values})
    return {"columns": cols}


def _decode_table(t: dict) -> pd.DataFrame:
    data = {}
    for c in t["columns"]:
        dtype = c["dtype"]
        values = c["values"]
        if dtype == "float64":
            data[c["name"]] = pd.Series([np.nan if v is None else v for v in values], dtype=dtype)
        else:
            data[c["name"]] = pd.Series(values, dtype=dtype)
    return pd.DataFrame(data)


def encode_summary(summary: RunSummary) -> bytes:
    return json.dumps(
        {
            "version": SUMMARY_VERSION,
            "key": summary.key,
            "num_kernels": summary.num_kernels,
            "tables": {k: _encode_table(v) for k, v in summary.tables.items()},
        },
        separators=(",", ":"),
        allow_nan=False,
    ).encode()


def read_run_summary(run: Run) -> RunSummary | None:
    """The run's derived index when it is there, readable and of these step files; else
    None (absent, stale, unreadable or of another version: the caller rebuilds it)."""
    files = layout.run_files(run.path)
    path = summary_path(run.path)
    try:
        raw = json.loads(files.read_bytes(path))
    except (OSError, KeyError, ValueError, TraceFormatError):  # absent, unreadable, not JSON
        return None
    if not isinstance(raw, dict) or raw.get("version") != SUMMARY_VERSION:
        return None
    if raw.get("key") != run_key(run):
        return None
    try:
        tables = {k: _decode_table(v) for k, v in raw["tables"].items()}
    except (KeyError, TypeError, ValueError):
        return None
    return RunSummary(raw["key"], int(raw.get("num_kernels", 0)), tables)


def write_run_summary(run: Run, summary: RunSummary) -> bool:
    """Write the derived index into the run (atomically; one PUT under a URL). False when
    the run cannot be written (a read-only logdir, a bundle): the index is then kept only by
    the caller."""
    data = encode_summary(summary)
    path = summary_path(run.path)
    try:
        if layout.is_url(run.path):
            from tessera_tb.trace import remote

            remote.files_for(run.path).put_bytes(path, data)
        elif layout.run_files(run.path) is layout.LOCAL_FILES:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_bytes_atomic(path, data)
        else:
            return False
    except (OSError, TraceFormatError):  # read-only storage: the caller keeps it in memory
        return False
    return True


def ensure_run_summary(run: Run, dask=None, write: bool = True) -> RunSummary:
    """The run's derived index: read when current, else built (on Dask when `dask` is
    given) and, with `write`, written into the run."""
    found = read_run_summary(run)
    if found is not None:
        return found
    summary = build_run_summary(run, dask=dask)
    if write:
        write_run_summary(run, summary)
    return summary
