"""Per-step summary against hand computations over the trace JSON."""

from __future__ import annotations

import dataclasses
import os
import statistics

import numpy as np
import pytest

from tessera_tb.backend.selection import steady_state_step
from tessera_tb.backend.summary import (
    SM_OCCUPANCY_MISSING,
    step_summary,
    step_time_distribution,
    summary,
    tensor_core_time_pct_est,
)
from tessera_tb.trace import open_run
from tests.backend.test_breakdown import DDP_RANK0, RESNET_2021, load_trace, ns
from tests.backend.test_step_spans_and_busy import _hand_spans_and_busy
from tests.conftest import DEMO_RUNS, SHARED_TRACES

# The matmul/attention ops of the GPT traces, spelled out (METRICS.md's eligible family).
FAMILY_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::matmul",
    "aten::linear",
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_cudnn_attention_forward",
    "aten::_cudnn_attention_backward",
}
LOW_PRECISION = ("c10::BFloat16", "c10::Half", "c10::Float8")


def hand_step_kernels(path: str, step: int):
    """(kernel, launching call) pairs of the non-NCCL kernels launched in step `step`: the
    launching call (same correlation) starts between the step's ProfilerStep host start and
    the next one's."""
    base, events = load_trace(path)
    marks = sorted(
        base + ns(e["ts"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    this = next(
        base + ns(e["ts"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"] == f"ProfilerStep#{step}"
    )
    later = [m for m in marks if m > this]
    until = later[0] if later else float("inf")
    calls = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]
    }
    pairs = []
    for e in events:
        if e.get("cat") != "kernel" or e["name"].startswith("nccl"):
            continue
        call = calls.get(e["args"]["correlation"])
        if call and this <= base + ns(call["ts"]) < until:
            pairs.append((e, call))
    return base, events, pairs


def hand_tensor_core_pct(path: str, step: int) -> float:
    base, events, pairs = hand_step_kernels(path, step)
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["name"] in FAMILY_OPS]
    eligible = total = 0
    for kernel, call in pairs:
        c0 = base + ns(call["ts"])
        c1 = c0 + ns(call["dur"])
        around = [
            op
            for op in ops
            if (op["pid"], op["tid"]) == (call["pid"], call["tid"])
            and base + ns(op["ts"]) <= c0
            and c1 <= base + ns(op["ts"]) + ns(op["dur"])
        ]
        dur = ns(kernel["dur"])
        total += dur
        if around:
            inner = max(around, key=lambda op: (ns(op["ts"]), -ns(op["dur"])))
            types = inner["args"].get("Input type", [])
            if any(t.startswith(LOW_PRECISION) for t in types):
                eligible += dur
    return 100.0 * eligible / total


def test_tensor_core_time_pct_matches_a_walk_up_from_each_launch():
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    got = tensor_core_time_pct_est(run.load_step("rank0", 5))
    want = hand_tensor_core_pct(DDP_RANK0, 5)
    assert got == pytest.approx(want, abs=1e-9)
    # Autocast: aten::linear sees fp32 inputs, the addmm inside it bf16 ones; bf16 wins.
    assert 30 < want < 70


def test_fp32_convolutions_count_as_no_tensor_core_time(imported_runs):
    run = open_run(imported_runs(RESNET_2021[0]))
    df = step_summary(run)
    assert (df["tensor_core_time_pct_est"] == 0).all()


def test_tensor_core_pct_is_unknown_without_input_types():
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    step = run.load_step("worker0", 5)
    stripped = dataclasses.replace(step, attrs=[a for a in step.attrs if a.key != "Input type"])
    assert np.isnan(tensor_core_time_pct_est(stripped))


def test_estimated_occupancy_is_time_weighted_and_skips_failed_estimates():
    """A 0 on a kernel with >= 1 warp per SM is Kineto's calculator failing (opt-in shared
    memory), not a real occupancy."""
    _, _, pairs = hand_step_kernels(DDP_RANK0, 5)
    weighted = usable = total = 0
    for kernel, _ in pairs:
        a, dur = kernel["args"], ns(kernel["dur"])
        total += dur
        occ = a.get("est. achieved occupancy %")
        if occ is None or (occ == 0 and a.get("warps per SM", 0) >= 1):
            continue
        weighted += float(occ) * dur
        usable += dur
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    row = step_summary(run, ["rank0"], [5]).iloc[0]
    assert row["est_occupancy_pct"] == pytest.approx(weighted / usable, rel=1e-12)
    assert row["est_occupancy_coverage_pct"] == pytest.approx(100.0 * usable / total, rel=1e-12)
    assert 0 < row["est_occupancy_coverage_pct"] < 100


def test_measured_occupancy_is_null_with_a_reason_without_counters():
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    df = step_summary(run)
    assert df["sm_occupancy_pct"].isna().all() and df["tensor_core_time_pct"].isna().all()
    assert (df["sm_occupancy_note"] == SM_OCCUPANCY_MISSING).all()
    assert "Nsight Compute" in SM_OCCUPANCY_MISSING


def _ncu_rows() -> dict[str, dict[str, str]]:
    """gpt_step_raw.csv read with the csv module: launch ID -> {metric: text}."""
    import csv

    path = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    names = rows[0]
    return {r[0]: dict(zip(names, r)) for r in rows[2:]}


def test_measured_occupancy_and_tensor_core_share_come_from_the_ncu_values():
    """Recomputed from the CSV cells of the kernels matched in each step, weighted by the
    run's own kernel durations (METRICS.md, "Kernel counters", "Derived kernel figures")."""
    from tessera_tb.backend.counter_join import linked_kernels
    from tessera_tb.trace.kernel_counters import load_kernel_counters

    run_dir = os.path.join(DEMO_RUNS, "gpt_1gpu")
    run = open_run(run_dir)
    profile = load_kernel_counters(run_dir, "worker0")
    cells = _ncu_rows()
    df = step_summary(run).set_index("step")
    for step_no in run.steps:
        step = run.load_step("worker0", step_no)
        idx, rows = linked_kernels(profile, step)
        dur = step.events["dur_ns"][rows].astype(float)
        ids = [str(int(i)) for i in profile.profiled_id[idx]]
        occ = np.array(
            [float(cells[i]["sm__warps_active.avg.pct_of_peak_sustained_active"]) for i in ids]
        )
        tensor = np.array(
            [
                sum(
                    float(cells[i][m].replace(",", "") or 0)
                    for m in cells[i]
                    if m.startswith("sm__ops_path_tensor_src_") and m.endswith(".sum")
                )
                for i in ids
            ]
        )
        assert df.loc[step_no, "sm_occupancy_pct"] == pytest.approx(np.average(occ, weights=dur))
        want_tc = 100 * dur[tensor > 0].sum() / dur.sum()
        assert df.loc[step_no, "tensor_core_time_pct"] == pytest.approx(want_tc)
        assert f"measured on {len(ids)} kernel(s)" in df.loc[step_no, "sm_occupancy_note"]


def test_step_time_and_busy_match_the_json_and_the_distribution_is_over_all_steps():
    spans, busy = _hand_spans_and_busy(DDP_RANK0)
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    df = step_summary(run, ["rank0"]).set_index("step")
    for num, start, end in spans:
        assert df.loc[num, "step_time_ms"] == pytest.approx((end - start) / 1e6, rel=1e-12)
        assert df.loc[num, "gpu_busy_pct"] == pytest.approx(busy[num], abs=1e-9)
    times = [(end - start) / 1e6 for _, start, end in spans]
    dist = step_time_distribution(run, ["rank0"]).iloc[0]
    assert dist["num_steps"] == len(times) == 3
    assert dist["min_ms"] == pytest.approx(min(times))
    assert dist["median_ms"] == pytest.approx(statistics.median(times))
    assert dist["p90_ms"] == pytest.approx(statistics.quantiles(times, n=10, method="inclusive")[8])
    assert dist["max_ms"] == pytest.approx(max(times))


def test_a_step_range_is_reported_as_the_median_and_the_default_is_the_steady_step():
    spans, busy = _hand_spans_and_busy(DDP_RANK0)
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    ranged = summary(run, ["rank0"], [4, 5, 6]).iloc[0]
    assert ranged["steps"] == (4, 5, 6)
    assert ranged["gpu_busy_pct"] == pytest.approx(statistics.median(busy.values()), abs=1e-9)
    assert ranged["step_time_ms"] == pytest.approx(
        statistics.median((e - s) / 1e6 for _, s, e in spans)
    )
    default = summary(run)
    assert set(default["steps"]) == {(steady_state_step(run, "rank0"),)}
    assert list(default["worker"]) == ["rank0", "rank1"]
