"""Step time breakdown against a plain-Python sweep over the trace JSON itself."""

from __future__ import annotations

import functools
import glob
import gzip
import json
import os
from decimal import Decimal

import numpy as np
import pytest

from tessera_tb.backend.breakdown import (
    CATEGORIES,
    launching_threads,
    priority_cover_ns,
    step_breakdown_ns,
    step_time_breakdown,
    step_time_breakdown_median,
)
from tessera_tb.backend.selection import steady_state_step
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, SHARED_TRACES

DDP_RANK0 = glob.glob(os.path.join(SHARED_TRACES, "pytorch/ddp_gpt_2rank/rank0.*.json.gz"))[0]
GPT_1GPU = glob.glob(os.path.join(SHARED_TRACES, "pytorch/gpt_1gpu_stack/worker0.*.json.gz"))[0]
RESNET_2021 = sorted(glob.glob(os.path.join(SHARED_TRACES, "pytorch_2021/*/*.json.gz")))

# Source categories (lower-cased), as written by the 2021 and current Kineto formats.
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy"}
DEVICE_CATS.update({"gpu_memset": "memset", "memset": "memset"})
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime"}
HOST_RANGE_CATS = {"cpu_op", "user_annotation", "operator"}


def ns(us) -> int:
    return int((Decimal(us) * 1000).to_integral_value())


@functools.cache
def load_trace(path: str) -> tuple[int, list]:
    """(base ns, complete events) of a trace, times as exact Decimals."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f, parse_float=Decimal)
    base = int(trace.get("baseTimeNanoseconds", 0))
    return base, [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def device_kind(e: dict) -> str | None:
    """kernel / collective / memcpy / memset for device work, else None. NCCL kernels are
    collectives."""
    kind = DEVICE_CATS.get(e.get("cat", "").lower())
    if kind == "kernel" and e["name"].startswith("nccl"):
        return "collective"
    return kind


def hand_breakdown(path: str, lo: int, hi: int, data_regions=()) -> dict[str, int]:
    """The breakdown of [lo, hi) by a sweep over the JSON, written without numpy.

    Launching threads: (pid, tid) of runtime/driver calls whose correlation id is also on a
    device event. Every event of the file overlapping [lo, hi) counts, whatever its step.
    """
    base, events = load_trace(path)
    device_corr = {e["args"].get("correlation") for e in events if device_kind(e)}
    launchers = {
        (e["pid"], e["tid"])
        for e in events
        if e.get("cat", "").lower() in RUNTIME_CATS
        and e.get("args", {}).get("correlation") in device_corr
    }
    intervals = []  # (start, end, priority)
    priority = {c: i for i, c in enumerate(CATEGORIES)}
    for e in events:
        cat = e.get("cat", "").lower()
        start = base + ns(e["ts"])
        end = start + ns(e["dur"])
        dk = device_kind(e)
        if dk:
            category = "compute" if dk == "kernel" else dk
        elif (e["pid"], e["tid"]) not in launchers:
            continue
        elif cat in RUNTIME_CATS:
            category = "runtime"
        elif cat in HOST_RANGE_CATS:
            if e["name"].startswith("ProfilerStep#"):
                continue
            loader = e["name"].startswith("enumerate(DataLoader)") or e["name"] in data_regions
            category = "dataloader" if loader else "host_other"
        else:
            continue
        start, end = max(start, lo), min(end, hi)
        if end > start:
            intervals.append((start, end, priority[category]))
    points = sorted([(s, 1, p) for s, _, p in intervals] + [(e, -1, p) for _, e, p in intervals])
    active = [0] * len(CATEGORIES)
    totals = [0] * len(CATEGORIES)
    prev = lo
    for t, delta, p in points + [(hi, 0, 0)]:
        if t > prev:
            top = next((i for i, n in enumerate(active) if n > 0), priority["idle"])
            totals[top] += t - prev
            prev = t
        active[p] += delta
    return dict(zip(CATEGORIES, totals))


def test_priority_cover_gives_each_instant_to_the_first_category_covering_it():
    high = (np.array([10, 40]), np.array([20, 50]))
    low = (np.array([0, 35]), np.array([30, 45]))
    # [0,10) low, [10,20) high, [20,30) low, [30,35) none, [35,40) low, [40,50) high,
    # [50,60) none
    assert priority_cover_ns(0, 60, [high, low]).tolist() == [20, 25, 15]
    # Clipped to the window; an empty window is all zeros.
    assert priority_cover_ns(12, 42, [high, low]).tolist() == [10, 15, 5]
    assert priority_cover_ns(5, 5, [high, low]).tolist() == [0, 0, 0]


@pytest.mark.parametrize("run_name", ["gpt_1gpu", "ddp_gpt_2rank", "fsdp_gpt_4rank"])
def test_categories_sum_exactly_to_the_span_on_every_demo_step(run_name):
    df = step_time_breakdown(open_run(os.path.join(DEMO_RUNS, run_name)))
    run = open_run(os.path.join(DEMO_RUNS, run_name))
    assert len(df) == sum(len(w.steps) for w in run.workers.values())
    cols = [f"{c}_ns" for c in CATEGORIES]
    assert (df[cols].to_numpy() >= 0).all()
    assert (df[cols].sum(axis=1) == df["span_ns"]).all()
    assert np.allclose(df[[f"{c}_pct" for c in CATEGORIES]].sum(axis=1), 100.0)


@pytest.mark.parametrize("path", RESNET_2021, ids=os.path.basename)
def test_categories_sum_exactly_to_the_span_on_the_2021_resnet_trace(path, imported_runs):
    df = step_time_breakdown(open_run(imported_runs(path)))
    assert len(df) == 6
    assert (df[[f"{c}_ns" for c in CATEGORIES]].sum(axis=1) == df["span_ns"]).all()


def test_ddp_step_matches_a_plain_python_sweep_over_the_json():
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    step = run.load_step("rank0", 5)
    got = step_time_breakdown(run, ["rank0"], [5]).iloc[0]
    want = hand_breakdown(DDP_RANK0, step.start_ns, step.end_ns)
    assert {c: int(got[f"{c}_ns"]) for c in CATEGORIES} == want
    assert want["compute"] > 0 and want["collective"] > 0 and want["idle"] > 0


def test_host_work_of_the_next_step_inside_the_span_is_counted(imported_runs):
    """In the 2021 trace the host starts step N+1 ~13 ms before the GPU ends step N: those
    host ops are filed with step N+1 but lie in span N."""
    run = open_run(imported_runs(RESNET_2021[0]))
    steps = run.worker("worker0").steps
    step = run.load_step("worker0", 7)
    got = step_time_breakdown(run, steps=[7]).iloc[0]
    want = hand_breakdown(RESNET_2021[0], step.start_ns, step.end_ns)
    assert {c: int(got[f"{c}_ns"]) for c in CATEGORIES} == want
    alone = step_breakdown_ns(step)  # without the neighbouring files
    assert alone != want
    assert want["dataloader"] > 0 and steps.index(7) not in (0, len(steps) - 1)


def test_configured_data_regions_count_as_data_loading():
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    step = run.load_step("worker0", 5)
    got = step_time_breakdown(run, steps=[5], data_regions=["data"]).iloc[0]
    want = hand_breakdown(GPT_1GPU, step.start_ns, step.end_ns, data_regions=["data"])
    assert {c: int(got[f"{c}_ns"]) for c in CATEGORIES} == want
    assert want["dataloader"] > 0.5 * step.span_ns
    default = step_time_breakdown(run, steps=[5]).iloc[0]
    assert default["dataloader_ns"] == 0


def test_threads_that_launch_no_gpu_work_are_not_host_time():
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    step = run.load_step("rank0", 5)
    threads = launching_threads(step)
    names = {(t.pid, t.tid): t.name for t in step.tracks}
    # NCCL's watchdog polls cudaEventQuery and launches nothing.
    watchdog = [t for t in step.tracks if t.kind == "host_thread" and "(" not in t.name]
    assert any(k for k in names if k not in threads)
    assert all((t.pid, t.tid) not in threads for t in watchdog)
    assert {names[k] for k in threads} == {"thread 669 (python)", "thread 695 (pt_autograd_0)"}


def test_the_median_over_a_range_and_the_default_single_step():
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    per_step = step_time_breakdown(run)
    ranged = step_time_breakdown_median(run, steps=[4, 5, 6]).set_index("worker")
    for worker, g in per_step.groupby("worker"):
        assert ranged.loc[worker, "compute_ns"] == float(np.median(g["compute_ns"]))
        assert ranged.loc[worker, "steps"] == (4, 5, 6)
    default = step_time_breakdown_median(run)
    assert set(default["steps"]) == {(steady_state_step(run, "rank0"),)}
