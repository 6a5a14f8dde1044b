"""Device memory from the allocator's `[memory]` events (METRICS.md, "Derived kernel figures":
memory): allocated and reserved bytes over time, the peak with the op (and python stack) active
at it, and the allocation table.

A `[memory]` event is an instant on the host thread that called the allocator, with args
`Total Allocated` and `Total Reserved` (bytes on that device after the event), `Bytes` (size,
negative for a free), `Device Type` (1 = CUDA, 0 = CPU), `Device Id` and `Addr`.

What METRICS.md leaves open, defined here:

- A device is (device_type, device_id); CPU allocations are reported too, as device_type 0.
- The op active at an event is the innermost cpu op of the host op tree on the event's thread
  whose interval contains the event's timestamp (start <= ts <= end; the innermost is the one
  that started last, on equal starts the shorter), searched in the event's step file. The
  stack is the python frames (with_stack) on that thread containing the timestamp, outermost
  first, searched in the step files of the span up to the event's; empty when stacks were not
  recorded.
- The peak is the first event with the highest `Total Allocated` of the device.
- An allocation (Bytes > 0) is freed by the next event of the same device and address with
  Bytes < 0, if it comes before the next allocation of that address; otherwise (freed after the
  data ends, or the free was not recorded) free_ts_ns and lifetime_ns are null. Events at one
  address are ordered by timestamp, then by their order in the step files.
- Memory events are not clipped to step spans: every event of the selected step files counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from tessera_tb.backend.selection import iter_selected
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import HOST_TREE_KINDS, KIND, StepData, empty_events

CUDA_DEVICE_TYPE = 1


def _attr_values(step: StepData, key: str, rows: np.ndarray) -> pd.arrays.IntegerArray:
    """An integer attribute on `rows` as a nullable Int64 array (NA where absent)."""
    values = np.zeros(rows.size, dtype=np.int64)
    present = np.zeros(rows.size, dtype=bool)
    a = step.attrs_by_key.get(key)
    if a is not None and a.rows.size:
        pos = np.minimum(np.searchsorted(a.rows, rows), a.rows.size - 1)
        present = a.rows[pos] == rows
        values[present] = a.values[pos[present]]
    return pd.arrays.IntegerArray(values, ~present)


def innermost_containing(
    step: StepData, kinds: np.ndarray, track: np.ndarray, ts_ns: np.ndarray
) -> np.ndarray:
    """For each (track, ts) query: the row of the innermost event of `kinds` on that track
    whose interval contains ts (start <= ts <= end), climbing the `parent` column; -1 if none.

    `kinds` must be the kinds of one tree (the host op tree or the python tree). Per track,
    the last event starting at or before ts is found by binary search; if it ended before ts,
    its ancestors are tried, one tree level per pass for all queries at once.
    """
    ev = step.events
    start, dur, parent = ev["start_ns"], ev["dur_ns"], ev["parent"]
    end = start + dur
    out = np.full(ts_ns.size, -1, dtype=np.int64)
    rows = np.flatnonzero(np.isin(ev["kind"], kinds))
    for t in np.unique(track).tolist():
        q = np.flatnonzero(track == t)
        cand = rows[ev["track_id"][rows] == t]
        if not cand.size:
            continue
        # Start ascending, then longer first: the last candidate at a start is the innermost.
        cand = cand[np.lexsort((-dur[cand], start[cand]))]
        pos = np.searchsorted(start[cand], ts_ns[q], "right") - 1
        node = np.where(pos >= 0, cand[np.maximum(pos, 0)], -1).astype(np.int64)
        active = np.flatnonzero(node >= 0)
        while active.size:
            ok = end[node[active]] >= ts_ns[q[active]]
            active = active[~ok]
            node[active] = parent[node[active]]
            active = active[node[active] >= 0]
        out[q] = node
    return out


def _innermost_op(step: StepData, track: np.ndarray, ts_ns: np.ndarray) -> np.ndarray:
    """Innermost cpu op containing each (track, ts): the host-tree node, then up to a cpu_op."""
    node = innermost_containing(step, HOST_TREE_KINDS, track, ts_ns)
    kind, parent = step.events["kind"], step.events["parent"]
    active = np.flatnonzero(node >= 0)
    active = active[kind[node[active]] != KIND["cpu_op"]]
    while active.size:
        node[active] = parent[node[active]]
        active = active[node[active] >= 0]
        active = active[kind[node[active]] != KIND["cpu_op"]]
    return node


def memory_events(step: StepData) -> pd.DataFrame:
    """The step's `[memory]` events, one row each, in timestamp order (then file order).

    Columns: ts_ns (epoch ns), device_type, device_id, bytes (negative = free), allocated_bytes
    (`Total Allocated`), reserved_bytes (`Total Reserved`), addr (the last three nullable Int64:
    the 2021 format records none of them), track_id, row (event row), op (innermost cpu op,
    "" when none), op_row (-1 when none).
    """
    ev = step.events
    rows = np.flatnonzero(ev["kind"] == KIND["memory"])
    ts = ev["start_ns"][rows]
    track = ev["track_id"][rows]
    op_row = _innermost_op(step, track, ts)
    op = np.full(rows.size, "", dtype=object)
    has_op = op_row >= 0
    op[has_op] = step.string_values(ev["name_id"][op_row[has_op]])
    df = pd.DataFrame(
        {
            "ts_ns": ts,
            "device_type": _attr_values(step, "Device Type", rows).fillna(-1).astype(np.int64),
            "device_id": _attr_values(step, "Device Id", rows).fillna(-1).astype(np.int64),
            "bytes": _attr_values(step, "Bytes", rows).fillna(0).astype(np.int64),
            "allocated_bytes": _attr_values(step, "Total Allocated", rows),
            "reserved_bytes": _attr_values(step, "Total Reserved", rows),
            "addr": _attr_values(step, "Addr", rows),
            "track_id": track,
            "row": rows,
            "op": op,
            "op_row": op_row,
        }
    )
    return df.sort_values(["ts_ns", "row"], kind="stable").reset_index(drop=True)


def python_stack(files: Sequence[StepData], pid: str, tid: str, ts_ns: int) -> list[str]:
    """Python frames (with_stack) of thread (pid, tid) whose interval contains ts_ns, outermost
    first (start ascending, longer first); [] when stacks were not recorded.

    Searched by containment over `files`, not through the `parent` column: the outer frames
    (`<module>`, the training loop) start in an earlier step file, and parent links never
    cross step files. Pass the step file of the event and the earlier ones of its span.
    """
    starts, durs, names = [], [], []
    for step in files:
        ev = step.events
        track = [t.id for t in step.tracks if (t.pid, t.tid) == (pid, tid)]
        m = (ev["kind"] == KIND["python"]) & np.isin(ev["track_id"], track)
        m &= (ev["start_ns"] <= ts_ns) & (ev["start_ns"] + ev["dur_ns"] >= ts_ns)
        starts.append(ev["start_ns"][m])
        durs.append(ev["dur_ns"][m])
        names.append(step.string_values(ev["name_id"][m]))
    start, dur, name = (np.concatenate(x) for x in (starts, durs, names))
    return [str(n) for n in name[np.lexsort((-dur, start))]]


def _stack_at(run: Run, worker: str, step_number: int, track_id: int, ts_ns: int) -> list[str]:
    """`python_stack` of a memory event: searches the earlier step files of the event's span
    only when its own file has python frames on that thread."""
    step = run.load_step(worker, step_number)
    t = step.tracks[track_id]
    if not python_stack([step], t.pid, t.tid, ts_ns):
        return []
    earlier = [run.load_step(worker, s) for s in run.worker(worker).steps if s < step_number]
    files = [s for s in earlier if s.span_index == step.span_index] + [step]
    return python_stack(files, t.pid, t.tid, ts_ns)


def _selected_events(
    run: Run, workers: Iterable[str] | None, steps: Iterable[int] | None
) -> pd.DataFrame:
    """`memory_events` of the selection with worker, step and span_index columns, in time
    order per worker, plus net_bytes: the running sum of `bytes` per (worker, span, device)
    from the first event of the selection in that span (spans are separate profiling
    windows: what was allocated between them is unknown)."""
    parts = []
    for worker, step in iter_selected(run, workers, steps):
        df = memory_events(step)
        df.insert(0, "span_index", step.span_index)
        df.insert(0, "step", step.step)
        df.insert(0, "worker", worker)
        parts.append(df)
    if not parts:
        empty = memory_events(_EMPTY_STEP)
        parts.append(empty.assign(worker="", step=0, span_index=0).iloc[:0])
    out = pd.concat(parts, ignore_index=True)
    out = out.sort_values(["worker", "ts_ns", "step", "row"], kind="stable").reset_index(drop=True)
    group = ["worker", "span_index", "device_type", "device_id"]
    out["net_bytes"] = out.groupby(group)["bytes"].cumsum()
    return out


_EMPTY_STEP = StepData(0, 0, 0, [""], [], {k: v[:0] for k, v in empty_events().items()})


def memory_timeline(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> pd.DataFrame:
    """Allocated and reserved bytes over time, per worker and device; `steps=None` = all.

    Columns: worker, device_type, device_id, ts_ns, step, allocated_bytes, reserved_bytes
    (nullable: absent from the 2021 format), bytes (the change at this event; negative = a
    free), net_bytes (running sum of bytes from the first event of the selection in the same
    profiling span: allocated bytes relative to the unknown amount before it; the only curve
    when `Total Allocated` is not recorded). One row per `[memory]` event, in time order per
    (worker, device).
    """
    ev = _selected_events(run, workers, steps)
    cols = ["worker", "device_type", "device_id", "ts_ns", "step", "allocated_bytes"]
    cols += ["reserved_bytes", "bytes", "net_bytes"]
    return (
        ev[cols]
        .sort_values(["worker", "device_type", "device_id"], kind="stable")
        .reset_index(drop=True)
    )


PEAK_COLUMNS = [
    "worker",
    "device_type",
    "device_id",
    "basis",
    "peak_allocated_bytes",
    "peak_net_bytes",
    "peak_ts_ns",
    "peak_step",
    "op",
    "stack",
    "peak_reserved_bytes",
]


def memory_peaks(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> pd.DataFrame:
    """The allocated-bytes peak per worker and device over the selection (`steps=None` = all).

    Columns: worker, device_type, device_id, basis ("total_allocated": the peak is the first
    event with the highest `Total Allocated`; "net_bytes": the trace has no `Total Allocated`,
    the peak is the highest net_bytes, see `memory_timeline`), peak_allocated_bytes (null
    without `Total Allocated`), peak_net_bytes, peak_ts_ns, peak_step, op (innermost cpu op at
    the peak, "" when none), stack (python frames, outermost first, joined by " > "; "" when
    stacks were not recorded), peak_reserved_bytes (the highest `Total Reserved` of the device
    at any time; null when not recorded).
    """
    ev = _selected_events(run, workers, steps)
    rows = []
    for (worker, dtype, did), g in ev.groupby(["worker", "device_type", "device_id"], sort=True):
        allocated = g["allocated_bytes"]
        basis = "total_allocated" if allocated.notna().any() else "net_bytes"
        curve = allocated if basis == "total_allocated" else g["net_bytes"]
        # First of equal maxima; NA (absent) never wins.
        i = int(np.argmax(curve.astype("Float64").fillna(-np.inf).to_numpy(dtype=float)))
        peak = g.iloc[i]
        stack = _stack_at(run, worker, int(peak["step"]), int(peak["track_id"]), int(peak["ts_ns"]))
        reserved = g["reserved_bytes"].max()
        rows.append(
            {
                "worker": worker,
                "device_type": int(dtype),
                "device_id": int(did),
                "basis": basis,
                "peak_allocated_bytes": peak["allocated_bytes"],
                "peak_net_bytes": int(peak["net_bytes"]),
                "peak_ts_ns": int(peak["ts_ns"]),
                "peak_step": int(peak["step"]),
                "op": peak["op"],
                "stack": " > ".join(stack),
                "peak_reserved_bytes": reserved,
            }
        )
    out = pd.DataFrame(rows, columns=PEAK_COLUMNS)
    for c in ("peak_allocated_bytes", "peak_reserved_bytes"):
        out[c] = out[c].astype("Int64")
    return out


def allocation_table(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> pd.DataFrame:
    """One row per allocation (an event with bytes > 0) over the selection (`steps=None` = all).

    Columns: worker, device_type, device_id, addr, size_bytes, op (innermost cpu op at the
    allocation), alloc_ts_ns, alloc_step, free_ts_ns, free_step, lifetime_ns (nullable Int64:
    null when not freed within the data, or when the trace records no `Addr`; matching rule
    in the module docstring).
    """
    ev = _selected_events(run, workers, steps)
    key_cols = ["worker", "device_type", "device_id", "addr"]
    ev = ev.sort_values(key_cols + ["ts_ns", "step", "row"], kind="stable").reset_index(drop=True)
    n = len(ev)
    size = ev["bytes"].to_numpy()
    has_addr = ev["addr"].notna().to_numpy()
    addr = ev["addr"].fillna(0).to_numpy(dtype=np.int64)
    same_next = np.zeros(n, dtype=bool)  # same (worker, device, addr) as the next row
    if n > 1:
        same_next[:-1] = has_addr[:-1] & has_addr[1:] & (addr[:-1] == addr[1:])
        for c in ("worker", "device_type", "device_id"):
            col = ev[c].to_numpy()
            same_next[:-1] &= col[:-1] == col[1:]
    # The event right after an allocation at its address decides: a free matches it; another
    # allocation (or nothing) means its free is not in the data.
    is_alloc = size > 0
    nxt = np.minimum(np.arange(n) + 1, max(n - 1, 0))
    freed = is_alloc & same_next
    freed[freed] = size[nxt[freed]] < 0
    alloc = np.flatnonzero(is_alloc)
    free = nxt[alloc]
    has_free = freed[alloc]
    ts = ev["ts_ns"].to_numpy()
    step = ev["step"].to_numpy()
    free_ts = pd.arrays.IntegerArray(ts[free] if n else ts[:0], ~has_free)
    free_step = pd.arrays.IntegerArray(step[free].astype(np.int64) if n else ts[:0], ~has_free)
    out = pd.DataFrame(
        {
            "worker": ev["worker"].to_numpy()[alloc],
            "device_type": ev["device_type"].to_numpy()[alloc],
            "device_id": ev["device_id"].to_numpy()[alloc],
            "addr": ev["addr"].array[alloc],
            "size_bytes": size[alloc],
            "op": ev["op"].to_numpy()[alloc],
            "alloc_ts_ns": ts[alloc],
            "alloc_step": step[alloc],
            "free_ts_ns": free_ts,
            "free_step": free_step,
        }
    )
    out["lifetime_ns"] = out["free_ts_ns"] - out["alloc_ts_ns"]
    return out.sort_values(["worker", "alloc_ts_ns"], kind="stable").reset_index(drop=True)


# Level of detail of the curves: the timeline's rule (backend/timeline.py) and its cap.
DEFAULT_MAX_POINTS = 5000


def curve_level_of_detail(
    curves: pd.DataFrame, t0_ns: int, t1_ns: int, max_points: int = DEFAULT_MAX_POINTS
) -> tuple[pd.DataFrame, int]:
    """The rows of `memory_timeline` to draw, and the resolution used (ns; 0: every row).

    At most `max_points` rows: every row while they fit; otherwise the window [t0_ns, t1_ns)
    is cut into bins of r ns (as the timeline's level of detail), r the smallest that fits, and
    each (worker, device) keeps, per bin, its first and last row and the rows of its highest
    and lowest allocated bytes (net bytes where allocated is not recorded): every peak is
    drawn at its height and time, and the curve between bins is the same step function.
    """
    if max_points < 4:
        raise ValueError("max_points must be at least 4")
    n = len(curves)
    if n <= max_points:
        return curves, 0
    series = curves.groupby(["worker", "device_type", "device_id"], sort=False).ngroup()
    n_series = int(series.max()) + 1
    bins = max(1, max_points // (4 * n_series))
    res = max(1, -(-(int(t1_ns) - int(t0_ns)) // bins))
    b = np.clip((curves["ts_ns"].to_numpy(dtype=np.int64) - int(t0_ns)) // res, 0, bins - 1)
    value = curves["allocated_bytes"].astype("Float64").fillna(curves["net_bytes"]).astype(float)
    df = pd.DataFrame({"s": series.to_numpy(), "b": b, "v": value.to_numpy(), "pos": np.arange(n)})
    g = df.groupby(["s", "b"], sort=False)
    keep = np.unique(
        np.concatenate(
            [
                g["pos"].first().to_numpy(),
                g["pos"].last().to_numpy(),
                df.loc[g["v"].idxmax(), "pos"].to_numpy(),
                df.loc[g["v"].idxmin(), "pos"].to_numpy(),
            ]
        )
    )
    return curves.iloc[keep].reset_index(drop=True), res
