"""Timeline queries with level of detail: what to draw for one time window of one worker.

A window answer holds every event that overlaps the window, drawn either as itself or, when
it is narrower than the resolution, merged into a summary box. Layout: each track (host
thread, device stream) has lanes, and each lane rows by nesting depth:

- lane "ops": cpu_op, user annotation, runtime and driver events; depth = number of
  ancestors in the host op tree (the `parent` column, METRICS.md "Steps and nesting");
- lane "python": python_function events; depth in their own tree (never mixed with ops,
  they partially overlap annotations);
- lane "device": kernels, NCCL kernels, memcpys, memsets;
- lane "gpu_annotations": gpu_user_annotation labels (kept off the device-work rows);
- lane "other": every other kind with a duration (cuda_sync, profiler spans, ...);
- lane "instants": [memory] events and instant marks.

Outside the two trees, depth = number of earlier events of the same track and lane still open
at the event's start (0 for a stream whose work does not overlap).

Level of detail: with resolution r (ns), an event with dur_ns >= r is drawn as itself; the
others are merged per (track, lane, depth) and per time bin [t0 + i*r, t0 + (i+1)*r) of
their start into a summary box: count, busy_ns (length of the union of the members'
intervals inside the window), start/end (hull of the members) and the dominant name (largest
summed duration; ties: more events, then the name that sorts first). Events at one depth of a
tree do not overlap, and a box of such events never covers an event drawn at its depth. A box
of one event is drawn as that event. When no resolution is given and the window holds at most
`max_items` events, every event is drawn as itself; otherwise the resolution grows until the
answer holds at most `max_items` events and boxes.

Times in an answer are ns offsets from its `origin_ns` (epoch ns), so they stay exact as
JSON numbers (a browser's doubles cannot hold epoch ns).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tessera_tb.trace.step import (
    DEVICE_KINDS,
    KIND,
    KIND_NAMES,
    LAUNCH_KINDS,
    StepData,
    canonical_order,
)

LANES = ["ops", "python", "device", "gpu_annotations", "other", "instants"]
_LANE_OF_KIND = np.full(len(KIND_NAMES), LANES.index("other"), dtype=np.uint8)
for _k in ("cpu_op", "annotation", "runtime", "driver"):
    _LANE_OF_KIND[KIND[_k]] = LANES.index("ops")
_LANE_OF_KIND[KIND["python"]] = LANES.index("python")
for _k in ("kernel", "collective", "memcpy", "memset"):
    _LANE_OF_KIND[KIND[_k]] = LANES.index("device")
_LANE_OF_KIND[KIND["gpu_annotation"]] = LANES.index("gpu_annotations")
for _k in ("memory", "mark"):
    _LANE_OF_KIND[KIND[_k]] = LANES.index("instants")
_TREE_LANES = (LANES.index("ops"), LANES.index("python"))

DEFAULT_MAX_ITEMS = 5000


@dataclass
class TimelineIndex:
    """Per-step arrays that make window queries cheap; build once per step and cache.

    Rows are grouped by (track, lane, depth); `order` lists event rows group by group, by
    start within a group. For group g, `order[lo[g]:hi[g]]` are its rows, `starts` their
    starts and `reach_ns` the running maximum of their ends (so the events of a group that
    end after t are those from the first position where reach_ns > t on, filtered).
    """

    step: StepData
    lane: np.ndarray  # uint8 per row, index into LANES
    depth: np.ndarray  # int32 per row
    order: np.ndarray  # int64 positions -> rows
    starts: np.ndarray  # int64 epoch ns, per position
    reach_ns: np.ndarray  # int64 epoch ns, per position
    group_track: np.ndarray  # per group
    group_lane: np.ndarray
    group_depth: np.ndarray
    group_lo: np.ndarray
    group_hi: np.ndarray
    rows_of_track_lane: dict[tuple[int, int], int]  # (track, lane) -> number of depth rows
    launched_order: np.ndarray  # rows with a launch, sorted by their launching row
    launched_by: np.ndarray  # the launching row of each of those, ascending

    @classmethod
    def build(cls, step: StepData) -> TimelineIndex:
        """Index one step: O(n log n) numpy work, about 0.2 s for 500k events."""
        ev = step.events
        n = step.num_events
        kind, track = ev["kind"], ev["track_id"].astype(np.int64)
        start, dur = ev["start_ns"], ev["dur_ns"]
        canonical = _canonical_rows(ev)
        lane = _LANE_OF_KIND[kind]
        depth = np.zeros(n, dtype=np.int32)
        in_tree = np.isin(lane, _TREE_LANES)
        _tree_depth(ev["parent"], in_tree, depth)
        _open_count_depth(canonical, track, lane, start, dur, ~in_tree, depth)

        max_depth = int(depth.max()) + 1 if n else 1
        key = (track * len(LANES) + lane) * max_depth + depth
        order = canonical[np.argsort(key[canonical], kind="stable")]
        skey = key[order]
        cut = np.flatnonzero(np.diff(skey)) + 1
        lo = np.concatenate([[0], cut]).astype(np.int64) if n else np.zeros(0, np.int64)
        hi = np.concatenate([cut, [n]]).astype(np.int64) if n else np.zeros(0, np.int64)
        ends = (start + dur)[order]
        reach = np.empty_like(ends)
        for a, b in zip(lo.tolist(), hi.tolist()):
            np.maximum.accumulate(ends[a:b], out=reach[a:b])
        first = order[lo]
        group_track, group_lane, group_depth = track[first], lane[first], depth[first]
        rows_of: dict[tuple[int, int], int] = {}
        for t, ln, d in zip(group_track.tolist(), group_lane.tolist(), group_depth.tolist()):
            rows_of[(t, ln)] = max(rows_of.get((t, ln), 0), d + 1)
        launched = np.flatnonzero(ev["launch"] >= 0)
        by = np.argsort(ev["launch"][launched], kind="stable")
        return cls(
            step=step,
            lane=lane,
            depth=depth,
            order=order,
            starts=start[order],
            reach_ns=reach,
            group_track=group_track,
            group_lane=group_lane,
            group_depth=group_depth,
            group_lo=lo,
            group_hi=hi,
            rows_of_track_lane=rows_of,
            launched_order=launched[by],
            launched_by=ev["launch"][launched][by].astype(np.int64),
        )

    def window_positions(self, start_ns: int, end_ns: int, track_ok: np.ndarray) -> np.ndarray:
        """Positions (into `order`) of the events overlapping [start_ns, end_ns), group by
        group and by start within a group. An event overlaps when it starts before end_ns
        and ends after start_ns; an instant overlaps when start_ns <= ts < end_ns."""
        spans = []
        for g in np.flatnonzero(track_ok[self.group_track]).tolist():
            lo, hi = int(self.group_lo[g]), int(self.group_hi[g])
            a = lo + int(np.searchsorted(self.reach_ns[lo:hi], start_ns, side="left"))
            b = lo + int(np.searchsorted(self.starts[lo:hi], end_ns, side="left"))
            if b > a:
                spans.append((a, b))
        if not spans:
            return np.zeros(0, dtype=np.int64)
        pos = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in spans])
        rows = self.order[pos]
        ev = self.step.events
        s, d = ev["start_ns"][rows], ev["dur_ns"][rows]
        return pos[(s + d > start_ns) | ((d == 0) & (s >= start_ns))]

    def launched_rows(self, row: int) -> np.ndarray:
        """Device events launched by runtime/driver call `row`."""
        a, b = np.searchsorted(self.launched_by, [row, row + 1])
        return self.launched_order[a:b]


def _canonical_rows(ev: dict[str, np.ndarray]) -> np.ndarray:
    """Rows in the file's canonical order (docs/FORMAT.md); the identity for a stored step."""
    track, start = ev["track_id"], ev["start_ns"]
    n = track.size
    if n < 2:
        return np.arange(n, dtype=np.int64)
    same_track = track[1:] == track[:-1]
    in_order = (track[1:] >= track[:-1]).all() and (start[1:] >= start[:-1])[same_track].all()
    if in_order:
        return np.arange(n, dtype=np.int64)
    return canonical_order(ev).astype(np.int64)


def _tree_depth(parent: np.ndarray, in_tree: np.ndarray, depth: np.ndarray) -> None:
    """Number of ancestors through the parent column, one tree level per numpy pass."""
    active = np.flatnonzero(in_tree & (parent >= 0))
    cur = parent[active].astype(np.int64)
    while active.size:
        depth[active] += 1
        cur = parent[cur].astype(np.int64)
        keep = cur >= 0
        active, cur = active[keep], cur[keep]


def _open_count_depth(canonical, track, lane, start, dur, mask, depth) -> None:
    """depth = number of earlier events (canonical order) of the same track and lane that are
    still open at the event's start (end > start). Per (track, lane) group:
    earlier-and-closed = all events with end <= s, minus the later zero-duration events at s
    (canonical order puts them last among the events starting at s)."""
    rows = canonical[mask[canonical]]
    if rows.size == 0:
        return
    key = track[rows] * len(LANES) + lane[rows]
    by_key = np.argsort(key, kind="stable")
    rows, key = rows[by_key], key[by_key]
    cut = np.flatnonzero(np.diff(key)) + 1
    for grp in np.split(rows, cut):
        s, d = start[grp], dur[grp]
        e = s + d
        i = np.arange(grp.size)
        closed = np.searchsorted(np.sort(e), s, side="right")
        zero_s = s[d == 0]  # already sorted: s is sorted within a group
        zeros_at_s = np.searchsorted(zero_s, s, side="right") - np.searchsorted(zero_s, s, "left")
        first_after_s = np.searchsorted(s, s, side="right")
        later_zero = np.where(d > 0, zeros_at_s, first_after_s - i)
        depth[grp] = i - (closed - later_zero)


def _as_indexes(step_or_steps) -> list[TimelineIndex]:
    items = step_or_steps if isinstance(step_or_steps, Sequence) else [step_or_steps]
    out = [x if isinstance(x, TimelineIndex) else TimelineIndex.build(x) for x in items]
    if not out:
        raise ValueError("timeline_window needs at least one step")
    return out


def _track_key(t) -> tuple:
    return (t.kind, t.pid, t.tid, t.device, t.stream)


def _jsonable(values: np.ndarray) -> list:
    """A numpy column as a list of Python numbers/strings, NaN -> None."""
    if values.dtype.kind == "f":
        return [None if math.isnan(v) else v for v in values.tolist()]
    return values.tolist()


def timeline_window(
    step_or_steps,
    *,
    start_ns: int,
    end_ns: int,
    resolution_ns: int | None = None,
    max_items: int = DEFAULT_MAX_ITEMS,
    tracks: Sequence[int] | None = None,
    search: str | None = None,
) -> dict[str, Any]:
    """What to draw for the epoch-ns window [start_ns, end_ns) of one worker.

    `step_or_steps`: a StepData or TimelineIndex, or a sequence of them (consecutive steps of
    one worker, for a window across a step boundary). `tracks`: positions in the answer's
    `tracks` list (for one step, the step's track ids); None = all. `search`: keep only
    events whose name contains it (case-insensitive). Level of detail: module docstring.

    The answer (JSON-ready: Python numbers and strings, None for NaN):
    - origin_ns (epoch ns; every other *_ns below is an offset from it), start_ns, end_ns,
      resolution_ns (0 = every event drawn as itself), events_in_window, truncated;
    - lanes, kinds: names for the lane and kind codes;
    - tracks: [{id, kind, name, pid, tid, device, stream, lanes: {lane: depth rows}}];
    - names: the name table; `name` columns index it;
    - events: columns step, row (ids for `event_detail`), track, lane, depth, start_ns,
      dur_ns, name, kind;
    - summaries: columns track, lane, depth, start_ns, end_ns, count, busy_ns, name,
      name_dur_ns (summed duration of the dominant name);
    - flows: launch arrows (runtime/driver call -> device event, the `launch` column) with
      a drawn end: from_step, from_row, from_track, from_lane, from_depth, from_ns, to_step,
      to_row, to_track, to_lane, to_depth, to_ns;
    - steps: [{step, start_ns, end_ns}] step spans;
    - counters: [{name, unit, source, device, t_ns, value, min, max}], samples in the window
      plus the last one before it, averaged per resolution bin (NaN samples ignored).
    """
    if end_ns <= start_ns:
        raise ValueError(f"empty window: end_ns {end_ns} <= start_ns {start_ns}")
    if max_items < 1:
        raise ValueError("max_items must be at least 1")
    t0, t1 = int(start_ns), int(end_ns)
    indexes = _as_indexes(step_or_steps)
    origin = min(ix.step.start_ns for ix in indexes)

    # Tracks of all steps, in first-seen order (steps of one span share their track list).
    gtracks: dict[tuple, int] = {}
    track_maps = []
    for ix in indexes:
        track_maps.append(
            np.array([gtracks.setdefault(_track_key(t), len(gtracks)) for t in ix.step.tracks])
        )
    info = {}
    for ix in indexes:
        for t in ix.step.tracks:
            info.setdefault(gtracks[_track_key(t)], t)
    selected = np.ones(len(gtracks), dtype=bool)
    if tracks is not None:
        selected[:] = False
        selected[np.asarray(list(tracks), dtype=np.int64)] = True

    # Names of all steps in one table.
    all_names = np.concatenate([np.asarray(ix.step.strings, dtype=object) for ix in indexes])
    name_inverse, name_table = pd.factorize(all_names, sort=True)
    name_table = np.asarray(name_table, dtype=object)
    offsets = np.cumsum([0] + [len(ix.step.strings) for ix in indexes])
    name_ok = None
    if search:
        low = pd.Series(name_table).str.lower().str.contains(search.lower(), regex=False)
        name_ok = low.to_numpy()

    cols: dict[str, list[np.ndarray]] = {k: [] for k in _EVENT_COLS}
    for k, (ix, tmap) in enumerate(zip(indexes, track_maps)):
        pos = ix.window_positions(t0, t1, selected[tmap])
        rows = ix.order[pos]
        ev = ix.step.events
        names = name_inverse[offsets[k] + ev["name_id"][rows]]
        if name_ok is not None:
            keep = name_ok[names]
            rows, names = rows[keep], names[keep]
        cols["step"].append(np.full(rows.size, ix.step.step, dtype=np.int64))
        cols["k"].append(np.full(rows.size, k, dtype=np.int64))
        cols["row"].append(rows)
        cols["track"].append(tmap[ev["track_id"][rows]])
        cols["lane"].append(ix.lane[rows].astype(np.int64))
        cols["depth"].append(ix.depth[rows].astype(np.int64))
        cols["start"].append(ev["start_ns"][rows])
        cols["dur"].append(ev["dur_ns"][rows])
        cols["name"].append(names.astype(np.int64))
        cols["kind"].append(ev["kind"][rows].astype(np.int64))
    c = {k: np.concatenate(v) for k, v in cols.items()}
    gkey = (c["track"] * len(LANES) + c["lane"]) * (int(c["depth"].max(initial=0)) + 1)
    gkey = gkey + c["depth"]
    if len(indexes) > 1 or (gkey[1:] < gkey[:-1]).any():
        o = np.lexsort((c["start"], gkey))
        c = {k: v[o] for k, v in c.items()}
        gkey = gkey[o]
    m = gkey.size

    res = int(resolution_ns) if resolution_ns else 0
    if res == 0 and m > max_items:
        res = max(1, (t1 - t0) // max_items)
    truncated = False
    if res:
        res, boxes_fit = _fit_resolution(gkey, c["start"], c["dur"], t0, t1, res, max_items)
        truncated = not boxes_fit
    events, summaries = _level_of_detail(c, gkey, t0, t1, res, max_items)
    truncated = truncated or events.pop("_truncated")

    answer: dict[str, Any] = {
        "origin_ns": int(origin),
        "start_ns": t0 - origin,
        "end_ns": t1 - origin,
        "resolution_ns": res,
        "events_in_window": int(m),
        "truncated": bool(truncated),
        "lanes": list(LANES),
        "kinds": list(KIND_NAMES),
    }
    used = np.unique(np.concatenate([events["name"], summaries["name"]]))
    remap = np.zeros(name_table.size, dtype=np.int64)
    remap[used] = np.arange(used.size)
    answer["names"] = name_table[used].tolist()
    answer["tracks"] = _tracks_answer(indexes, track_maps, info, selected)
    ev_out = {
        "step": events["step"],
        "row": events["row"],
        "track": events["track"],
        "lane": events["lane"],
        "depth": events["depth"],
        "start_ns": events["start"] - origin,
        "dur_ns": events["dur"],
        "name": remap[events["name"]],
        "kind": events["kind"],
    }
    answer["events"] = {k: _jsonable(v) for k, v in ev_out.items()}
    summaries["start_ns"] = summaries["start_ns"] - origin
    summaries["end_ns"] = summaries["end_ns"] - origin
    summaries["name"] = remap[summaries["name"]]
    answer["summaries"] = {k: _jsonable(v) for k, v in summaries.items()}
    answer["flows"] = _flows(indexes, track_maps, events, origin, max_items)
    answer["steps"] = [
        {
            "step": ix.step.step,
            "start_ns": ix.step.start_ns - origin,
            "end_ns": ix.step.end_ns - origin,
        }
        for ix in indexes
    ]
    answer["counters"] = _counters(indexes, t0, t1, res, origin)
    return answer


_EVENT_COLS = ["step", "k", "row", "track", "lane", "depth", "start", "dur", "name", "kind"]


def _box_count(gkey, start, dur, t0, res) -> int:
    """Drawn items at resolution `res`: events >= res, plus one box per (group, bin) of the
    narrower ones (the arrays are sorted by group, then start, so bins ascend in a group)."""
    small = dur < res
    raw = int(small.size - small.sum())
    g, s = gkey[small], start[small]
    if g.size == 0:
        return raw
    b = (s - t0) // res
    new = np.empty(g.size, dtype=bool)
    new[0] = True
    new[1:] = (g[1:] != g[:-1]) | (b[1:] != b[:-1])
    return raw + int(new.sum())


def _fit_resolution(gkey, start, dur, t0, t1, res, max_items) -> tuple[int, bool]:
    """The smallest resolution, from `res` growing geometrically, at which at most
    `max_items` items are drawn. False when even a resolution of twice the window is not
    enough (more rows of long events than max_items)."""
    limit = 2 * (t1 - t0)
    while True:
        n = _box_count(gkey, start, dur, t0, res)
        if n <= max_items:
            return res, True
        if res >= limit:
            return res, False
        # Boxes scale about as 1/res: jump by the overshoot, at least 1.25x.
        res = min(limit, max(res + 1, int(res * max(1.25, min(16.0, n / max_items)))))


def _level_of_detail(c, gkey, t0, t1, res, max_items):
    """Split the window's events into events drawn as themselves and summary boxes."""
    m = gkey.size
    small = c["dur"] < res if res else np.zeros(m, dtype=bool)
    sm = np.flatnonzero(small)
    g, s, e = gkey[sm], c["start"][sm], c["start"][sm] + c["dur"][sm]
    if sm.size:
        b = (s - t0) // res
        new = np.empty(sm.size, dtype=bool)
        new[0] = True
        new[1:] = (g[1:] != g[:-1]) | (b[1:] != b[:-1])
        box = np.cumsum(new) - 1
        first = np.flatnonzero(new)
        count = np.bincount(box)
    else:
        box = first = count = np.zeros(0, dtype=np.int64)
    single = count == 1
    raw_idx = np.sort(np.concatenate([np.flatnonzero(~small), sm[first[single]]]))
    truncated = False
    if raw_idx.size > max_items:
        # More rows of events wider than the whole window than items allowed: keep the longest.
        keep = np.argsort(-c["dur"][raw_idx], kind="stable")[:max_items]
        raw_idx = np.sort(raw_idx[keep])
        truncated = True
    events = {k: c[k][raw_idx] for k in ("step", "row", "track", "lane", "depth", "start")}
    events.update(dur=c["dur"][raw_idx], name=c["name"][raw_idx], kind=c["kind"][raw_idx])
    events["k"] = c["k"][raw_idx]
    events["_truncated"] = truncated

    multi = np.flatnonzero(~single)
    if multi.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        summaries = {
            k: empty
            for k in ("track", "lane", "depth", "start_ns", "end_ns", "count", "busy_ns", "name")
        }
        summaries["name_dur_ns"] = empty
        return events, summaries
    # Union of the members' intervals inside the window, per box: members are sorted by
    # start, so a member adds what lies beyond the furthest end of the earlier ones.
    cs, ce = np.clip(s, t0, t1), np.clip(e, t0, t1)
    reach = pd.Series(ce).groupby(box).cummax().to_numpy()
    prev = np.empty_like(reach)
    prev[1:] = reach[:-1]
    prev[new] = t0
    gain = np.maximum(0, ce - np.maximum(cs, prev))
    busy = np.bincount(box, weights=gain, minlength=first.size)
    start_min = s[first]  # sorted by start within a box
    end_max = np.maximum.reduceat(e, first)
    name_of, name_dur = _dominant_names(box, c["name"][sm], c["dur"][sm])
    at = sm[first]
    summaries = {
        "track": c["track"][at][multi],
        "lane": c["lane"][at][multi],
        "depth": c["depth"][at][multi],
        "start_ns": start_min[multi],
        "end_ns": end_max[multi],
        "count": count[multi],
        "busy_ns": np.rint(busy[multi]).astype(np.int64),
        "name": name_of[multi],
        "name_dur_ns": name_dur[multi],
    }
    return events, summaries


def _dominant_names(box, names, dur) -> tuple[np.ndarray, np.ndarray]:
    """Per box, the name with the largest summed duration (ties: more events, then the
    lowest name index, i.e. the name that sorts first), and that summed duration."""
    o = np.lexsort((names, box))
    b, nm, d = box[o], names[o], dur[o]
    new = np.empty(b.size, dtype=bool)
    new[0] = True
    new[1:] = (b[1:] != b[:-1]) | (nm[1:] != nm[:-1])
    first = np.flatnonzero(new)
    sums = np.add.reduceat(d, first)
    counts = np.diff(np.append(first, b.size))
    pb, pn = b[first], nm[first]
    best = np.lexsort((pn, -counts, -sums, pb))
    keep = np.empty(best.size, dtype=bool)
    keep[0] = True
    keep[1:] = pb[best][1:] != pb[best][:-1]
    chosen = best[keep]
    return pn[chosen], sums[chosen]


def _tracks_answer(indexes, track_maps, info, selected) -> list[dict[str, Any]]:
    lanes: dict[int, dict[str, int]] = {}
    for ix, tmap in zip(indexes, track_maps):
        for (t, ln), rows in ix.rows_of_track_lane.items():
            d = lanes.setdefault(int(tmap[t]), {})
            d[LANES[ln]] = max(d.get(LANES[ln], 0), rows)
    out = []
    for gid in sorted(info):
        if not selected[gid]:
            continue
        t = info[gid]
        out.append(
            {
                "id": gid,
                "kind": t.kind,
                "name": t.name,
                "pid": t.pid,
                "tid": t.tid,
                "device": t.device,
                "stream": t.stream,
                "lanes": lanes.get(gid, {}),
            }
        )
    return out


def _flows(indexes, track_maps, events, origin, max_items) -> dict[str, list]:
    """Launch arrows with at least one end among the drawn events, longest device event
    first, at most max_items // 2 of them."""
    parts = []
    for k, (ix, tmap) in enumerate(zip(indexes, track_maps)):
        ev = ix.step.events
        drawn = events["row"][events["k"] == k]
        device = drawn[ev["launch"][drawn] >= 0]
        pairs = [np.stack([ev["launch"][device].astype(np.int64), device])]
        calls = drawn[np.isin(ev["kind"][drawn], LAUNCH_KINDS)]
        if calls.size:
            a = np.searchsorted(ix.launched_by, calls, side="left")
            b = np.searchsorted(ix.launched_by, calls, side="right")
            n = b - a
            src = np.repeat(calls, n)
            pos = np.repeat(a - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
            pairs.append(np.stack([src, ix.launched_order[pos]]))
        pr = np.concatenate(pairs, axis=1)
        if pr.size == 0:
            continue
        pr = np.unique(pr, axis=1)
        parts.append((k, ix, tmap, pr[0], pr[1]))
    cols: dict[str, list] = {
        k: []
        for k in (
            "from_step",
            "from_row",
            "from_track",
            "from_lane",
            "from_depth",
            "from_ns",
            "to_step",
            "to_row",
            "to_track",
            "to_lane",
            "to_depth",
            "to_ns",
        )
    }
    if not parts:
        return cols
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in cols}
    weight = []
    for _, ix, tmap, src, dst in parts:
        ev = ix.step.events
        for side, rows in (("from", src), ("to", dst)):
            arrays[f"{side}_step"].append(np.full(rows.size, ix.step.step, dtype=np.int64))
            arrays[f"{side}_row"].append(rows)
            arrays[f"{side}_track"].append(tmap[ev["track_id"][rows]])
            arrays[f"{side}_lane"].append(ix.lane[rows].astype(np.int64))
            arrays[f"{side}_depth"].append(ix.depth[rows].astype(np.int64))
            arrays[f"{side}_ns"].append(ev["start_ns"][rows] - origin)
        weight.append(ev["dur_ns"][dst])
    w = np.concatenate(weight)
    keep = np.sort(np.argsort(-w, kind="stable")[: max(1, max_items // 2)])
    return {k: np.concatenate(v)[keep].tolist() for k, v in arrays.items()}


def _counters(indexes, t0, t1, res, origin) -> list[dict[str, Any]]:
    """Counter series in the window (plus the last sample before it), one value per bin."""
    series: dict[tuple, list] = {}
    for ix in indexes:
        for cs in ix.step.counters:
            series.setdefault((cs.name, cs.device), []).append(cs)
    out = []
    for (name, device), parts in series.items():
        ts = np.concatenate([p.ts_ns for p in parts])
        vals = np.concatenate([p.values for p in parts]).astype(np.float64)
        o = np.argsort(ts, kind="stable")
        ts, vals = ts[o], vals[o]
        lo = max(0, int(np.searchsorted(ts, t0, side="left")) - 1)
        hi = int(np.searchsorted(ts, t1, side="left"))
        ts, vals = ts[lo:hi], vals[lo:hi]
        if ts.size and res:
            b = np.maximum((ts - t0) // res, -1)
            new = np.empty(b.size, dtype=bool)
            new[0] = True
            new[1:] = b[1:] != b[:-1]
            first = np.flatnonzero(new)
            ok = ~np.isnan(vals)
            seg = np.cumsum(new) - 1
            n_ok = np.bincount(seg, weights=ok, minlength=first.size)
            total = np.bincount(seg, weights=np.where(ok, vals, 0.0), minlength=first.size)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(n_ok > 0, total / np.maximum(n_ok, 1), np.nan)
            vmin = np.fmin.reduceat(vals, first)
            vmax = np.fmax.reduceat(vals, first)
            ts = ts[first]
        else:
            mean = vmin = vmax = vals
        out.append(
            {
                "name": name,
                "unit": parts[0].unit,
                "source": parts[0].source,
                "device": device,
                "t_ns": (ts - origin).tolist(),
                "value": _jsonable(mean),
                "min": _jsonable(vmin),
                "max": _jsonable(vmax),
            }
        )
    return out


def _attr_value(a, row: int, step: StepData):
    pos = int(np.searchsorted(a.rows, row))
    if pos >= a.rows.size or a.rows[pos] != row:
        return _MISSING
    v = a.values[pos]
    if a.type == "json":
        return json.loads(step.strings[int(v)])
    if a.type == "string":
        return step.strings[int(v)]
    if a.type == "bool":
        return bool(v)
    if a.type == "float64":
        f = float(v)
        return None if math.isnan(f) else f
    return int(v)


_MISSING = object()


def _brief(step: StepData, row: int) -> dict[str, Any]:
    ev = step.events
    return {
        "row": int(row),
        "name": step.strings[int(ev["name_id"][row])],
        "kind": str(KIND_NAMES[ev["kind"][row]]),
        "start_ns": int(ev["start_ns"][row]),
        "dur_ns": int(ev["dur_ns"][row]),
    }


def event_detail(step: StepData | TimelineIndex, row: int) -> dict[str, Any]:
    """Everything about one event (JSON-ready; times in epoch ns, int).

    Keys: step, row, name, kind, category, track {id, kind, name, pid, tid, device,
    stream}, start_ns, end_ns, dur_ns, start_in_step_ns (offset from the step start),
    correlation, external_id, attrs {key: value; JSON lists parsed}, parents (the host op
    tree or python tree ancestors, outermost first, each {row, name, kind, start_ns, dur_ns}),
    children_count (direct children), launched_by (the launching runtime/driver call, for a
    device event), launches (device events launched by a runtime/driver call), owning_op (the
    innermost cpu_op around the event, or around its launching call for device work;
    itself for a cpu_op: METRICS.md "Time"), or None where there is none.
    """
    index = step if isinstance(step, TimelineIndex) else None
    step = index.step if index else step
    ev = step.events
    n = step.num_events
    if not 0 <= row < n:
        raise IndexError(f"step {step.step} has no event row {row} (it has {n})")
    row = int(row)
    kind = str(KIND_NAMES[ev["kind"][row]])
    t = step.tracks[int(ev["track_id"][row])]
    parents = []
    p = int(ev["parent"][row])
    while p >= 0:
        parents.append(_brief(step, p))
        p = int(ev["parent"][p])
    parents.reverse()
    launch = int(ev["launch"][row])
    if ev["kind"][row] in LAUNCH_KINDS:
        launched = index.launched_rows(row) if index else np.flatnonzero(ev["launch"] == row)
    else:
        launched = np.zeros(0, dtype=np.int64)
    # Owning op: climb from the event (or its launching call) to the first cpu_op.
    cur = launch if launch >= 0 else row
    if launch < 0 and ev["kind"][row] in DEVICE_KINDS:
        cur = -1
    while cur >= 0 and ev["kind"][cur] != KIND["cpu_op"]:
        cur = int(ev["parent"][cur])
    attrs = {}
    for a in step.attrs:
        v = _attr_value(a, row, step)
        if v is not _MISSING:
            attrs[a.key] = v
    return {
        "step": step.step,
        "row": row,
        "name": step.strings[int(ev["name_id"][row])],
        "kind": kind,
        "category": step.strings[int(ev["cat_id"][row])],
        "track": {
            "id": t.id,
            "kind": t.kind,
            "name": t.name,
            "pid": t.pid,
            "tid": t.tid,
            "device": t.device,
            "stream": t.stream,
        },
        "start_ns": int(ev["start_ns"][row]),
        "end_ns": int(ev["start_ns"][row] + ev["dur_ns"][row]),
        "dur_ns": int(ev["dur_ns"][row]),
        "start_in_step_ns": int(ev["start_ns"][row] - step.start_ns),
        "correlation": int(ev["correlation"][row]),
        "external_id": int(ev["external_id"][row]),
        "attrs": attrs,
        "parents": parents,
        "children_count": int(np.count_nonzero(ev["parent"] == row)),
        "launched_by": _brief(step, launch) if launch >= 0 else None,
        "launches": [_brief(step, int(r)) for r in launched],
        "owning_op": _brief(step, cur) if cur >= 0 else None,
    }
