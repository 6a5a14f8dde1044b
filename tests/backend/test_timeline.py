"""Timeline windows: level of detail keeps counts and busy time, zoom gives raw events."""

from __future__ import annotations

import glob
import gzip
import json
import os
import time
from collections import defaultdict

import numpy as np
import pytest

from tessera_tb.backend.intervals import union_length_ns
from tessera_tb.backend.timeline import TimelineIndex, event_detail, timeline_window
from tessera_tb.trace import open_run
from tessera_tb.trace.step import StepData, canonical_order, reorder
from tests.conftest import DEMO_RUNS, SHARED_TRACES

GPT_RUN = os.path.join(DEMO_RUNS, "gpt_1gpu")
GPT_JSON = glob.glob(os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack", "*.json.gz"))[0]
HOST_TREE = {"cpu_op", "annotation", "runtime", "driver"}
DEVICE_WORK = {"kernel", "collective", "memcpy", "memset"}


def _largest_demo_step() -> StepData:
    best = None
    for run_dir in sorted(glob.glob(os.path.join(DEMO_RUNS, "*"))):
        run = open_run(run_dir)
        for worker, info in run.workers.items():
            for entry in info.meta.steps:
                if best is None or entry.event_count > best[0]:
                    best = (entry.event_count, run, worker, entry.step)
    _, run, worker, step = best
    return run.load_step(worker, step)


@pytest.fixture(scope="module")
def largest_step() -> StepData:
    return _largest_demo_step()


@pytest.fixture(scope="module")
def gpt_step() -> StepData:
    return open_run(GPT_RUN).load_step("worker0", 5)


def _in_window(frame, t0: int, t1: int):
    """Events overlapping [t0, t1): start before t1 and end after t0 (instants: t0 <= ts)."""
    return (frame.start_ns < t1) & (
        (frame.end_ns > t0) | ((frame.dur_ns == 0) & (frame.start_ns >= t0))
    )


def _rows_by_hand(step: StepData) -> dict[int, tuple[int, str, int]]:
    """(track, lane, depth) of every event, from the frame with plain Python: depth = number
    of ancestors through `parent` for tree events; device work on one stream does not overlap
    in these traces (asserted), so it sits at depth 0; gpu annotations and other spans: the
    number of earlier ones on the track still open at their start."""
    frame = step.frame()
    parent = frame.parent.tolist()
    out = {}
    loose = defaultdict(list)
    for row, kind, track, start, dur in zip(
        frame.index, frame.kind.astype(str), frame.track_id, frame.start_ns, frame.dur_ns
    ):
        if kind in HOST_TREE or kind == "python":
            depth, p = 0, parent[row]
            while p >= 0:
                depth, p = depth + 1, parent[p]
            out[row] = (int(track), "ops" if kind in HOST_TREE else "python", depth)
        elif kind in DEVICE_WORK:
            out[row] = (int(track), "device", 0)
        elif kind in ("memory", "mark"):
            out[row] = (int(track), "instants", 0)
        else:
            lane = "gpu_annotations" if kind == "gpu_annotation" else "other"
            loose[(int(track), lane)].append((start, -dur, row))
    for (track, lane), spans in loose.items():
        spans.sort()
        for i, (start, _, row) in enumerate(spans):
            depth = sum(1 for s, nd, _ in spans[:i] if s - nd > start)
            out[row] = (track, lane, depth)
    work = frame[frame.kind.isin(DEVICE_WORK)].sort_values("start_ns")
    for _, stream in work.groupby("track_id"):
        assert (stream.start_ns.to_numpy()[1:] >= stream.end_ns.cummax().to_numpy()[:-1]).all()
    return out


def _answer_items(answer) -> int:
    return len(answer["events"]["row"]) + len(answer["summaries"]["count"])


def test_whole_step_window_of_the_largest_demo_step_is_bounded(largest_step):
    step = largest_step
    everything = timeline_window(step, start_ns=step.start_ns, end_ns=step.end_ns)
    assert _answer_items(everything) <= 5000
    for max_items in (2000, 500, 100):
        answer = timeline_window(
            step, start_ns=step.start_ns, end_ns=step.end_ns, max_items=max_items
        )
        assert answer["resolution_ns"] > 0 and not answer["truncated"]
        assert _answer_items(answer) <= max_items
        assert len(answer["flows"]["from_row"]) <= max_items // 2
        json.dumps(answer, allow_nan=False)  # plain JSON, no NaN


@pytest.mark.parametrize("which", ["largest", "gpt_with_python_stacks"])
def test_summary_boxes_conserve_event_counts_and_busy_time(which, largest_step, gpt_step):
    step = largest_step if which == "largest" else gpt_step
    t0 = step.start_ns + step.span_ns // 7
    t1 = step.end_ns - step.span_ns // 9
    answer = timeline_window(step, start_ns=t0, end_ns=t1, max_items=400)
    res, origin = answer["resolution_ns"], answer["origin_ns"]
    ev, box = answer["events"], answer["summaries"]
    assert res > 0 and len(box["count"]) > 0 and min(box["count"]) >= 2

    frame = step.frame()
    inside = frame[_in_window(frame, t0, t1)]
    drawn = defaultdict(int)
    for track in ev["track"]:
        drawn[track] += 1
    for track, count in zip(box["track"], box["count"]):
        drawn[track] += count
    assert dict(drawn) == inside.groupby("track_id").size().to_dict()

    # Per row of the layout: union of the narrow events = busy of the boxes + the narrow
    # events drawn alone (events of one row do not overlap).
    lanes = answer["lanes"]
    where = _rows_by_hand(step)
    narrow = defaultdict(list)
    for row, start, end, dur in zip(inside.index, inside.start_ns, inside.end_ns, inside.dur_ns):
        if dur < res and row in where:
            narrow[where[row]].append((start, end))
    busy = defaultdict(int)
    for track, lane, depth, ns in zip(box["track"], box["lane"], box["depth"], box["busy_ns"]):
        busy[(track, lanes[lane], depth)] += ns
    for row, start, dur in zip(ev["row"], ev["start_ns"], ev["dur_ns"]):
        if dur < res and row in where:
            s, e = max(start + origin, t0), min(start + origin + dur, t1)
            busy[where[row]] += max(0, e - s)
    assert {k: v for k, v in busy.items() if k in narrow or v} == {
        k: union_length_ns(np.array([s for s, _ in v]), np.array([e for _, e in v]), t0, t1)
        for k, v in narrow.items()
    }
    # Every drawn event sits on its own row; no box covers an event drawn on the same row.
    for row, track, lane, depth in zip(ev["row"], ev["track"], ev["lane"], ev["depth"]):
        if row in where:
            assert where[row] == (track, lanes[lane], depth)
    by_row = defaultdict(list)
    for track, lane, depth, start, dur in zip(
        ev["track"], ev["lane"], ev["depth"], ev["start_ns"], ev["dur_ns"]
    ):
        by_row[(track, lane, depth)].append((start, start + dur))
    for track, lane, depth, start, end in zip(
        box["track"], box["lane"], box["depth"], box["start_ns"], box["end_ns"]
    ):
        for s, e in by_row[(track, lane, depth)]:
            assert e <= start or s >= end


def test_summary_boxes_name_the_event_name_with_most_time(gpt_step):
    step = gpt_step
    answer = timeline_window(step, start_ns=step.start_ns, end_ns=step.end_ns, max_items=300)
    names = answer["names"]
    box = answer["summaries"]
    frame = step.frame()
    device = frame[frame.kind.isin(DEVICE_WORK)]
    # One box on the device row: its dominant name is the heaviest kernel name among its
    # members (members = narrow device events that start in its time bin).
    res, origin = answer["resolution_ns"], answer["origin_ns"]
    t0 = step.start_ns
    lanes = answer["lanes"]
    i = next(j for j, ln in enumerate(box["lane"]) if lanes[ln] == "device")
    bin_start = t0 + (box["start_ns"][i] + origin - t0) // res * res
    members = device[
        (device.start_ns >= bin_start)
        & (device.start_ns < bin_start + res)
        & (device.dur_ns < res)
        & (device.track_id == box["track"][i])
    ]
    assert len(members) == box["count"][i]
    per_name = members.groupby("name", observed=True).dur_ns.sum()
    assert names[box["name"][i]] == per_name.idxmax()
    assert box["name_dur_ns"][i] == per_name.max()


def test_a_zoomed_window_returns_the_raw_events_exactly(gpt_step):
    step = gpt_step
    frame = step.frame()
    kernels = frame[frame.kind == "kernel"]
    t0 = int(kernels.start_ns.iloc[len(kernels) // 2])
    t1 = t0 + 300_000
    answer = timeline_window(step, start_ns=t0, end_ns=t1)
    want = frame[_in_window(frame, t0, t1)]
    assert 0 < len(want) < 5000
    assert answer["resolution_ns"] == 0 and answer["summaries"]["count"] == []
    ev = answer["events"]
    got = {
        row: (start + answer["origin_ns"], dur, answer["names"][name], answer["kinds"][kind])
        for row, start, dur, name, kind in zip(
            ev["row"], ev["start_ns"], ev["dur_ns"], ev["name"], ev["kind"]
        )
    }
    assert got == {
        row: (s, d, n, str(k))
        for row, s, d, n, k in zip(want.index, want.start_ns, want.dur_ns, want.name, want.kind)
    }
    assert set(ev["step"]) == {5}
    # Launch arrows for the drawn kernels start at their launching calls.
    flows = set(zip(answer["flows"]["from_row"], answer["flows"]["to_row"]))
    drawn = want[want.kind.isin(DEVICE_WORK) & (want.launch >= 0)]
    assert len(drawn) and set(zip(drawn.launch, drawn.index)) <= flows


def test_search_and_track_selection_filter_what_is_drawn(gpt_step):
    step = gpt_step
    frame = step.frame()
    t0, t1 = step.start_ns, step.end_ns
    answer = timeline_window(step, start_ns=t0, end_ns=t1, search="NVJET")
    want = frame[_in_window(frame, t0, t1) & frame.name.str.lower().str.contains("nvjet")]
    assert sorted(answer["events"]["row"]) == sorted(want.index) and len(want)
    stream = int(want.track_id.iloc[0])
    only = timeline_window(step, start_ns=t0, end_ns=t1, tracks=[stream])
    assert set(only["events"]["track"]) == {stream}
    assert [t["id"] for t in only["tracks"]] == [stream]
    assert len(only["events"]["row"]) == int(
        (_in_window(frame, t0, t1) & (frame.track_id == stream)).sum()
    )


def test_counters_in_a_window_are_the_samples_there_and_the_one_before(gpt_step):
    step = gpt_step
    power = next(c for c in step.counters if c.name == "power_w")
    assert power.ts_ns.size >= 3
    t0, t1 = int(power.ts_ns[1]) + 1, int(power.ts_ns[-1]) + 1
    raw = timeline_window(step, start_ns=t0, end_ns=t1, resolution_ns=1)
    got = next(c for c in raw["counters"] if c["name"] == "power_w")
    assert [t + raw["origin_ns"] for t in got["t_ns"]] == power.ts_ns[1:].tolist()
    assert got["value"] == pytest.approx(power.values[1:].tolist())
    coarse = timeline_window(step, start_ns=t0, end_ns=t1, resolution_ns=t1 - t0)
    got = next(c for c in coarse["counters"] if c["name"] == "power_w")
    # One sample before the window, one bin for the rest.
    assert got["value"] == pytest.approx([power.values[1], power.values[2:].mean()])
    assert got["min"][1] == power.values[2:].min() and got["max"][1] == power.values[2:].max()


def test_a_window_across_a_step_boundary_draws_both_steps():
    run = open_run(GPT_RUN)
    s4, s5 = run.load_step("worker0", 4), run.load_step("worker0", 5)
    t0, t1 = s5.start_ns - 2_000_000, s5.start_ns + 2_000_000
    answer = timeline_window([s4, s5], start_ns=t0, end_ns=t1)
    assert [s["step"] for s in answer["steps"]] == [4, 5]
    assert answer["steps"][1]["start_ns"] + answer["origin_ns"] == s5.start_ns
    ev = answer["events"]
    for step in (s4, s5):
        frame = step.frame()
        want = set(frame.index[_in_window(frame, t0, t1)])
        assert {r for s, r in zip(ev["step"], ev["row"]) if s == step.step} == want


def _owner_by_external_id(kernel_correlation: int):
    """(launching call name, cpu_op name with the kernel's External id) from the JSON."""
    with gzip.open(GPT_JSON, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernel = next(
        e
        for e in events
        if e.get("cat") == "kernel" and e["args"].get("correlation") == kernel_correlation
    )
    call = next(
        e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and e["args"].get("correlation") == kernel_correlation
    )
    ops = [
        e
        for e in events
        if e.get("cat") == "cpu_op"
        and e["args"].get("External id") == kernel["args"]["External id"]
    ]
    return kernel, call["name"], [e["name"] for e in ops]


def test_detail_of_a_kernel_names_its_launching_call_and_owning_op(gpt_step):
    step = gpt_step
    index = TimelineIndex.build(step)
    frame = step.frame()
    row = int(frame.index[(frame.kind == "kernel") & frame.name.str.startswith("nvjet")][0])
    detail = event_detail(index, row)
    kernel, call_name, op_names = _owner_by_external_id(detail["correlation"])
    assert detail["name"] == kernel["name"] and detail["kind"] == "kernel"
    assert detail["launched_by"]["name"] == call_name
    assert op_names == [detail["owning_op"]["name"]]
    assert detail["attrs"]["grid"] == kernel["args"]["grid"]
    assert detail["attrs"]["registers per thread"] == kernel["args"]["registers per thread"]
    assert detail["track"]["kind"] == "device_stream" and detail["parents"] == []
    call = event_detail(step, detail["launched_by"]["row"])
    assert row in [e["row"] for e in call["launches"]]
    assert [p["name"] for p in call["parents"]][-1] in op_names or call["parents"][-1][
        "kind"
    ] != "cpu_op"
    assert detail["owning_op"]["row"] in [p["row"] for p in call["parents"]]
    json.dumps(detail, allow_nan=False)


def test_detail_of_an_op_lists_its_parent_chain_and_children(gpt_step):
    step = gpt_step
    frame = step.frame()
    row = int(frame.index[frame.name == "aten::addmm"][0])
    detail = event_detail(step, row)
    chain, p = [], int(frame.parent[row])
    while p >= 0:
        chain.append(frame.name[p])
        p = int(frame.parent[p])
    assert [x["name"] for x in detail["parents"]] == chain[::-1]
    assert detail["children_count"] == int((frame.parent == row).sum())
    assert detail["owning_op"]["row"] == row
    assert detail["attrs"]["Input Dims"] == json.loads(step.attr("Input Dims")[row])


def _tiled_step(step: StepData, copies: int) -> StepData:
    """`copies` back-to-back copies of a step in one step (rows in the file's order)."""
    ev, n = step.events, step.num_events
    shift = step.span_ns + 1000
    cols = {}
    for name, col in ev.items():
        parts = []
        for k in range(copies):
            if name == "start_ns":
                parts.append(col + k * shift)
            elif name in ("parent", "launch"):
                parts.append(np.where(col >= 0, col + k * n, -1).astype(col.dtype))
            else:
                parts.append(col)
        cols[name] = np.concatenate(parts)
    big = StepData(
        step=step.step,
        start_ns=step.start_ns,
        end_ns=step.start_ns + copies * shift,
        strings=step.strings,
        tracks=step.tracks,
        events=cols,
    )
    return reorder(big, canonical_order(big.events))


def test_a_600k_event_step_answers_whole_and_zoomed_windows_fast(largest_step):
    big = _tiled_step(largest_step, 600_000 // largest_step.num_events + 1)
    assert big.num_events >= 600_000

    def best_of_3(fn):
        times = []
        for _ in range(3):
            t = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t)
        return min(times), out

    whole_s, answer = best_of_3(
        lambda: timeline_window(TimelineIndex.build(big), start_ns=big.start_ns, end_ns=big.end_ns)
    )
    assert whole_s < 1.0 and _answer_items(answer) <= 5000
    assert answer["events_in_window"] == big.num_events
    assert sum(answer["summaries"]["count"]) + len(answer["events"]["row"]) == big.num_events
    index = TimelineIndex.build(big)
    t0 = big.start_ns + big.span_ns // 2
    zoom_s, zoomed = best_of_3(
        lambda: timeline_window(index, start_ns=t0, end_ns=t0 + big.span_ns // 500)
    )
    assert zoom_s < 0.1 and _answer_items(zoomed) <= 5000
