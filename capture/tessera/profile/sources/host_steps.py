"""Host batches -> step columns, on the background writer (sources/host.py records them).

Regions become kind `region` events (category `region`), marks kind `mark` events (category
`mark`), both on the track of the thread that recorded them (`pid`, native thread id, as
Kineto names host threads, so they share a track with that thread's ops). Regions and marks
have no parent: the host op tree holds only ops, annotations and runtime calls (METRICS.md,
"Steps and nesting"). User counters become `CounterSeries` with source `user`, device -1.
"""

from __future__ import annotations

import numpy as np

from tessera.profile.sources.host import HostBatch
from tessera_tb.trace.step import KIND, CounterSeries, StepData, TrackInfo, empty_events

REGION_CATEGORY = "region"
MARK_CATEGORY = "mark"


def _thread_track(pid: int, tid: int, names: dict[int, str], track_id: int) -> TrackInfo:
    label = names.get(tid, "")
    return TrackInfo(track_id, "host_thread", str(pid), str(tid), -1, -1,
                     f"thread {tid} ({label})" if label else f"thread {tid}", tid)  # fmt: skip


def user_counters(batch: HostBatch) -> list[CounterSeries]:
    """The batch's counter samples as one series per (name, unit), in time order."""
    if not batch.counters:
        return []
    ts = np.array([c[0] for c in batch.counters], dtype=np.int64)
    values = np.array([c[2] for c in batch.counters], dtype=np.float64)
    key_ids: dict[tuple[str, str], int] = {}
    series = np.array([key_ids.setdefault((c[1], c[3]), len(key_ids)) for c in batch.counters])
    order = np.lexsort((ts, series))  # by series, then time
    bounds = np.searchsorted(series[order], np.arange(len(key_ids) + 1))
    return [
        CounterSeries(name, unit, "user", -1, ts[order[lo:hi]], values[order[lo:hi]])
        for (name, unit), lo, hi in zip(key_ids, bounds[:-1], bounds[1:])
    ]


def _batch_rows(batch: HostBatch, intern, track_of_tid: dict[int, int]) -> dict[str, np.ndarray]:
    """Event columns (region rows, then mark rows) of a batch; ids from `intern`."""
    n_r, n_m = len(batch.regions), len(batch.marks)
    ev = empty_events(n_r + n_m)
    ev["parent"][:] = -1
    ev["launch"][:] = -1
    if n_r:
        r_start = np.array([r[0] for r in batch.regions], dtype=np.int64)
        ev["start_ns"][:n_r] = r_start
        ev["dur_ns"][:n_r] = np.array([r[1] for r in batch.regions], dtype=np.int64) - r_start
        ev["name_id"][:n_r] = [intern(r[2]) for r in batch.regions]
        ev["track_id"][:n_r] = [track_of_tid[r[3]] for r in batch.regions]
        ev["kind"][:n_r] = KIND["region"]
        ev["cat_id"][:n_r] = intern(REGION_CATEGORY)
    if n_m:
        ev["start_ns"][n_r:] = [m[0] for m in batch.marks]
        ev["name_id"][n_r:] = [intern(m[1]) for m in batch.marks]
        ev["track_id"][n_r:] = [track_of_tid[m[2]] for m in batch.marks]
        ev["kind"][n_r:] = KIND["mark"]
        ev["cat_id"][n_r:] = intern(MARK_CATEGORY)
    return ev


def _batch_tids(batch: HostBatch) -> list[int]:
    return list(dict.fromkeys([r[3] for r in batch.regions] + [m[2] for m in batch.marks]))


def host_step(batch: HostBatch, pid: int) -> StepData:
    """A step made of host events only (no profiler trace): its span is between step() calls."""
    tids = _batch_tids(batch)
    tracks = [_thread_track(pid, tid, batch.thread_names, i) for i, tid in enumerate(tids)]
    strings = [""]
    ids = {"": 0}

    def intern(s: str) -> int:
        j = ids.get(s)
        if j is None:
            j = ids[s] = len(strings)
            strings.append(s)
        return j

    ev = _batch_rows(batch, intern, {tid: i for i, tid in enumerate(tids)})
    return StepData(
        step=batch.step,
        start_ns=batch.start_ns,
        end_ns=max(batch.end_ns, batch.start_ns),
        strings=strings,
        tracks=tracks,
        events=ev,
        counters=user_counters(batch),
    )


def add_host_tracks(tracks: list[TrackInfo], batches: list[HostBatch], pid: int) -> None:
    """Append to a span's shared track list the host threads the batches need and it lacks."""
    have = {(t.pid, t.tid) for t in tracks}
    for batch in batches:
        for tid in _batch_tids(batch):
            if (str(pid), str(tid)) not in have:
                have.add((str(pid), str(tid)))
                tracks.append(_thread_track(pid, tid, batch.thread_names, len(tracks)))


def merge_host(step: StepData, batch: HostBatch, pid: int) -> None:
    """Add a batch's regions, marks and counters to a step built from a profiler trace.

    The step's tracks must already hold the batch's threads (`add_host_tracks`). Rows are
    appended; the writer puts them in canonical order.
    """
    track_of = {(t.pid, t.tid): t.id for t in step.tracks}
    track_of_tid = {tid: track_of[(str(pid), str(tid))] for tid in _batch_tids(batch)}
    strings = list(step.strings)
    ids = {s: i for i, s in enumerate(strings)}

    def intern(s: str) -> int:
        j = ids.get(s)
        if j is None:
            j = ids[s] = len(strings)
            strings.append(s)
        return j

    rows = _batch_rows(batch, intern, track_of_tid)
    if rows["start_ns"].size:
        step.events = {
            k: np.concatenate([v, rows[k].astype(v.dtype)]) for k, v in step.events.items()
        }
    step.strings = strings
    step.counters = list(step.counters) + user_counters(batch)
    step.__dict__.pop("_strings_array", None)
