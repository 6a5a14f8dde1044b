"""Steps -> one Chrome trace / Perfetto JSON file (`traceEvents`, the Trace Event Format).

What the file holds:

- one process per host process (its numeric pid) and one per GPU ("GPU d", a synthetic pid),
  named with `process_name` metadata; one thread per host thread and per device stream,
  named with `thread_name` metadata and ordered with `thread_sort_index`;
- every event as a complete event (`ph` "X", `ts` and `dur`), marks and `[memory]` events as
  thread-scoped instants (`ph` "i", `s` "t"); args: the event's kind, step, correlation and
  every attribute it has (shapes, grid, block, ...);
- a flow arrow (`ph` "s" at the launching runtime/driver call, `ph` "f" with `bp` "e" at the
  device event, category `ac2g`) for every kernel, memcpy, memset and NCCL kernel that has a
  launch link;
- counter tracks (`ph` "C") for NVML and user counters (NaN samples are left out: not
  measured);
- a "Steps" thread with one slice per step span.

Timestamps are µs relative to `otherData.base_time_ns` (epoch ns), written with three
decimals so every nanosecond survives (an absolute epoch in µs would not fit a double's
precision).

Strict nesting. Perfetto (and Chrome) draw the slices of one thread as a stack: two slices
of a thread must be disjoint or nested. Profiler traces break that (python frames recorded
with `with_stack` overlap `record_function` ranges; clocks of different sources disagree by
a few µs). No timestamp is changed here: an event that would partially overlap an open slice
of its thread goes to the first sub-track ("<thread> (overlap k)", a separate `tid` of the
same process, sorted right below the thread) where it nests. Events are assigned in (start,
longer first) order, so the outermost events stay on the thread itself.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

import msgspec
import numpy as np

from tessera_tb.trace.atomic import write_bytes_atomic
from tessera_tb.trace.step import DEVICE_WORK_KINDS, KIND, KIND_NAMES, StepData

INSTANT_KINDS = {KIND["mark"], KIND["memory"]}
FLOW_CATEGORY = "ac2g"
_SYNTHETIC_BASE = 1_000_000_000  # pids/tids made up for GPUs, labels and sub-tracks


class _Ids:
    """Chrome pids/tids for tracks, and their metadata events."""

    def __init__(self, process_name: str | None):
        self.process_name = process_name
        self.next_id = _SYNTHETIC_BASE
        self.pids: dict[str, int] = {}
        self.tids: dict[tuple, tuple[int, int]] = {}
        self.meta: list[dict] = []
        self.used_pids: set[int] = set()

    def _new(self) -> int:
        self.next_id += 1
        return self.next_id

    def pid(self, key: str, name: str, sort_index: int) -> int:
        pid = self.pids.get(key)
        if pid is None:
            numeric = key.removeprefix("host:")
            pid = int(numeric) if key.startswith("host:") and numeric.isdigit() else self._new()
            if pid in self.used_pids:
                pid = self._new()
            self.pids[key] = pid
            self.used_pids.add(pid)
            self.meta.append(_meta("process_name", pid, 0, {"name": name}))
            self.meta.append(_meta("process_sort_index", pid, 0, {"sort_index": sort_index}))
        return pid

    def thread(self, key: tuple, pid: int, tid_text: str, name: str, sort_index: int) -> int:
        found = self.tids.get(key)
        if found is None:
            tid = int(tid_text) if tid_text.isdigit() else self._new()
            if any(p == pid and t == tid for p, t in self.tids.values()):
                tid = self._new()
            self.tids[key] = (pid, tid)
            self.meta.append(_meta("thread_name", pid, tid, {"name": name}))
            self.meta.append(_meta("thread_sort_index", pid, tid, {"sort_index": sort_index}))
            return tid
        return found[1]


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _us(offset_ns: np.ndarray) -> list[float]:
    """ns offsets -> µs floats whose shortest repr has 3 exact decimals."""
    return (np.asarray(offset_ns, dtype=np.int64) / 1000.0).tolist()


def _assign_lanes(start: np.ndarray, end: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Sub-track per event (0 = the thread itself) so that each lane strictly nests."""
    lanes = np.zeros(start.size, dtype=np.int64)
    stacks: list[list[int]] = []  # per lane: ends of the open slices
    s_list, e_list = start[order].tolist(), end[order].tolist()
    for pos, (s, e) in enumerate(zip(s_list, e_list)):
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lanes[order[pos]] = lane
                break
        else:
            stacks.append([e])
            lanes[order[pos]] = len(stacks) - 1
    return lanes


def _attr_args(step: StepData) -> list[dict]:
    """Per event row, its attributes as trace args (JSON attributes stay raw JSON)."""
    args: list[dict] = [{} for _ in range(step.num_events)]
    for a in step.attrs:
        if a.type in ("string", "json"):
            texts = step.string_values(a.values).tolist()
            values = [msgspec.Raw(t.encode()) for t in texts] if a.type == "json" else texts
        elif a.type == "bool":
            values = a.values.astype(bool).tolist()
        elif a.type == "float64":
            values = [v if math.isfinite(v) else None for v in a.values.tolist()]
        else:
            values = a.values.tolist()
        for row, value in zip(a.rows.tolist(), values):
            args[row][a.key] = value
    return args


def chrome_trace(
    steps: Iterable[StepData], *, process_name: str | None = None, step_slices: bool = True
) -> dict:
    """The Chrome trace object (a dict with `traceEvents`) of the steps, in step order.

    `step_slices` adds the "Steps" thread (one slice per step span).
    """
    ids = _Ids(process_name)
    parts = []
    base_ns = None
    for step in steps:
        ev = step.events
        first = int(min(step.start_ns, ev["start_ns"].min())) if step.num_events else step.start_ns
        base_ns = first if base_ns is None else min(base_ns, first)
        parts.append(step)
    if base_ns is None:
        return {"traceEvents": [], "otherData": {"base_time_ns": 0}}

    host_pids = [t.pid for s in parts for t in s.tracks if t.kind == "host_thread"]
    main_pid = max(set(host_pids), key=host_pids.count) if host_pids else ""

    # Global arrays over every step: one row per event.
    cols = {k: [] for k in ("start", "end", "kind", "name", "cat", "track", "step", "launch")}
    args: list[dict] = []
    track_keys: list[tuple] = []
    track_index: dict[tuple, int] = {}
    track_info: list = []
    offset = 0
    for step in parts:
        ev = step.events
        local = np.empty(len(step.tracks), dtype=np.int64)
        for t in step.tracks:
            key = (
                ("device", t.device, t.stream)
                if t.kind == "device_stream"
                else ("thread", t.pid, t.tid)
            )
            if key not in track_index:
                track_index[key] = len(track_keys)
                track_keys.append(key)
                track_info.append(t)
            local[t.id] = track_index[key]
        cols["start"].append(ev["start_ns"])
        cols["end"].append(ev["start_ns"] + ev["dur_ns"])
        cols["kind"].append(ev["kind"])
        cols["name"].append(step.string_values(ev["name_id"]))
        cols["cat"].append(step.string_values(ev["cat_id"]))
        cols["track"].append(local[ev["track_id"]])
        cols["step"].append(np.full(step.num_events, step.step, dtype=np.int64))
        cols["launch"].append(np.where(ev["launch"] >= 0, ev["launch"] + offset, -1))
        row_args = _attr_args(step)
        for i, (k, s) in enumerate(zip(ev["kind"].tolist(), ev["correlation"].tolist())):
            row_args[i]["kind"] = KIND_NAMES[k]
            row_args[i]["step"] = step.step
            if s:
                row_args[i]["correlation"] = s
        args.extend(row_args)
        offset += step.num_events
    a = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    n = a["start"].size

    # Processes and threads, then sub-tracks where nesting breaks.
    pid_of_track = np.zeros(len(track_keys), dtype=np.int64)
    for i, (key, t) in enumerate(zip(track_keys, track_info)):
        if key[0] == "device":
            pid_of_track[i] = ids.pid(f"device:{t.device}", f"GPU {t.device}", 1000 + t.device)
        elif t.pid == main_pid or (t.pid.isdigit() and t.kind == "host_thread"):
            label = process_name if (process_name and t.pid == main_pid) else f"process {t.pid}"
            pid_of_track[i] = ids.pid(f"host:{t.pid}", label, 0)
        else:
            pid_of_track[i] = ids.pid(f"label:{t.pid}", t.pid or "other", 2000)
    instant = np.isin(a["kind"], list(INSTANT_KINDS))
    lanes = np.zeros(n, dtype=np.int64)
    order = np.lexsort((a["start"] - a["end"], a["start"], a["track"]))
    sliced = order[~instant[order]]
    bounds = np.searchsorted(a["track"][sliced], np.arange(len(track_keys) + 1))
    for i in range(len(track_keys)):
        rows = sliced[bounds[i] : bounds[i + 1]]
        if rows.size:
            lanes[rows] = _assign_lanes(a["start"][rows], a["end"][rows], np.arange(rows.size))
    tid = np.zeros(n, dtype=np.int64)
    pid = pid_of_track[a["track"]]
    for i, (key, t) in enumerate(zip(track_keys, track_info)):
        mine = a["track"] == i
        for lane in np.unique(lanes[mine]).tolist():
            name = t.name if lane == 0 else f"{t.name} (overlap {lane})"
            tid_text = (str(t.stream) if key[0] == "device" else t.tid) if lane == 0 else ""
            sort_index = int(t.sort_index) * 100 + lane
            tid[mine & (lanes == lane)] = ids.thread(
                key + (lane,), int(pid_of_track[i]), tid_text, name, sort_index
            )

    # Events, in (track, lane, start, longer first) order: a parent precedes its children.
    ts = _us(a["start"] - base_ns)
    dur = _us(a["end"] - a["start"])
    names, cats = a["name"].tolist(), a["cat"].tolist()
    pid_l, tid_l, inst_l = pid.tolist(), tid.tolist(), instant.tolist()
    out: list[dict] = []
    for r in np.lexsort((a["start"] - a["end"], a["start"], lanes, a["track"])).tolist():
        e = {"ph": "X", "name": names[r], "cat": cats[r], "pid": pid_l[r], "tid": tid_l[r],
             "ts": ts[r], "dur": dur[r], "args": args[r]}  # fmt: skip
        if inst_l[r]:
            e["ph"] = "i"
            e["s"] = "t"
            del e["dur"]
        out.append(e)

    # Launch flows: runtime/driver call -> device event.
    launched = np.flatnonzero(np.isin(a["kind"], DEVICE_WORK_KINDS) & (a["launch"] >= 0))
    for flow_id, r in enumerate(launched.tolist(), start=1):
        call = int(a["launch"][r])
        out.append({"ph": "s", "id": flow_id, "cat": FLOW_CATEGORY, "name": "launch",
                    "pid": pid_l[call], "tid": tid_l[call], "ts": ts[call]})  # fmt: skip
        out.append({"ph": "f", "bp": "e", "id": flow_id, "cat": FLOW_CATEGORY, "name": "launch",
                    "pid": pid_l[r], "tid": tid_l[r], "ts": ts[r]})  # fmt: skip

    # Counters, and the step spans.
    host_pid = ids.pid(f"host:{main_pid}", process_name or f"process {main_pid}", 0)
    for step in parts:
        for c in step.counters:
            if c.device >= 0:
                cpid = ids.pid(f"device:{c.device}", f"GPU {c.device}", 1000 + c.device)
            else:
                cpid = host_pid
            label = f"{c.name} ({c.unit})" if c.unit else c.name
            values = np.asarray(c.values, dtype=np.float64)
            keep = np.isfinite(values)
            for t_us, v in zip(_us(np.asarray(c.ts_ns)[keep] - base_ns), values[keep].tolist()):
                out.append({"ph": "C", "name": label, "pid": cpid, "ts": t_us,
                            "args": {c.name: v}})  # fmt: skip
    steps_tid = ids.thread(("steps",), host_pid, "", "Steps", -1) if step_slices else 0
    for step in parts if step_slices else []:
        out.append({"ph": "X", "name": f"Step {step.step}", "cat": "step", "pid": host_pid,
                    "tid": steps_tid, "ts": _us(np.array([step.start_ns - base_ns]))[0],
                    "dur": _us(np.array([step.end_ns - step.start_ns]))[0],
                    "args": {"step": step.step}})  # fmt: skip
    return {
        "traceEvents": ids.meta + out,
        "displayTimeUnit": "ms",
        "otherData": {"base_time_ns": int(base_ns), "exporter": "tessera"},
    }


def export_chrome_trace(
    steps: Iterable[StepData],
    path: str,
    *,
    process_name: str | None = None,
    step_slices: bool = True,
) -> str:
    """Write the steps as a Chrome/Perfetto trace JSON file (atomically); returns the path."""
    trace = chrome_trace(steps, process_name=process_name, step_slices=step_slices)
    data = msgspec.json.encode(trace)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    write_bytes_atomic(path, data)
    return path
