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
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from tessera_tb.importers.kineto_decode import RawEvent, RawTrace
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.step import FLOW_PHASES, KIND, Attr, StepData, TrackInfo

_STEP_NAME = re.compile(r"^ProfilerStep#(-?\d+)$")
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
_DEVICE_KINDS = {KIND[k] for k in ("kernel", "collective", "memcpy", "memset", "gpu_annotation")}
_DEVICE_KINDS.add(KIND["profiler_range"])
_DEVICE_WORK = np.array([KIND[k] for k in ("kernel", "collective", "memcpy", "memset")], np.uint8)
_HOST_TREE = np.array([KIND[k] for k in ("cpu_op", "annotation", "runtime", "driver")], np.uint8)
_LAUNCHERS = np.array([KIND["runtime"], KIND["driver"]], np.uint8)
_COLLECTIVE_PREFIXES = ("nccl", "rccl")

# Arguments promoted to event columns rather than kept as attributes.
_CORRELATION_KEYS = ("correlation",)
_EXTERNAL_ID_KEYS = ("External id", "external id")
_PROMOTED = set(_CORRELATION_KEYS) | set(_EXTERNAL_ID_KEYS)

_MISSING = object()
_JSON = msgspec.json.Encoder()
_INT64_MAX = 2**63 - 1


class StringTable:
    """Interns strings: the same text gets the same id within one worker's import."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {"": 0}
        self.strings: list[str] = [""]

    def intern_many(self, values: list[str]) -> np.ndarray:
        ids, strings = self.ids, self.strings
        out = np.empty(len(values), dtype=np.int32)
        for i, v in enumerate(values):
            j = ids.get(v)
            if j is None:
                j = ids[v] = len(strings)
                strings.append(v)
            out[i] = j
        return out

    def intern(self, value: str) -> int:
        j = self.ids.get(value)
        if j is None:
            j = self.ids[value] = len(self.strings)
            self.strings.append(value)
        return j


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """Microseconds (Kineto's float ts/dur, 3 decimals) -> integer ns without float rounding loss.

    Multiplying an absolute epoch-µs timestamp (~1.7e15) by 1000 would lose precision in
    float64; splitting off the whole microseconds keeps every nanosecond the JSON holds.
    """
    whole = np.floor(us)
    frac_ns = np.rint((us - whole) * 1000.0).astype(np.int64)
    return whole.astype(np.int64) * 1000 + frac_ns


@dataclass
class SpanResult:
    steps: list[StepData]
    tracks: list[TrackInfo]
    event_count: int
    base_ns: int
    warnings: list[str] = field(default_factory=list)


def _first_missing(values: np.ndarray, index: np.ndarray, path: str, field_name: str, ph: str):
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(index[bad[0]])
        raise TraceFormatError(
            path,
            f"traceEvents[{i}] (ph {ph!r}) has no numeric {field_name!r} ({bad.size} such events)",
        )


def _int_or_none(v: Any) -> int:
    if isinstance(v, bool) or v is None:
        return 0
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return 0
    return int(v) if isinstance(v, float) and v.is_integer() else 0


class _Tracks:
    """Maps (pid, tid) as the source spells them onto track ids; "25738" and 25738 are one."""

    def __init__(self) -> None:
        self.by_raw: dict[tuple, int] = {}
        self.by_key: dict[tuple[str, str], int] = {}
        self.keys: list[tuple[str, str]] = []

    def ids(self, events: list[RawEvent]) -> np.ndarray:
        by_raw = self.by_raw
        out = np.empty(len(events), dtype=np.int32)
        for i, e in enumerate(events):
            raw = (e.pid, e.tid)
            j = by_raw.get(raw)
            if j is None:
                key = (str(e.pid), str(e.tid))
                j = self.by_key.get(key)
                if j is None:
                    j = self.by_key[key] = len(self.keys)
                    self.keys.append(key)
                by_raw[raw] = j
            out[i] = j
        return out


def build_span(trace: RawTrace, strings: StringTable, span_index: int, base_ns: int) -> SpanResult:
    """Convert a decoded trace into StepData, one per step (in step order)."""
    path = trace.path
    events = trace.events
    warnings: list[str] = []

    ph_all = np.array([e.ph for e in events], dtype=object)
    idx_slices = np.flatnonzero((ph_all == "X") | (ph_all == "i") | (ph_all == "I"))
    idx_flows = np.flatnonzero((ph_all == "s") | (ph_all == "t") | (ph_all == "f"))
    idx_meta = np.flatnonzero(ph_all == "M")
    other = ph_all.size - idx_slices.size - idx_flows.size - idx_meta.size
    if other:
        phases = sorted(set(ph_all.tolist()) - {"X", "i", "I", "s", "t", "f", "M"})
        warnings.append(
            f"{path}: {other} events of phase {phases} are not part of the Kineto format; skipped"
        )

    evs = [events[i] for i in idx_slices]
    n = len(evs)
    ts = np.array([e.ts for e in evs], dtype=np.float64)
    _first_missing(ts, idx_slices, path, "ts", "X")
    is_x = ph_all[idx_slices] == "X"
    dur = np.array([e.dur if x else 0.0 for e, x in zip(evs, is_x.tolist())], dtype=np.float64)
    _first_missing(dur, idx_slices, path, "dur", "X")
    if n and (dur < 0).any():
        i = int(idx_slices[np.flatnonzero(dur < 0)[0]])
        raise TraceFormatError(path, f"traceEvents[{i}] has a negative 'dur'")
    start_ns = base_ns + us_to_ns(ts) if n else np.zeros(0, np.int64)
    dur_ns = us_to_ns(dur) if n else np.zeros(0, np.int64)
    names = [e.name for e in evs]
    name_id = strings.intern_many(names)
    cat_id = strings.intern_many([e.cat for e in evs])
    tracks = _Tracks()
    track_id = tracks.ids(evs)

    # Kinds, by category, then refined by name.
    kind = np.zeros(n, dtype=np.uint8)
    for cid in np.unique(cat_id):
        k = _CAT_KIND.get(strings.strings[cid].lower(), "other")
        kind[cat_id == cid] = KIND[k]
    memory_id = strings.ids.get("[memory]")
    if memory_id is not None:
        kind[(name_id == memory_id) & ~is_x] = KIND["memory"]
    kind[(~is_x) & (kind == KIND["other"])] = KIND["mark"]

    # Arguments: promoted columns and sparse attributes.
    args = [e.args for e in evs]
    correlation = np.zeros(n, dtype=np.int64)
    external_id = np.zeros(n, dtype=np.int64)
    attrs = _build_attrs(args, cat_id, strings, correlation, external_id)

    coll_rows = next((a.rows for a in attrs if a.key == "Collective name"), None)
    kernel = kind == KIND["kernel"]
    if coll_rows is not None:
        kind[coll_rows[kernel[coll_rows]]] = KIND["collective"]
    for nid in np.unique(name_id[kernel]):
        if strings.strings[nid].startswith(_COLLECTIVE_PREFIXES):
            kind[kernel & (name_id == nid)] = KIND["collective"]

    track_infos = _track_infos(tracks, kind, track_id, attrs, [events[i] for i in idx_meta])
    parent = _host_tree_parents(start_ns, dur_ns, kind, track_id, external_id)
    launch = _launch_links(kind, correlation)

    # Steps.
    step_rows = _step_marker_rows(names, cat_id, strings, is_x)
    # Before 2022 step markers were "Operator" events like any op: they are annotations.
    kind[[r for _, r in step_rows]] = KIND["annotation"]
    if step_rows:
        step_numbers = np.array([num for num, _ in step_rows], dtype=np.int64)
        rows = np.array([r for _, r in step_rows], dtype=np.int64)
        order = np.argsort(start_ns[rows], kind="stable")
        step_numbers, rows = step_numbers[order], rows[order]
        if np.unique(step_numbers).size != step_numbers.size:
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
    device_work = np.isin(kind, _DEVICE_WORK)
    work_end = np.full(n_steps, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(work_end, step_of[device_work], (start_ns + dur_ns)[device_work])
    span_end = np.maximum(host_end, work_end)
    span_start = host_start.copy()
    for i in range(1, n_steps):
        span_start[i] = max(host_start[i], span_end[i - 1])
        span_end[i] = max(span_end[i], span_start[i])

    flows, flow_warn = _build_flows(
        [events[i] for i in idx_flows],
        strings,
        tracks,
        start_ns,
        dur_ns,
        track_id,
        parent,
        base_ns,
        path,
    )
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
        track_infos = _track_infos(tracks, kind, track_id, attrs, [events[i] for i in idx_meta])

    steps = _split_steps(
        n_steps=n_steps,
        step_numbers=step_numbers,
        span_start=span_start,
        span_end=span_end,
        step_of=step_of,
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
    return SpanResult(
        steps=steps, tracks=track_infos, event_count=n, base_ns=base_ns, warnings=warnings
    )


def _step_marker_rows(names, cat_id, strings: StringTable, is_x) -> list[tuple[int, int]]:
    step_cats = {i for s, i in strings.ids.items() if s.lower() in _STEP_CATS}
    out = []
    if not step_cats:
        return out
    for row in np.flatnonzero(np.isin(cat_id, list(step_cats)) & is_x).tolist():
        m = _STEP_NAME.match(names[row])
        if m:
            out.append((int(m.group(1)), row))
    return out


def _build_attrs(
    args: list[dict | None],
    cat_id: np.ndarray,
    strings: StringTable,
    correlation: np.ndarray,
    external_id: np.ndarray,
) -> list[Attr]:
    """Sparse typed attribute columns from the events' args (grouped by category for speed)."""
    per_key: dict[str, list[tuple[np.ndarray, list]]] = {}
    has_args = np.fromiter(
        (a is not None and len(a) > 0 for a in args), dtype=bool, count=len(args)
    )
    for cid in np.unique(cat_id[has_args]):
        rows = np.flatnonzero(has_args & (cat_id == cid))
        group = [args[r] for r in rows.tolist()]
        keys: set[str] = set()
        for a in group:
            keys.update(a)
        for key in keys:
            vals = [a.get(key, _MISSING) for a in group]
            present = np.fromiter(
                (v is not _MISSING and v is not None for v in vals), dtype=bool, count=len(vals)
            )
            if not present.any():
                continue
            prow = rows[present]
            pvals = [v for v, p in zip(vals, present.tolist()) if p]
            if key in _PROMOTED:
                target = correlation if key in _CORRELATION_KEYS else external_id
                target[prow] = [_int_or_none(v) for v in pvals]
                continue
            per_key.setdefault(key, []).append((prow, pvals))
    attrs = []
    for key in sorted(per_key):
        parts = per_key[key]
        rows = np.concatenate([p[0] for p in parts])
        vals = [v for p in parts for v in p[1]]
        order = np.argsort(rows, kind="stable")
        rows = rows[order].astype(np.int32)
        vals = [vals[i] for i in order.tolist()]
        attrs.append(_typed_attr(key, rows, vals, strings))
    return attrs


def _typed_attr(key: str, rows: np.ndarray, vals: list, strings: StringTable) -> Attr:
    types = set(map(type, vals))
    if types == {bool}:
        return Attr(key, "bool", rows, np.array(vals, dtype=np.uint8))
    if types == {int}:
        if all(-_INT64_MAX - 1 <= v <= _INT64_MAX for v in (min(vals), max(vals))):
            return Attr(key, "int64", rows, np.array(vals, dtype=np.int64))
    elif types <= {int, float}:
        return Attr(key, "float64", rows, np.array(vals, dtype=np.float64))
    if types == {str}:
        return Attr(key, "string", rows, strings.intern_many(vals))
    texts = [_JSON.encode(v).decode() for v in vals]
    return Attr(key, "json", rows, strings.intern_many(texts))


def _track_infos(
    tracks: _Tracks, kind, track_id, attrs: list[Attr], meta_events
) -> list[TrackInfo]:
    n_tracks = len(tracks.keys)
    device_like = np.isin(kind, list(_DEVICE_KINDS))
    host_like = ~device_like & (kind != KIND["trace_span"]) & (kind != KIND["other"])
    n_device = np.bincount(track_id[device_like], minlength=n_tracks)
    n_host = np.bincount(track_id[host_like], minlength=n_tracks)
    attr_by_key = {a.key: a for a in attrs}
    first_device_row = {}
    for row in np.flatnonzero(device_like).tolist()[::-1]:
        first_device_row[int(track_id[row])] = row

    def attr_value(key: str, row: int):
        a = attr_by_key.get(key)
        if a is None or a.type != "int64":
            return None
        i = np.searchsorted(a.rows, row)
        return int(a.values[i]) if i < a.rows.size and a.rows[i] == row else None

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
        if n_device[tid_] > 0:
            row = first_device_row.get(tid_)
            device = attr_value("device", row) if row is not None else None
            stream = attr_value("stream", row) if row is not None else None
            if device is None:
                device = int(pid) if pid.lstrip("-").isdigit() else -1
            if stream is None:
                digits = re.findall(r"-?\d+", tid)
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
        elif n_host[tid_] > 0:
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


def _tree_parents(rows: np.ndarray, start, end, track_id, external_id, parent: np.ndarray) -> None:
    """Containment tree: B's parent is the innermost A on the same track with A ⊇ B.

    Rows are ordered by track, start, longer first, lower External id first, so a
    parent comes before its children and, on equal intervals, the lower External id
    is the parent (METRICS.md).
    """
    if rows.size == 0:
        return
    order = np.lexsort((external_id[rows], -(end[rows] - start[rows]), start[rows], track_id[rows]))
    rows = rows[order]
    r_list = rows.tolist()
    e_list = end[rows].tolist()
    t_list = track_id[rows].tolist()
    out = [-1] * len(r_list)
    stack_rows: list[int] = []
    stack_ends: list[int] = []
    cur_track = None
    for i, (r, e, t) in enumerate(zip(r_list, e_list, t_list)):
        if t != cur_track:
            stack_rows.clear()
            stack_ends.clear()
            cur_track = t
        while stack_ends and stack_ends[-1] < e:
            stack_ends.pop()
            stack_rows.pop()
        if stack_rows:
            out[i] = stack_rows[-1]
        stack_rows.append(r)
        stack_ends.append(e)
    parent[rows] = out


def _host_tree_parents(start_ns, dur_ns, kind, track_id, external_id) -> np.ndarray:
    parent = np.full(kind.size, -1, dtype=np.int32)
    end = start_ns + dur_ns
    _tree_parents(
        np.flatnonzero(np.isin(kind, _HOST_TREE)), start_ns, end, track_id, external_id, parent
    )
    _tree_parents(
        np.flatnonzero(kind == KIND["python"]), start_ns, end, track_id, external_id, parent
    )
    return parent


def _launch_links(kind: np.ndarray, correlation: np.ndarray) -> np.ndarray:
    """For each device event, the row of the runtime/driver call with the same correlation."""
    launch = np.full(kind.size, -1, dtype=np.int32)
    launchers = np.flatnonzero(np.isin(kind, _LAUNCHERS) & (correlation != 0))
    devices = np.flatnonzero(np.isin(kind, _DEVICE_WORK) & (correlation != 0))
    if launchers.size == 0 or devices.size == 0:
        return launch
    order = np.argsort(correlation[launchers], kind="stable")
    keys = correlation[launchers][order]
    pos = np.searchsorted(keys, correlation[devices])
    pos_c = np.minimum(pos, keys.size - 1)
    hit = keys[pos_c] == correlation[devices]
    launch[devices[hit]] = launchers[order][pos_c[hit]]
    return launch


def _build_flows(
    points: list[RawEvent],
    strings,
    tracks: _Tracks,
    start_ns,
    dur_ns,
    track_id,
    parent,
    base_ns: int,
    path: str,
):
    m = len(points)
    ts = np.array([p.ts for p in points], dtype=np.float64)
    if m and not np.isfinite(ts).all():
        raise TraceFormatError(path, "a flow event (ph s/t/f) has no numeric 'ts'")
    flows = {
        "flow_id": np.array([_int_or_none(p.id) for p in points], dtype=np.int64),
        "cat_id": strings.intern_many([p.cat for p in points]),
        "phase": np.array([FLOW_PHASES[p.ph] for p in points], dtype=np.uint8),
        "track_id": tracks.ids(points),
        "ts_ns": base_ns + us_to_ns(ts) if m else np.zeros(0, np.int64),
        "row": np.full(m, -1, dtype=np.int32),
    }
    if not m or not start_ns.size:
        return flows, ""
    # Bind each point to the enclosing slice on its track (Chrome's rule): the innermost
    # event that contains its ts. Rows sorted by (track, start, longer first) make the last
    # event starting at or before ts the innermost candidate; when that one has already
    # ended, its ancestors in the host tree are the next candidates.
    end_ns = start_ns + dur_ns
    order = np.lexsort((-dur_ns, start_ns, track_id))
    s_track, s_start = track_id[order], start_ns[order]
    f_track, f_ts = flows["track_id"], flows["ts_ns"]
    for t in np.unique(f_track):
        lo, hi = np.searchsorted(s_track, [t, t + 1])
        sel = np.flatnonzero(f_track == t)
        if lo == hi:
            continue
        pos = np.searchsorted(s_start[lo:hi], f_ts[sel], side="right") - 1
        found = pos >= 0
        flows["row"][sel[found]] = order[lo:hi][pos[found]]
    row = flows["row"]
    bound = np.flatnonzero(row >= 0)
    for i in bound[end_ns[row[bound]] < f_ts[bound]].tolist():
        r = int(row[i])
        while r >= 0 and end_ns[r] < flows["ts_ns"][i]:
            r = int(parent[r])
        row[i] = r
    unresolved = int((row < 0).sum())
    warn = f"{path}: {unresolved} of {m} flow points bind to no event" if unresolved else ""
    return flows, warn


def _split_steps(
    *,
    n_steps,
    step_numbers,
    span_start,
    span_end,
    step_of,
    columns,
    attrs,
    flows,
    flow_step,
    strings: StringTable,
    tracks,
    span_index,
) -> list[StepData]:
    n = step_of.size
    ev_order = np.argsort(step_of, kind="stable")
    ev_bounds = np.searchsorted(step_of[ev_order], np.arange(n_steps + 1))
    local_of = np.full(n, -1, dtype=np.int32)
    attr_split = []
    for a in attrs:
        a_step = step_of[a.rows]
        o = np.argsort(a_step, kind="stable")
        attr_split.append((a, o, np.searchsorted(a_step[o], np.arange(n_steps + 1))))
    f_order = np.argsort(flow_step, kind="stable")
    f_bounds = np.searchsorted(flow_step[f_order], np.arange(n_steps + 1))
    all_strings = np.array(strings.strings, dtype=object)
    string_map = np.full(len(strings.strings), -1, dtype=np.int64)

    out = []
    for k in range(n_steps):
        rows = ev_order[ev_bounds[k] : ev_bounds[k + 1]]
        local_of[rows] = np.arange(rows.size, dtype=np.int32)
        ev = {name: col[rows] for name, col in columns.items()}
        for ref in ("parent", "launch"):
            g = ev[ref]
            valid = g >= 0
            loc = np.full(g.size, -1, dtype=np.int32)
            loc[valid] = local_of[g[valid]]
            # A reference into another step's rows is dropped (-1), not left dangling.
            same = np.zeros(g.size, dtype=bool)
            same[valid] = step_of[g[valid]] == k
            ev[ref] = np.where(same, loc, -1).astype(np.int32)
        step_attrs = []
        for a, o, bounds in attr_split:
            sel = o[bounds[k] : bounds[k + 1]]
            if sel.size:
                step_attrs.append(Attr(a.key, a.type, local_of[a.rows[sel]], a.values[sel]))
        fsel = f_order[f_bounds[k] : f_bounds[k + 1]]
        step_flows = {name: col[fsel] for name, col in flows.items()}
        frow = step_flows["row"]
        fvalid = frow >= 0
        step_flows["row"] = np.where(fvalid, local_of[np.maximum(frow, 0)], -1).astype(np.int32)

        # Compact string table for this step.
        used = [ev["name_id"], ev["cat_id"], step_flows["cat_id"]]
        used += [a.values for a in step_attrs if a.type in ("string", "json")]
        ids = np.unique(
            np.concatenate([np.zeros(1, np.int32)] + [u.astype(np.int32) for u in used])
        )
        string_map[ids] = np.arange(ids.size)
        ev["name_id"] = string_map[ev["name_id"]].astype(np.int32)
        ev["cat_id"] = string_map[ev["cat_id"]].astype(np.int32)
        step_flows["cat_id"] = string_map[step_flows["cat_id"]].astype(np.int32)
        step_attrs = [
            Attr(a.key, a.type, a.rows, string_map[a.values].astype(np.int32))
            if a.type in ("string", "json")
            else a
            for a in step_attrs
        ]
        out.append(
            StepData(
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
        )
        local_of[rows] = -1
    return out
