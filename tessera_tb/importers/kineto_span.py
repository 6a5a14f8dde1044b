"""Turn one decoded Kineto trace file (a span) into StepData, one per profiled step.

Definitions (docs/METRICS.md, "Steps and nesting" and "Time"):
- steps come from `ProfilerStep#N` events of category user_annotation (Operator before 2022);
  a trace without them is one step covering the whole trace;
- steps tile the timeline: start_N = max(host start_N, end_{N-1}); end_N = the later of the
  host end and the end of the last device work launched inside the step;
- a device event belongs to the step of its launching runtime call (same `correlation`);
  other events belong to the step in which they start (events before the first step go to
  the first, events after the last to the last, so nothing is dropped);
- the host op tree (parent column) is built per thread from cpu_op, user_annotation,
  cuda_runtime and cuda_driver; python_function events form their own tree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from tessera_tb.importers.arrays import distinct
from tessera_tb.importers.background import Background, release_freed_memory
from tessera_tb.importers.kineto_columns import StringTable, Tracks, canonical_rows, span_columns
from tessera_tb.importers.kineto_decode import RawTrace, _kineto_scan
from tessera_tb.importers.kineto_scanned import scanned_span_columns
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.step import (
    DEVICE_KINDS,
    IS_DEVICE_WORK,
    IS_HOST_TREE,
    IS_LAUNCH,
    KIND,
    Attr,
    StepData,
    TrackInfo,
    kind_mask,
)

_STEP_NAME = re.compile(r"^ProfilerStep#(-?\d+)$")
_DIGITS = re.compile(r"-?\d+")
_STEP_CATS = {"user_annotation", "operator"}

# Source category (lower-cased) -> EventKind name.
_CAT_KIND = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "python_function": "python",
    "user_annotation": "annotation",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "driver",
    "driver": "driver",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_sync": "sync",
    "cuda_profiler_range": "profiler_range",
    "trace": "trace_span",
    "overhead": "overhead",
    "cpu_instant_event": "mark",
}
# Events that put their track on a device (range-profiler events sit on a device track too).
_IS_DEVICE_TRACK = kind_mask(np.append(DEVICE_KINDS, np.uint8(KIND["profiler_range"])))
_COLLECTIVE_PREFIXES = ("nccl", "rccl")


@dataclass
class SpanResult:
    steps: list[StepData]
    tracks: list[TrackInfo]
    event_count: int
    base_ns: int
    warnings: list[str] = field(default_factory=list)


@dataclass
class SpanStream:
    """A span whose steps are made one at a time, in step order, as `steps` is iterated:
    only the span's columns and the step in hand are held, never every step's copy."""

    steps: Iterator[StepData]
    step_count: int
    tracks: list[TrackInfo]
    event_count: int
    base_ns: int
    warnings: list[str] = field(default_factory=list)


def build_span(trace: RawTrace, strings: StringTable, span_index: int, base_ns: int) -> SpanResult:
    """Convert a decoded trace into StepData, one per step (in step order)."""
    span = stream_span(trace, strings, span_index, base_ns)
    return SpanResult(list(span.steps), span.tracks, span.event_count, span.base_ns, span.warnings)


def stream_span(trace: RawTrace, strings: StringTable, span_index: int, base_ns: int) -> SpanStream:
    """The steps of a decoded trace, made lazily (see SpanStream); the same StepData as
    build_span. The trace's scanner columns are released as they are converted."""
    if trace.scan is not None:  # the C scanner read the events
        cols = scanned_span_columns(trace.release_scan(), trace.path, strings, base_ns)
    else:
        cols = span_columns(trace, strings, base_ns)
    return span_of_columns(cols, trace.path, strings, span_index, base_ns)


@dataclass
class StepPlan:
    """The steps of a part of a trace file, decided on the whole file (`kineto_stream`):
    their numbers and spans, the step (an index into them) of each slice and of each flow
    point of the part, and the file's tracks."""

    step_numbers: np.ndarray
    span_start: np.ndarray
    span_end: np.ndarray
    step_of: np.ndarray
    flow_step: np.ndarray
    tracks: list[TrackInfo]
    unbound_flows: list[int] = field(default_factory=lambda: [0, 0])  # (unbound, all), summed


def span_of_columns(
    cols, path: str, strings: StringTable, span_index: int, base_ns: int, plan=None
) -> SpanStream:
    """The steps of a span's columns (see stream_span); with a StepPlan, of a part of a file
    whose steps were decided on the whole file."""
    warnings: list[str] = []
    if cols.skipped_phases:
        warnings.append(
            f"{path}: events of phase(s) {cols.skipped_phases} are not part of the Kineto "
            "format; skipped"
        )
    n = cols.count
    start_ns, dur_ns, is_x = cols.start_ns, cols.dur_ns, cols.is_x
    name_id, cat_id, track_id = cols.name_id, cols.cat_id, cols.track_id
    correlation, external_id, attrs = cols.correlation, cols.external_id, cols.attrs
    tracks = cols.tracks

    # Kinds, by category, then refined by name.
    kind_of_string = np.zeros(len(strings.strings), dtype=np.uint8)
    for cid in np.flatnonzero(np.bincount(cat_id, minlength=len(strings.strings))).tolist():
        kind_of_string[cid] = KIND[_CAT_KIND.get(strings.strings[cid].lower(), "other")]
    kind = kind_of_string[cat_id]
    memory_id = strings.ids.get("[memory]")
    if memory_id is not None:
        kind[(name_id == memory_id) & ~is_x] = KIND["memory"]
    kind[(~is_x) & (kind == KIND["other"])] = KIND["mark"]

    coll_rows = next((a.rows for a in attrs if a.key == "Collective name"), None)
    kernel = kind == KIND["kernel"]
    if coll_rows is not None:
        kind[coll_rows[kernel[coll_rows]]] = KIND["collective"]
    collective_name = np.zeros(len(strings.strings), dtype=bool)
    for nid in distinct(name_id[kernel]).tolist():
        collective_name[nid] = strings.strings[nid].startswith(_COLLECTIVE_PREFIXES)
    kind[kernel & collective_name[name_id]] = KIND["collective"]

    # The host trees are built beside the launch links, the tracks and the step markers (in
    # a second thread on a large span; none of them changes what the other reads).
    trees = Background(
        _ordered_trees, start_ns, dur_ns, kind, track_id, external_id, cols.order_job
    )
    trees.run_or_start(n)
    try:
        if plan is None:
            track_infos = _track_infos(tracks, kind, track_id, attrs, cols.meta_events)
        else:
            track_infos = plan.tracks
        launch = _launch_links(kind, correlation)
        step_rows = _step_marker_rows(name_id, cat_id, strings, is_x)
    except BaseException:
        trees.join()
        raise
    row_order, parent = trees.result()

    # Steps.
    # Before 2022 step markers were "Operator" events like any op: they are annotations.
    kind[[r for _, r in step_rows]] = KIND["annotation"]
    if plan is not None:
        return _planned_span(
            plan,
            cols=cols,
            path=path,
            strings=strings,
            span_index=span_index,
            base_ns=base_ns,
            kind=kind,
            parent=parent,
            launch=launch,
            order=row_order,
            warnings=warnings,
        )
    # Flow points are bound to their slices beside the steps' spans (as the trees above).
    bind = Background(_bind_flows, cols.flows, start_ns, dur_ns, track_id, parent, path, row_order)
    bind.run_or_start(n)
    try:
        step_numbers, host_start, step_of, span_start, span_end = _step_spans(
            step_rows, start_ns, dur_ns, kind, launch, path, span_index, base_ns
        )
        n_steps = step_numbers.size
        # The rows are put in step order beside the flow binding too.
        step_order = _step_order(n_steps, step_of, row_order)
    except BaseException:
        bind.join()
        raise
    flows, flow_warn = bind.result()
    if flow_warn:
        warnings.append(flow_warn)
    if flows["flow_id"].size:
        frow = flows["row"]
        flow_step = np.where(
            frow >= 0,
            step_of[np.maximum(frow, 0)],
            np.clip(np.searchsorted(host_start, flows["ts_ns"], side="right") - 1, 0, n_steps - 1),
        )
    else:
        flow_step = np.zeros(0, dtype=np.int64)
    # New tracks may have come from flow points; describe them too.
    if len(tracks.keys) > len(track_infos):
        track_infos = _track_infos(tracks, kind, track_id, attrs, cols.meta_events)

    del cols  # its arrays live on in the columns below, as long as the steps need them
    steps = _split_steps(
        n_steps=n_steps,
        step_numbers=step_numbers,
        span_start=span_start,
        span_end=span_end,
        step_of=step_of,
        step_order=step_order,
        columns={
            "start_ns": start_ns,
            "dur_ns": dur_ns,
            "name_id": name_id,
            "track_id": track_id,
            "kind": kind,
            "cat_id": cat_id,
            "correlation": correlation,
            "external_id": external_id,
            "parent": parent,
            "launch": launch,
        },
        attrs=attrs,
        flows=flows,
        flow_step=flow_step,
        strings=strings,
        tracks=track_infos,
        span_index=span_index,
    )
    return SpanStream(
        steps=steps,
        step_count=int(n_steps),
        tracks=track_infos,
        event_count=n,
        base_ns=base_ns,
        warnings=warnings,
    )


def _step_spans(step_rows, start_ns, dur_ns, kind, launch, path, span_index, base_ns) -> tuple:
    """(step numbers, host starts, each row's step, span starts, span ends) of the steps
    that the ProfilerStep rows `step_rows` mark, or of one step numbered `span_index`."""
    n = start_ns.size
    if step_rows:
        step_numbers = np.array([num for num, _ in step_rows], dtype=np.int64)
        rows = np.array([r for _, r in step_rows], dtype=np.int64)
        order = np.argsort(start_ns[rows], kind="stable")
        step_numbers, rows = step_numbers[order], rows[order]
        if distinct(step_numbers).size != step_numbers.size:
            raise TraceFormatError(path, "two ProfilerStep events carry the same step number")
        host_start = start_ns[rows]
        host_end = host_start + dur_ns[rows]
    else:
        step_numbers = np.array([span_index], dtype=np.int64)
        ends = start_ns + dur_ns
        host_start = np.array([start_ns.min() if n else base_ns], dtype=np.int64)
        host_end = np.array([ends.max() if n else base_ns], dtype=np.int64)
    n_steps = step_numbers.size
    step_of = np.clip(np.searchsorted(host_start, start_ns, side="right") - 1, 0, n_steps - 1)
    launched = launch >= 0
    step_of[launched] = step_of[launch[launched]]
    device_work = IS_DEVICE_WORK[kind]
    work_end = np.full(n_steps, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(work_end, step_of[device_work], (start_ns + dur_ns)[device_work])
    span_end = np.maximum(host_end, work_end)
    span_start = host_start.copy()
    for i in range(1, n_steps):
        span_start[i] = max(host_start[i], span_end[i - 1])
        span_end[i] = max(span_end[i], span_start[i])
    return step_numbers, host_start, step_of, span_start, span_end


def _planned_span(
    plan: StepPlan,
    *,
    cols,
    path,
    strings,
    span_index,
    base_ns,
    kind,
    parent,
    launch,
    order,
    warnings,
) -> SpanStream:
    """The steps of a part of a file, as StepPlan decided them; flow points bind to the
    part's own events (a point's enclosing slice is in its step's part)."""
    flows, _ = _bind_flows(
        cols.flows, cols.start_ns, cols.dur_ns, cols.track_id, parent, path, order
    )
    frow = flows["row"]
    plan.unbound_flows[0] += int((frow < 0).sum())
    plan.unbound_flows[1] += int(frow.size)
    step_of = plan.step_of.astype(np.int64)
    flow_step = np.where(frow >= 0, step_of[np.maximum(frow, 0)], plan.flow_step)
    steps = _split_steps(
        n_steps=plan.step_numbers.size,
        step_numbers=plan.step_numbers,
        span_start=plan.span_start,
        span_end=plan.span_end,
        step_of=step_of,
        step_order=_step_order(plan.step_numbers.size, step_of, order),
        columns={
            "start_ns": cols.start_ns,
            "dur_ns": cols.dur_ns,
            "name_id": cols.name_id,
            "track_id": cols.track_id,
            "kind": kind,
            "cat_id": cols.cat_id,
            "correlation": cols.correlation,
            "external_id": cols.external_id,
            "parent": parent,
            "launch": launch,
        },
        attrs=cols.attrs,
        flows=flows,
        flow_step=flow_step.astype(np.int64),
        strings=strings,
        tracks=plan.tracks,
        span_index=span_index,
    )
    return SpanStream(
        steps=steps,
        step_count=int(plan.step_numbers.size),
        tracks=plan.tracks,
        event_count=cols.count,
        base_ns=base_ns,
        warnings=warnings,
    )


def _step_marker_rows(name_id, cat_id, strings: StringTable, is_x) -> list[tuple[int, int]]:
    """(step number, row) of every ProfilerStep#N slice of a step-marker category."""
    used_cats = np.flatnonzero(np.bincount(cat_id, minlength=len(strings.strings)))
    is_step_cat = np.zeros(len(strings.strings), dtype=bool)
    for i in used_cats.tolist():
        is_step_cat[i] = strings.strings[i].lower() in _STEP_CATS
    if not is_step_cat.any():
        return []
    candidates = np.flatnonzero(is_step_cat[cat_id] & is_x)
    out = []
    for nid in distinct(name_id[candidates]).tolist():
        m = _STEP_NAME.match(strings.strings[nid])
        if m:
            for row in candidates[name_id[candidates] == nid].tolist():
                out.append((int(m.group(1)), row))
    return out


def _track_infos(tracks: Tracks, kind, track_id, attrs: list[Attr], meta_events) -> list[TrackInfo]:
    n_tracks = len(tracks.keys)
    device_like = _IS_DEVICE_TRACK[kind]
    host_like = ~device_like & (kind != KIND["trace_span"]) & (kind != KIND["other"])
    n_device = np.bincount(track_id[device_like], minlength=n_tracks)
    n_host = np.bincount(track_id[host_like], minlength=n_tracks)
    attr_by_key = {a.key: a for a in attrs}
    device_rows = np.flatnonzero(device_like)
    device_tracks, first = np.unique(track_id[device_rows], return_index=True)
    first_device_row = dict(zip(device_tracks.tolist(), device_rows[first].tolist()))

    def attr_value(key: str, row: int):
        a = attr_by_key.get(key)
        if a is None or a.type != "int64":
            return None
        i = np.searchsorted(a.rows, row)
        return int(a.values[i]) if i < a.rows.size and a.rows[i] == row else None

    device_of, stream_of = {}, {}
    for t, row in first_device_row.items():
        device_of[t] = attr_value("device", row)
        stream_of[t] = attr_value("stream", row)
    return track_infos_from(tracks, n_device > 0, n_host > 0, device_of, stream_of, meta_events)


def track_infos_from(
    tracks: Tracks,
    has_device: np.ndarray,
    has_host: np.ndarray,
    device_of: dict[int, int | None],
    stream_of: dict[int, int | None],
    meta_events,
) -> list[TrackInfo]:
    """TrackInfo of each track: a device stream when it holds device events (its device
    and stream from the first one's int arguments `device`/`stream`, else from pid/tid),
    else a host thread when it holds host events; names and order from metadata events."""
    thread_names: dict[tuple[str, str], str] = {}
    sort_index: dict[tuple[str, str], int] = {}
    labels: dict[str, str] = {}
    for e in meta_events:
        key = (str(e.pid), str(e.tid))
        a = e.args or {}
        if e.name == "thread_name" and isinstance(a.get("name"), str):
            thread_names[key] = a["name"].strip()
        elif e.name == "thread_sort_index" and isinstance(a.get("sort_index"), int):
            sort_index[key] = a["sort_index"]
        elif e.name == "process_labels" and isinstance(a.get("labels"), str):
            labels[str(e.pid)] = a["labels"]

    infos = []
    for tid_, (pid, tid) in enumerate(tracks.keys):
        name = thread_names.get((pid, tid), "")
        if has_device[tid_]:
            device = device_of.get(tid_)
            stream = stream_of.get(tid_)
            if device is None:
                device = int(pid) if pid.lstrip("-").isdigit() else -1
            if stream is None:
                digits = _DIGITS.findall(tid)
                stream = int(digits[-1]) if digits else -1
            label = labels.get(pid, f"GPU {device}")
            infos.append(
                TrackInfo(
                    tid_,
                    "device_stream",
                    pid,
                    tid,
                    device,
                    stream,
                    name or f"{label} stream {stream}",
                    sort_index.get((pid, tid), stream),
                )
            )
        elif has_host[tid_]:
            infos.append(
                TrackInfo(
                    tid_,
                    "host_thread",
                    pid,
                    tid,
                    -1,
                    -1,
                    name or f"thread {tid}",
                    sort_index.get((pid, tid), 0),
                )
            )
        else:
            infos.append(
                TrackInfo(tid_, "track_other", pid, tid, -1, -1, name or f"{pid} {tid}", 0)
            )
    return infos


def previous_greater_equal(values: np.ndarray) -> np.ndarray:
    """For each i, the largest j < i with values[j] >= values[i], or -1: the monotonic
    stack in C where the scanner module is built, else _previous_greater_equal_lifting."""
    if _kineto_scan is not None and values.dtype == np.int64:
        done = _kineto_scan.previous_greater_equal(np.ascontiguousarray(values))
        return np.frombuffer(done, dtype=np.int64)
    return _previous_greater_equal_lifting(values)


def _previous_greater_equal_lifting(values: np.ndarray) -> np.ndarray:
    """previous_greater_equal in numpy, for where the C module is not built.

    Binary lifting over block maxima: level k holds the maximum of the 2^k values ending at
    each position (a prefix maximum near the start), and every i jumps left over whole blocks
    that are all smaller than its value, from the largest block size down. O(n log n) numpy
    work instead of a Python loop with a stack (the monotonic-stack answer, exactly).
    """
    n = values.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    levels = [values]
    width = 1
    while width < n:
        prev = levels[-1]
        cur = prev.copy()
        cur[width:] = np.maximum(prev[width:], prev[:-width])
        levels.append(cur)
        width *= 2
    pos = np.arange(-1, n - 1, dtype=np.int64)
    for k in range(len(levels) - 1, -1, -1):
        live = pos >= 0
        idx = np.flatnonzero(live)
        skip = levels[k][pos[idx]] < values[idx]
        pos[idx[skip]] -= 1 << k
    return np.maximum(pos, -1)


def _tree_parents(rows: np.ndarray, end, track_id, parent: np.ndarray) -> None:
    """Containment tree: B's parent is the innermost A on the same track with A ⊇ B.

    `rows` come in the canonical order (track, start, longer first, lower External id
    first), so a parent comes before its children and, on equal intervals, the lower
    External id is the parent (METRICS.md). In that order every earlier row of the track
    starts no later, so the innermost container of a row is the nearest earlier row of its
    track that ends no earlier: a previous-greater-or-equal search on the end times.
    """
    if rows.size == 0:
        return
    tracks = track_id[rows]
    nearest = previous_greater_equal(end[rows])
    # The nearest such row in an earlier track means none in this one.
    first_of_track = np.searchsorted(tracks, tracks, side="left")
    found = nearest >= first_of_track
    parent[rows[found]] = rows[nearest[found]]


def _host_tree_parents(start_ns, dur_ns, kind, track_id, order) -> np.ndarray:
    """The host trees' parents; `order`: every row in the canonical order (a subset of
    it keeps the order)."""
    parent = np.full(kind.size, -1, dtype=np.int32)
    end = start_ns + dur_ns
    ordered_kind = kind[order]
    _tree_parents(order[IS_HOST_TREE[ordered_kind]], end, track_id, parent)
    _tree_parents(order[ordered_kind == KIND["python"]], end, track_id, parent)
    return parent


def _ordered_trees(start_ns, dur_ns, kind, track_id, external_id, order_job=None) -> tuple:
    """(the rows in the file's canonical order, the host trees' parents). The order (track,
    start, longer first, lower External id) is sorted once: the host trees, the flow binding
    and the step split all read it. `order_job`: a Background already sorting it."""
    if order_job is not None:
        row_order = order_job.result()
    else:
        row_order = canonical_rows(track_id, start_ns, dur_ns, external_id)
    return row_order, _host_tree_parents(start_ns, dur_ns, kind, track_id, row_order)


def _launch_links(kind: np.ndarray, correlation: np.ndarray) -> np.ndarray:
    """For each device event, the row of the runtime/driver call with the same correlation."""
    launch = np.full(kind.size, -1, dtype=np.int32)
    launchers = np.flatnonzero(IS_LAUNCH[kind] & (correlation != 0))
    devices = np.flatnonzero(IS_DEVICE_WORK[kind] & (correlation != 0))
    if launchers.size == 0 or devices.size == 0:
        return launch
    order = np.argsort(correlation[launchers], kind="stable")
    keys = correlation[launchers][order]
    pos = np.searchsorted(keys, correlation[devices])
    pos_c = np.minimum(pos, keys.size - 1)
    hit = keys[pos_c] == correlation[devices]
    launch[devices[hit]] = launchers[order][pos_c[hit]]
    return launch


def _bind_flows(flows: dict[str, np.ndarray], start_ns, dur_ns, track_id, parent, path: str, order):
    """Fill flows["row"]: each point binds to its enclosing slice (Chrome's rule), the
    innermost event on its track whose interval contains the point's timestamp. `order`:
    the rows in the canonical order."""
    m = flows["flow_id"].size
    if not m or not start_ns.size:
        return flows, ""
    # Rows sorted by (track, start, longer first) make the last event starting at or before
    # ts the innermost candidate; when it has already ended, its ancestors in the host tree
    # are the next candidates. Of rows equal on all three, the candidate is the one of
    # highest row index; the canonical order sorts those by External id, so each position
    # stands for its group's highest row.
    end_ns = start_ns + dur_ns
    s_track, s_start, s_dur = track_id[order], start_ns[order], dur_ns[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = (
        (s_track[1:] != s_track[:-1]) | (s_start[1:] != s_start[:-1]) | (s_dur[1:] != s_dur[:-1])
    )
    group_starts = np.flatnonzero(first)
    candidate = np.repeat(
        np.maximum.reduceat(order, group_starts), np.diff(group_starts, append=order.size)
    )
    f_track, f_ts = flows["track_id"], flows["ts_ns"]
    row = flows["row"]
    for t in distinct(f_track):
        lo, hi = np.searchsorted(s_track, [t, t + 1])
        sel = np.flatnonzero(f_track == t)
        if lo == hi:
            continue
        pos = np.searchsorted(s_start[lo:hi], f_ts[sel], side="right") - 1
        found = pos >= 0
        row[sel[found]] = candidate[lo:hi][pos[found]]
    bound = np.flatnonzero(row >= 0)
    for i in bound[end_ns[row[bound]] < f_ts[bound]].tolist():
        r = int(row[i])
        while r >= 0 and end_ns[r] < f_ts[i]:
            r = int(parent[r])
        row[i] = r
    unresolved = int((row < 0).sum())
    warn = f"{path}: {unresolved} of {m} flow points bind to no event" if unresolved else ""
    return flows, warn


class _StepStrings:
    """Each step's own string table: `renumber(used)` gives the sorted distinct string ids
    in `used` (int32 arrays of the file's ids), 0 (the empty string) always among them,
    and each array renumbered into that table (int32); the ids hold until the next call.
    In one C pass without the GIL (`_kineto_scan.compact_strings`), or in numpy without
    the C module."""

    def __init__(self, n_strings: int, in_c: bool | None = None) -> None:
        self.c = _kineto_scan is not None if in_c is None else in_c
        if self.c:
            self.marks = np.full(n_strings, -1, dtype=np.int32)  # (left all -1)
            self.ids = np.empty(n_strings, dtype=np.int64)
        else:
            self.in_use = np.zeros(n_strings, dtype=bool)  # (left all False)
            self.string_map = np.full(n_strings, -1, dtype=np.int64)

    def renumber(self, used: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        if self.c:
            used = [np.ascontiguousarray(u, dtype=np.int32) for u in used]
            outs = [np.empty(u.size, dtype=np.int32) for u in used]
            count = _kineto_scan.compact_strings(tuple(used), tuple(outs), self.ids, self.marks)
            return self.ids[:count], outs
        ids = self._used_ids(used)
        self.string_map[ids] = np.arange(ids.size)
        return ids, [self.string_map[u].astype(np.int32) for u in used]

    def _used_ids(self, used: list[np.ndarray]) -> np.ndarray:
        """The sorted distinct ids in `used`, and 0: marked in `in_use` where the table is
        not much larger than the ids."""
        in_use = self.in_use
        count = sum(u.size for u in used)
        if in_use.size > 16 * count + 4096:
            return distinct(
                np.concatenate([np.zeros(1, np.int64)] + [u.astype(np.int64) for u in used])
            )
        in_use[0] = True
        for u in used:
            in_use[u] = True
        ids = np.flatnonzero(in_use)
        in_use[ids] = False
        return ids


def _attrs_by_step(attrs, rank, step_of, local_of, n_steps) -> list[tuple]:
    """(attr, step-local rows, values, per-step bounds) of each argument column, its
    entries in step order and, within a step, in the rows' order."""
    out = []
    for a in attrs:
        # (ranks are distinct, so any sort gives this order; a stable one is fastest on
        # the runs that file order leaves. The rows gather in numpy's own index type: by
        # int32 indices numpy takes a slower path, 20% of this function on the 50x copy.)
        rows = a.rows.astype(np.intp)
        o = np.argsort(rank[rows], kind="stable")
        a_rows = rows[o]
        bounds = np.searchsorted(step_of[a_rows], np.arange(n_steps + 1))
        out.append((a, local_of[a_rows], a.values[o], bounds))
    return out


def _step_order(n_steps: int, step_of: np.ndarray, order: np.ndarray) -> tuple:
    """(the rows in step order, each step's first row there and the end, each row's place
    in that order, each row's index in its step). `order`: the rows in the canonical order,
    which a stable sort by step keeps within each step."""
    n = step_of.size
    by_step = step_of[order]
    if n_steps <= np.iinfo(np.uint16).max:
        by_step = by_step.astype(np.uint16)  # a stable sort of 16-bit keys is a radix sort
    ev_order = order[np.argsort(by_step, kind="stable")]
    ev_bounds = np.searchsorted(step_of[ev_order], np.arange(n_steps + 1))
    rank = np.empty(n, dtype=np.int64)
    rank[ev_order] = np.arange(n)
    local_of = (rank - ev_bounds[step_of]).astype(np.int32)  # a row's index in its step
    return ev_order, ev_bounds, rank, local_of


def _split_steps(
    *,
    n_steps,
    step_numbers,
    span_start,
    span_end,
    step_of,
    step_order,
    columns,
    attrs,
    flows,
    flow_step,
    strings: StringTable,
    tracks,
    span_index,
) -> Iterator[StepData]:
    """The steps, one at a time (a generator). Rows are put in step order once (by step,
    then in the file's canonical order, step.canonical_order, so that the writer has
    nothing to reorder: `step_order`, from _step_order) and row references made step-local
    once; each step's columns are then slices of those arrays, made when it is asked for."""
    n = step_of.size
    ev_order, ev_bounds, rank, local_of = step_order
    del step_order
    # The arguments are put in step order beside the events' columns (numpy's sorts and
    # gathers release the GIL). On a large span a second thread takes the first arguments,
    # some 70% of their entries, and this one the rest after its own columns: the first
    # step came soonest so (11 ms on the 10x copy against 16 ms in one thread and 12.5 ms
    # with all of them in the other; 53 against 67 ms with all of them there on the 50x).
    sizes = np.cumsum([0] + [a.rows.size for a in attrs])
    split_at = int(np.searchsorted(sizes, sizes[-1] * 0.7))
    split_attrs = Background(_attrs_by_step, attrs[:split_at], rank, step_of, local_of, n_steps)
    split_attrs.run_or_start(n)
    ordered = {name: col[ev_order] for name, col in columns.items()}
    del columns
    ordered_step = step_of[ev_order]
    for ref in ("parent", "launch"):
        g = ordered[ref]
        target = np.maximum(g, 0).astype(np.intp)  # (gathered by twice: numpy's index type)
        # A reference into another step's rows is dropped (-1), not left dangling.
        same = (g >= 0) & (step_of[target] == ordered_step)
        ordered[ref] = np.where(same, local_of[target], -1).astype(np.int32)
    del ordered_step
    f_order = np.argsort(flow_step, kind="stable")
    f_bounds = np.searchsorted(flow_step[f_order], np.arange(n_steps + 1))
    f_ordered = {name: col[f_order] for name, col in flows.items()}
    frow = f_ordered["row"]
    bound = np.maximum(frow, 0)
    same = (frow >= 0) & (step_of[bound] == flow_step[f_order])
    f_ordered["row"] = np.where(same, local_of[bound], -1).astype(np.int32)
    del frow, bound, same
    rest = _attrs_by_step(attrs[split_at:], rank, step_of, local_of, n_steps)
    attr_split = split_attrs.result() + rest
    if split_attrs.threaded:
        # The other thread's temporaries of the span's pieces, before the steps are made:
        # the 52x one-step copy peaked at 261 MB without this, 223 MB with it.
        release_freed_memory()
    del rank, local_of, split_attrs
    all_strings = np.array(strings.strings, dtype=object)
    step_strings = _StepStrings(len(strings.strings))

    for k in range(n_steps):
        lo, hi = ev_bounds[k], ev_bounds[k + 1]
        ev = {name: col[lo:hi] for name, col in ordered.items()}
        step_attrs = []
        for a, a_local, a_values, bounds in attr_split:
            b0, b1 = bounds[k], bounds[k + 1]
            if b1 > b0:
                step_attrs.append(Attr(a.key, a.type, a_local[b0:b1], a_values[b0:b1]))
        step_flows = {name: col[f_bounds[k] : f_bounds[k + 1]] for name, col in f_ordered.items()}

        # Compact string table for this step.
        is_string = [a.type in ("string", "json") for a in step_attrs]
        used = [ev["name_id"], ev["cat_id"], step_flows["cat_id"]]
        used += [a.values for a, s in zip(step_attrs, is_string) if s]
        ids, renumbered = step_strings.renumber(used)
        ev["name_id"], ev["cat_id"], step_flows["cat_id"] = renumbered[:3]
        values = iter(renumbered[3:])
        step_attrs = [
            Attr(a.key, a.type, a.rows, next(values)) if s else a
            for a, s in zip(step_attrs, is_string)
        ]
        step = StepData(
            step=int(step_numbers[k]),
            start_ns=int(span_start[k]),
            end_ns=int(span_end[k]),
            strings=all_strings[ids].tolist(),
            tracks=tracks,
            events=ev,
            attrs=step_attrs,
            flows=step_flows,
            span_index=span_index,
        )
        yield step
