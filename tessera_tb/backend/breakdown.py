"""Step time breakdown (METRICS.md, "Time": step time breakdown).

Every instant of a step span goes to exactly one category, by priority:

    compute > collective > memcpy > memset > runtime > dataloader > host_other > idle

The device categories look at every device stream of the worker (an instant is `compute` when
any of its devices runs a compute kernel). The host categories look only at the step's
*launching threads*: host threads with at least one runtime/driver call in the step that has
device work linked to it (the `launch` column). Threads that launch no GPU work, such as NCCL's
watchdog, the profiler's own threads or an NVML sampler, never count.

What METRICS.md leaves open, defined here:

- `compute`: `kernel` events (NCCL kernels are `collective`, never `compute`);
  `gpu_annotation` labels and CUPTI range-profiler events are not device work.
- `runtime`: every `runtime`/`driver` call on a launching thread, launches and synchronising
  calls alike.
- `dataloader`: `cpu_op`, `annotation` or `region` events on a launching thread whose name starts
  with `enumerate(DataLoader)` (the 2021 format records it as a cpu op, newer ones as a user
  annotation), or whose name is one of the caller's `data_regions` (exact match).
- `host_other`: any other `cpu_op`, `annotation` or `region` event on a launching thread, except
  the step markers (`ProfilerStep#N`), which cover the whole step and are a boundary, not work.
  Python frames (`with_stack`) are not counted: the outermost frames cover the whole program, and
  the breakdown must not depend on whether stacks were recorded.
- `idle`: the rest: no device work and no recorded host range on a launching thread.
- Which events: those of the step file and those of the neighbouring step files that overlap
  the span (`window_events`): events are filed by host start, so when the host starts step
  N+1 while the GPU still runs step N's tail, step N+1's first host ops lie inside span N.

Events are clipped to the step span `[start_ns, end_ns)`; all figures are integer ns and the
categories sum to `span_ns` exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from tessera_tb.backend.selection import resolve_steps, resolve_workers, steady_state_step
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import KIND, LAUNCH_KINDS, StepData

CATEGORIES = (
    "compute",
    "collective",
    "memcpy",
    "memset",
    "runtime",
    "dataloader",
    "host_other",
    "idle",
)
DATALOADER_PREFIX = "enumerate(DataLoader)"
STEP_MARKER_PREFIX = "ProfilerStep#"

DEVICE_CATEGORY_KINDS = {
    "compute": KIND["kernel"],
    "collective": KIND["collective"],
    "memcpy": KIND["memcpy"],
    "memset": KIND["memset"],
}
_HOST_RANGE_KINDS = np.array([KIND["cpu_op"], KIND["annotation"], KIND["region"]], dtype=np.uint8)

Intervals = tuple[np.ndarray, np.ndarray]  # (starts_ns, ends_ns), int64


def priority_cover_ns(lo: int, hi: int, categories: Sequence[Intervals]) -> np.ndarray:
    """Assign every instant of `[lo, hi)` to the first category (in order) whose intervals
    cover it; the last element is the time no category covers. Integer ns, sums to hi - lo.

    A sweep over the sorted interval boundaries: between two consecutive boundaries the set
    of covering categories is constant, and a category covers a point x when more of its
    intervals start at or before x than end at or before x. No Python loop over intervals.
    """
    lo, hi = int(lo), int(hi)
    out = np.zeros(len(categories) + 1, dtype=np.int64)
    if hi <= lo:
        return out
    clipped = []
    for starts, ends in categories:
        s = np.clip(np.asarray(starts, dtype=np.int64), lo, hi)
        e = np.clip(np.asarray(ends, dtype=np.int64), lo, hi)
        keep = e > s
        clipped.append((np.sort(s[keep]), np.sort(e[keep])))
    bounds = np.unique(
        np.concatenate([np.array([lo, hi], dtype=np.int64)] + [x for pair in clipped for x in pair])
    )
    seg_start, seg_len = bounds[:-1], np.diff(bounds)
    top = np.full(seg_start.size, len(categories), dtype=np.int64)
    for c in range(len(categories) - 1, -1, -1):
        s, e = clipped[c]
        if not s.size:
            continue
        active = np.searchsorted(s, seg_start, "right") - np.searchsorted(e, seg_start, "right")
        top[active > 0] = c
    for c in range(len(categories) + 1):
        out[c] = int(seg_len[top == c].sum())
    return out


def launching_threads(step: StepData) -> set[tuple[str, str]]:
    """(pid, tid) of the host threads that launch GPU work in the step: threads with a
    runtime/driver call that some device event's `launch` column points to."""
    ev = step.events
    launch = ev["launch"]
    launchers = launch[launch >= 0]
    launchers = launchers[np.isin(ev["kind"][launchers], LAUNCH_KINDS)]
    tracks = np.unique(ev["track_id"][launchers])
    return {(step.tracks[t].pid, step.tracks[t].tid) for t in tracks.tolist()}


def window_events(
    step: StepData, neighbours: Sequence[StepData] = (), data_regions: Iterable[str] = ()
) -> dict[str, np.ndarray]:
    """The events that can occupy the step span: the step's own, plus those of its
    neighbouring step files that overlap the span (module docstring, "Which events").

    Columns, one value per event: start_ns, end_ns, kind, device (-1 off device streams),
    on_launcher (on a launching thread of `step`, matched by (pid, tid): track ids are per
    file), host_range (a cpu_op/annotation/region on a launching thread), dataloader and
    step_marker (host ranges named as in the module docstring), source (0 = `step`, i =
    `neighbours[i - 1]`) and row (the event's row in its source file).
    """
    threads = launching_threads(step)
    regions = set(data_regions)
    parts = []
    for source, s in enumerate((step, *neighbours)):
        ev = s.events
        start = ev["start_ns"]
        end = start + ev["dur_ns"]
        rows = np.arange(start.size, dtype=np.int64)
        if source:
            rows = rows[(end > step.start_ns) & (start < step.end_ns)]
        track = ev["track_id"][rows]
        kind = ev["kind"][rows]
        name_id = ev["name_id"][rows]
        device_of_track = np.array(
            [t.device if t.kind == "device_stream" else -1 for t in s.tracks] + [-1], np.int64
        )
        launcher_track = np.array(
            [t.kind == "host_thread" and (t.pid, t.tid) in threads for t in s.tracks] + [False]
        )
        on_launcher = launcher_track[track]
        host_range = on_launcher & np.isin(kind, _HOST_RANGE_KINDS)
        # Name flags per distinct string id (a loop over names, not events).
        ids = np.unique(name_id[host_range])
        names = [s.strings[i] for i in ids.tolist()]
        loader_ids = ids[[n.startswith(DATALOADER_PREFIX) or n in regions for n in names]]
        marker_ids = ids[[n.startswith(STEP_MARKER_PREFIX) for n in names]]
        parts.append(
            {
                "start_ns": start[rows],
                "end_ns": end[rows],
                "kind": kind,
                "device": device_of_track[track],
                "on_launcher": on_launcher,
                "host_range": host_range,
                "dataloader": host_range & np.isin(name_id, loader_ids),
                "step_marker": host_range & np.isin(name_id, marker_ids),
                "source": np.full(rows.size, source, dtype=np.int64),
                "row": rows,
            }
        )
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def category_intervals(window: dict[str, np.ndarray]) -> dict[str, Intervals]:
    """The raw (unclipped, overlapping) intervals of every category but `idle`, from
    `window_events`."""
    kind, start, end = window["kind"], window["start_ns"], window["end_ns"]
    out: dict[str, Intervals] = {}
    for name, code in DEVICE_CATEGORY_KINDS.items():
        m = kind == code
        out[name] = (start[m], end[m])
    m = window["on_launcher"] & np.isin(kind, LAUNCH_KINDS)
    out["runtime"] = (start[m], end[m])
    m = window["dataloader"]
    out["dataloader"] = (start[m], end[m])
    m = window["host_range"] & ~window["dataloader"] & ~window["step_marker"]
    out["host_other"] = (start[m], end[m])
    return out


def step_breakdown_ns(
    step: StepData, neighbours: Sequence[StepData] = (), data_regions: Iterable[str] = ()
) -> dict[str, int]:
    """ns of the step span in each category (CATEGORIES order); sums to `step.span_ns`.

    `neighbours`: the step files before and after this one (see `window_events`); without
    them, host work of the next step that starts inside this span is missed.
    """
    intervals = category_intervals(window_events(step, neighbours, data_regions))
    ns = priority_cover_ns(step.start_ns, step.end_ns, [intervals[c] for c in CATEGORIES[:-1]])
    return {c: int(v) for c, v in zip(CATEGORIES, ns)}


def iter_with_neighbours(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> Iterator[tuple[str, StepData, list[StepData]]]:
    """(worker, step, [previous step, next step]) for the selection; `steps=None` means every
    step. Neighbours are the adjacent entries of the worker's step index (absent at the ends);
    each file is read once per worker and at most three are held at a time.
    """
    chosen = set(resolve_steps(run, steps))
    for worker in resolve_workers(run, workers):
        order = run.worker(worker).steps
        cache: dict[int, StepData] = {}

        def load(s: int, cache=cache, worker=worker) -> StepData:
            if s not in cache:
                cache[s] = run.load_step(worker, s)
            return cache[s]

        for i, s in enumerate(order):
            if s not in chosen:
                continue
            around = [order[j] for j in (i - 1, i + 1) if 0 <= j < len(order)]
            for old in [k for k in cache if k not in around and k != s]:
                del cache[old]
            yield worker, load(s), [load(n) for n in around]


def step_time_breakdown(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    data_regions: Iterable[str] = (),
) -> pd.DataFrame:
    """One row per selected (worker, step); `steps=None` means every step.

    Columns: worker, rank (-1 when unknown), step, span_ns, then `<category>_ns` (int64,
    summing exactly to span_ns) and `<category>_pct` (of span_ns) for each of CATEGORIES.
    """
    regions = tuple(data_regions)
    ns_cols = [f"{c}_ns" for c in CATEGORIES]
    rows = []
    for worker, step, neighbours in iter_with_neighbours(run, workers, steps):
        ns = step_breakdown_ns(step, neighbours, regions)
        rank = int(run.worker(worker).meta.rank)
        rows.append([worker, rank, step.step, step.span_ns] + [ns[c] for c in CATEGORIES])
    df = pd.DataFrame(rows, columns=["worker", "rank", "step", "span_ns"] + ns_cols)
    for c in ["rank", "step", "span_ns"] + ns_cols:
        df[c] = df[c].astype(np.int64)
    span = df["span_ns"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        for c in CATEGORIES:
            df[f"{c}_pct"] = 100.0 * df[f"{c}_ns"].to_numpy(dtype=np.float64) / span
    return df


def step_time_breakdown_median(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    data_regions: Iterable[str] = (),
) -> pd.DataFrame:
    """The breakdown over a step range, one row per worker: the median of each column.

    `steps=None` means the default single step, `selection.steady_state_step` of the first
    selected worker (the same step for every worker, so ranks compare like with like). Each
    column is a median on its own, so over several steps the categories need not sum to the
    median span. Columns as in `step_time_breakdown`, with `step` replaced by `steps`
    (the step numbers, as a tuple) and ns columns as float64.
    """
    names = resolve_workers(run, workers)
    if steps is None:
        steps = [steady_state_step(run, names[0])]
    per_step = step_time_breakdown(run, names, steps, data_regions)
    value_cols = ["span_ns"] + [f"{c}_ns" for c in CATEGORIES] + [f"{c}_pct" for c in CATEGORIES]
    grouped = per_step.groupby(["worker", "rank"], sort=True)
    out = grouped[value_cols].median().reset_index()
    out.insert(2, "steps", grouped["step"].agg(tuple).to_numpy())
    return out
