"""The Chrome/Perfetto export follows the Trace Event Format's rules and keeps every event."""

from __future__ import annotations

import collections
import csv
import glob
import gzip
import json
import os
from decimal import Decimal

import numpy as np
import pytest

from tessera_tb.exporters.chrome_trace import export_chrome_trace
from tessera_tb.trace import open_run
from tessera_tb.trace.step import KIND

from ..conftest import DEMO_RUNS, SHARED_TRACES

CASES = {
    "gpt_1gpu": ("gpt_1gpu_stack", "worker0"),
    "ddp_gpt_2rank": ("ddp_gpt_2rank", "rank0"),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    demo, (shared, worker) = request.param, CASES[request.param]
    run = open_run(os.path.join(DEMO_RUNS, demo))
    path = str(tmp_path_factory.mktemp("chrome") / f"{demo}.json")
    steps = [run.load_step(worker, s) for s in run.workers[worker].steps]
    export_chrome_trace(steps, path, process_name=worker)
    with open(path) as f:
        data = json.load(f)
    (source,) = glob.glob(os.path.join(SHARED_TRACES, "pytorch", shared, f"{worker}.*.json.gz"))
    with gzip.open(source, "rt") as f:
        original = json.load(f, parse_float=Decimal)
    nvml = os.path.join(SHARED_TRACES, "pytorch", shared, f"nvml_{worker}.csv")
    return {"data": data, "original": original, "run": run, "worker": worker, "nvml": nvml}


def _ns(ts_us) -> int:
    return int((Decimal(repr(ts_us)) * 1000).to_integral_value())


def test_every_complete_event_has_ts_and_dur_and_integer_ids(exported):
    events = exported["data"]["traceEvents"]
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int)
            assert e["dur"] >= 0


def test_events_of_one_thread_nest_strictly(exported):
    by_thread = collections.defaultdict(list)
    for e in exported["data"]["traceEvents"]:
        if e["ph"] == "X":
            start = _ns(e["ts"])
            by_thread[(e["pid"], e["tid"])].append((start, start + _ns(e["dur"])))
    assert len(by_thread) > 3
    for slices in by_thread.values():
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[int] = []
        for start, end in slices:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], "partial overlap on one thread"
            open_ends.append(end)


def test_every_flow_start_has_its_finish_on_slices(exported):
    events = exported["data"]["traceEvents"]
    starts = {(e["cat"], e["id"]): e for e in events if e["ph"] == "s"}
    finishes = {(e["cat"], e["id"]): e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(finishes)
    slice_starts = {(e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "X"}
    for key, s in starts.items():
        f = finishes[key]
        assert f["bp"] == "e"
        assert (s["pid"], s["tid"], s["ts"]) in slice_starts  # on the launching call
        assert (f["pid"], f["tid"], f["ts"]) in slice_starts  # on the device event


def test_launch_flows_match_the_correlations_of_the_source_trace(exported):
    """One arrow per device event whose correlation has a runtime/driver call (json module)."""
    src = exported["original"]["traceEvents"]
    calls = {
        e["args"]["correlation"]
        for e in src
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    launched = [
        e
        for e in src
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        and e.get("args", {}).get("correlation") in calls
    ]
    flows = [e for e in exported["data"]["traceEvents"] if e["ph"] == "s"]
    assert len(flows) == len(launched)


def test_kernels_keep_their_nanosecond_start_times(exported):
    src = exported["original"]
    base = int(src["baseTimeNanoseconds"])
    theirs = sorted(
        base + int(e["ts"] * 1000) for e in src["traceEvents"] if e.get("cat") == "kernel"
    )
    data = exported["data"]
    ours_base = data["otherData"]["base_time_ns"]
    ours = sorted(
        ours_base + _ns(e["ts"])
        for e in data["traceEvents"]
        if e["ph"] == "X" and e["cat"] == "kernel"
    )
    assert len(ours) == len(theirs) > 100
    assert ours == theirs


def test_processes_and_threads_are_named(exported):
    events = exported["data"]["traceEvents"]
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_threads = {
        (e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    for e in events:
        if e["ph"] in ("X", "i", "C"):
            assert e["pid"] in named_pids
        if e["ph"] in ("X", "i"):
            assert (e["pid"], e["tid"]) in named_threads
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert exported["worker"] in names and "GPU 0" in names


def test_nvml_samples_inside_the_steps_become_counter_events(exported):
    spans = [(e.start_ns, e.end_ns) for e in exported["run"].workers[exported["worker"]].meta.steps]
    with open(exported["nvml"]) as f:
        rows = [r for r in csv.DictReader(f) if r.get("power_w")]
    inside = [r for r in rows if any(lo <= int(r["t_ns"]) < hi for lo, hi in spans)]
    power = [
        e for e in exported["data"]["traceEvents"] if e["ph"] == "C" and e["name"] == "power_w (W)"
    ]
    assert len(power) == len(inside) > 0
    assert sorted(e["args"]["power_w"] for e in power) == sorted(
        float(r["power_w"]) for r in inside
    )


def test_overlapping_python_frames_go_to_a_sub_track():
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    from tessera_tb.exporters.chrome_trace import chrome_trace

    data = chrome_trace([run.load_step("worker0", s) for s in run.steps])
    names = [
        e["args"]["name"]
        for e in data["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    ]
    assert any(n.endswith("(overlap 1)") for n in names)
    total_x = sum(1 for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] != "step")
    instants = [KIND["mark"], KIND["memory"]]
    stored = sum(
        int((~np.isin(run.load_step("worker0", s).events["kind"], instants)).sum())
        for s in run.steps
    )
    assert total_x == stored  # every event but marks and [memory] instants is a slice
