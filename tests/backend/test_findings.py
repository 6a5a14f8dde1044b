"""Findings fire where the real traces have the problem, with a win equal to a hand
computation over the JSON, and stay silent where they do not."""

from __future__ import annotations

import os
import statistics

import numpy as np
import pytest

from tessera_tb.backend import collectives
from tessera_tb.backend.collectives import collective_members
from tessera_tb.backend.findings import findings, step_findings
from tessera_tb.trace import open_run
from tessera_tb.trace.step import KIND, Attr, StepData, TrackInfo, empty_events
from tests.backend.test_breakdown import (
    DDP_RANK0,
    GPT_1GPU,
    RESNET_2021,
    device_kind,
    hand_breakdown,
    load_trace,
    ns,
)
from tests.conftest import DEMO_RUNS, SHARED_TRACES

RESNET_STEP = 7  # a middle step of the first 2021 file: its host starts inside step 6's span


def hand_covered_ns(lo: int, hi: int, wanted: list, hidden: list) -> int:
    """|union(wanted) - union(hidden)| within [lo, hi), by a plain sweep."""
    points = [(max(s, lo), 0, 1) for s, e in hidden if min(e, hi) > max(s, lo)]
    points += [(min(e, hi), 0, -1) for s, e in hidden if min(e, hi) > max(s, lo)]
    points += [(max(s, lo), 1, 1) for s, e in wanted if min(e, hi) > max(s, lo)]
    points += [(min(e, hi), 1, -1) for s, e in wanted if min(e, hi) > max(s, lo)]
    counts, total, prev = [0, 0], 0, lo
    for t, which, delta in sorted(points):
        if counts[1] > 0 and counts[0] == 0:
            total += t - prev
        prev = t
        counts[which] += delta
    return total


def device_intervals(path: str, kinds: set[str], name_has: str = "") -> list:
    base, events = load_trace(path)
    return [
        (base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]))
        for e in events
        if device_kind(e) in kinds and name_has in e["name"]
    ]


def one(df, kind: str, subject: str = ""):
    rows = df[(df["kind"] == kind) & (df["subject"] == subject)]
    assert len(rows) == 1, f"expected one {kind} finding, got {len(rows)}"
    return rows.iloc[0]


@pytest.fixture(scope="module")
def ddp():
    return open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))


@pytest.fixture(scope="module")
def resnet(imported_runs):
    return open_run(imported_runs(RESNET_2021[0]))


def test_gpu_idle_waiting_on_the_host_is_the_host_busy_part_of_gpu_idle(ddp):
    step = ddp.load_step("rank0", 5)
    df = findings(ddp, ["rank0"], [5])
    hand = hand_breakdown(DDP_RANK0, step.start_ns, step.end_ns)
    f = one(df, "gpu_idle_host_bound")
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(hand["runtime"] + hand["host_other"])
    gpu_idle = hand["runtime"] + hand["dataloader"] + hand["host_other"] + hand["idle"]
    assert f"GPU idle {100 * gpu_idle / step.span_ns:.0f}% of step 5, mostly" in f["title"]
    # The training script makes its batch with torch.randn on the CPU.
    assert "while the GPU was idle (data loading excluded): aten::normal_" in f["evidence"]
    assert f["severity"] == "high"


def test_exposed_collective_time_is_nccl_time_with_no_compute_on_the_device(ddp):
    step = ddp.load_step("rank0", 6)  # 4% of the step; 1.4% in step 5
    f = one(findings(ddp, ["rank0"], [6]), "exposed_collective", "allreduce")
    nccl = device_intervals(DDP_RANK0, {"collective"})
    compute = device_intervals(DDP_RANK0, {"kernel"})
    want = hand_covered_ns(step.start_ns, step.end_ns, nccl, compute)
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(want)
    base, events = load_trace(DDP_RANK0)
    size = sum(
        4 * max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"])  # dtype Float
        for e in events
        if device_kind(e) == "collective" and step.start_ns <= base + ns(e["ts"]) < step.end_ns
    )
    assert f["title"] == f"allreduce of {size / 1e6:.0f} MB not overlapped with compute"


def test_exposed_collective_time_is_split_by_message_size(ddp):
    """Per power-of-two size bucket: the same hand sweep over that bucket's NCCL kernels."""
    step = ddp.load_step("rank0", 6)
    f = one(findings(ddp, ["rank0"], [6]), "exposed_collective", "allreduce")
    base, events = load_trace(DDP_RANK0)
    compute = device_intervals(DDP_RANK0, {"kernel"})
    by_bucket: dict[int, list] = {}
    for e in events:
        if device_kind(e) != "collective":
            continue
        size = 4 * max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"])
        lo = 1 << (size.bit_length() - 1)
        start = base + ns(e["ts"])
        by_bucket.setdefault(lo, []).append((start, start + ns(e["dur"])))
    want = {
        lo: hand_covered_ns(step.start_ns, step.end_ns, spans, compute)
        for lo, spans in by_bucket.items()
    }
    got = f["numbers"]["items"]
    assert got and [b["exposed_ns"] for b in got] == sorted(
        [b["exposed_ns"] for b in got], reverse=True
    )
    for b in got:
        lo = next(k for k in want if collectives.size_bucket_label(k) == b["bucket"])
        assert b["exposed_ns"] == want[lo]
    assert "exposed by message size: " + got[0]["bucket"] in f["evidence"]


def test_a_single_gpu_run_has_no_collective_finding():
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    df = findings(run, steps=run.steps, min_win_pct=0)
    assert not (df["kind"] == "exposed_collective").any()
    assert len(df) > 0


def test_data_loader_stall_is_gpu_idle_inside_enumerate_dataloader(resnet):
    step = resnet.load_step("worker0", RESNET_STEP)
    f = one(findings(resnet, steps=[RESNET_STEP]), "dataloader_stall")
    hand = hand_breakdown(RESNET_2021[0], step.start_ns, step.end_ns)
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(hand["dataloader"])
    assert hand["dataloader"] > 0.1 * step.span_ns


def test_a_configured_data_region_is_a_data_loader_stall_and_none_without_it():
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    step = run.load_step("worker0", 5)
    f = one(findings(run, steps=[5], data_regions=["data"]), "dataloader_stall")
    hand = hand_breakdown(GPT_1GPU, step.start_ns, step.end_ns, data_regions=["data"])
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(hand["dataloader"])
    assert not (findings(run, steps=[5], min_win_pct=0)["kind"] == "dataloader_stall").any()


def host_window(path: str, step: int) -> tuple[int, int]:
    """[host start of the step, host start of the next): the calls that belong to the step."""
    base, events = load_trace(path)
    marks = sorted(base + ns(e["ts"]) for e in events if e["name"].startswith("ProfilerStep#"))
    this = next(base + ns(e["ts"]) for e in events if e["name"] == f"ProfilerStep#{step}")
    return this, min(m for m in marks if m > this)


def test_launch_bound_kernels_sum_launch_minus_kernel_time(resnet):
    step = resnet.load_step("worker0", RESNET_STEP)
    base, events = load_trace(RESNET_2021[0])
    this, until = host_window(RESNET_2021[0], RESNET_STEP)
    calls = {e["args"]["correlation"]: e for e in events if e["cat"] == "Runtime"}
    launched: dict[int, list] = {}
    for e in events:
        if device_kind(e):
            launched.setdefault(e["args"]["correlation"], []).append(e)
    gap = 0
    for corr, work in launched.items():
        call = calls.get(corr)
        if call is None or not this <= base + ns(call["ts"]) < until or len(work) != 1:
            continue
        if work[0]["cat"] == "Kernel" and ns(call["dur"]) > ns(work[0]["dur"]):
            gap += ns(call["dur"]) - ns(work[0]["dur"])
    hand = hand_breakdown(RESNET_2021[0], step.start_ns, step.end_ns)
    gpu_idle = hand["runtime"] + hand["dataloader"] + hand["host_other"] + hand["idle"]
    f = one(findings(resnet, steps=[RESNET_STEP]), "launch_bound_kernels")
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(min(gap, gpu_idle))
    assert 0 < gap < gpu_idle


def test_pageable_copies_count_their_time_without_compute(resnet):
    step = resnet.load_step("worker0", RESNET_STEP)
    copies = device_intervals(RESNET_2021[0], {"memcpy"}, "Pageable")
    compute = device_intervals(RESNET_2021[0], {"kernel"})
    want = hand_covered_ns(step.start_ns, step.end_ns, copies, compute)
    # About 1% of this step: below the default threshold, reported with a lower one.
    assert not (findings(resnet, steps=[RESNET_STEP])["kind"] == "pageable_memcpy").any()
    f = one(findings(resnet, steps=[RESNET_STEP], min_win_pct=0.5), "pageable_memcpy")
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(want)
    assert want > 0


def test_runs_with_pinned_copies_have_no_pageable_finding(ddp):
    assert not (findings(ddp, steps=ddp.steps, min_win_pct=0)["kind"] == "pageable_memcpy").any()


def test_fp32_convolutions_are_a_low_tensor_core_share(resnet):
    step = resnet.load_step("worker0", RESNET_STEP)
    base, events = load_trace(RESNET_2021[0])
    this, until = host_window(RESNET_2021[0], RESNET_STEP)
    gemm_names = {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::conv2d"}
    family = [
        e
        for e in events
        if e["cat"] == "Operator" and ("convolution" in e["name"] or e["name"] in gemm_names)
    ]
    calls = {e["args"]["correlation"]: e for e in events if e["cat"] == "Runtime"}
    family_ns = low_precision_ns = 0
    for e in events:
        call = calls.get(e["args"].get("correlation")) if e["cat"] == "Kernel" else None
        if call is None or not this <= base + ns(call["ts"]) < until:
            continue
        c0 = base + ns(call["ts"])
        c1 = c0 + ns(call["dur"])
        around = [
            op
            for op in family
            if op["tid"] == call["tid"]
            and base + ns(op["ts"]) <= c0
            and c1 <= base + ns(op["ts"]) + ns(op["dur"])
        ]
        if not around:
            continue
        start = base + ns(e["ts"])
        dur = max(0, min(start + ns(e["dur"]), step.end_ns) - max(start, step.start_ns))
        family_ns += dur
        inner = max(around, key=lambda op: (ns(op["ts"]), -ns(op["dur"])))
        if any(t in ("Half", "BFloat16") for t in inner["args"]["Input type"]):
            low_precision_ns += dur
    f = one(findings(resnet, steps=[RESNET_STEP]), "low_tensor_core_share")
    assert low_precision_ns == 0 and family_ns > 0.3 * step.span_ns
    assert f["numbers"]["family_ns"] == family_ns
    assert f["numbers"]["no_tensor_core_ns"] == family_ns
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(family_ns * (1 - 1 / 7))
    assert f["title"] == "100% of matmul/conv/attention kernel time without tensor cores"


def test_bf16_runs_have_no_low_tensor_core_finding(ddp):
    assert not (findings(ddp, steps=ddp.steps)["kind"] == "low_tensor_core_share").any()


def test_a_range_reports_medians_ranked_by_win(ddp):
    df = findings(ddp, steps=[4, 5, 6])
    wins = df["win_ms_per_step"].tolist()
    assert wins == sorted(wins, reverse=True)
    f = one(df[df["worker"] == "rank0"], "gpu_idle_host_bound")
    per_step = []
    for s in (4, 5, 6):
        step = ddp.load_step("rank0", s)
        hand = hand_breakdown(DDP_RANK0, step.start_ns, step.end_ns)
        per_step.append(hand["runtime"] + hand["host_other"])
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(statistics.median(per_step))
    assert "of steps 4-6 (median)" in f["title"]
    assert f["steps"] == (4, 5, 6)
    for _, row in df.iterrows():
        pct = row["win_pct_of_step"]
        assert row["severity"] == ("high" if pct >= 10 else "medium" if pct >= 5 else "low")
        assert pct >= 2.0


def synthetic_step(kernel_end_ns: int) -> StepData:
    """One thread, one bf16 matmul launching one kernel [16, kernel_end_ns), span [0, 1000)."""
    strings = ["", "ProfilerStep#1", "aten::mm", "cudaLaunchKernel", "gemm", "cat",
               '["c10::BFloat16","c10::BFloat16"]']  # fmt: skip
    ev = empty_events(4)
    ev["start_ns"][:] = [0, 0, 5, 16]
    ev["dur_ns"][:] = [1000, 20, 10, kernel_end_ns - 16]
    ev["name_id"][:] = [1, 2, 3, 4]
    ev["cat_id"][:] = 5
    ev["track_id"][:] = [0, 0, 0, 1]
    ev["kind"][:] = [KIND["annotation"], KIND["cpu_op"], KIND["runtime"], KIND["kernel"]]
    ev["correlation"][:] = [0, 0, 7, 7]
    ev["parent"][:] = [-1, 0, 1, -1]
    ev["launch"][:] = [-1, -1, -1, 2]
    tracks = [
        TrackInfo(0, "host_thread", "1", "1", name="thread 1"),
        TrackInfo(1, "device_stream", "0", "7", device=0, stream=7, name="stream 7"),
    ]
    types = Attr("Input type", "json", np.array([1], np.int32), np.array([6], np.int32))
    return StepData(1, 0, 1000, strings, tracks, ev, attrs=[types])


def test_a_healthy_step_has_no_finding():
    # GPU busy 97.4%: 16 ns of launch before the kernel and 10 ns after it.
    assert step_findings(synthetic_step(990)).empty


def test_time_with_nothing_recorded_is_unrecorded_idle():
    df = step_findings(synthetic_step(500))
    assert df["kind"].tolist() == ["unrecorded_idle"]
    assert df.iloc[0]["win_ms_per_step"] == pytest.approx(500 / 1e6)
    assert df.iloc[0]["win_pct_of_step"] == pytest.approx(50.0)


@pytest.mark.parametrize("run_name", ["gpt_1gpu", "ddp_gpt_2rank", "fsdp_gpt_4rank"])
def test_problems_below_the_threshold_stay_silent(run_name):
    """The GPT runs launch some short kernels and record almost no idle time: both stay
    under 2% of the step, so neither is reported, though both are measured."""
    run = open_run(os.path.join(DEMO_RUNS, run_name))
    df = findings(run, steps=run.steps)
    assert not df["kind"].isin(["launch_bound_kernels", "unrecorded_idle"]).any()
    everything = findings(run, steps=run.steps, min_win_pct=0)
    assert everything["kind"].isin(["launch_bound_kernels"]).any()
    assert everything["kind"].isin(["unrecorded_idle"]).any()


def test_a_rank_the_others_wait_for_is_a_collective_straggler():
    """In the 4-rank FSDP run ranks 2 and 3 arrive last at most collectives; each other rank
    waits for them, per step, the members' wait in those instances / steps / 3."""
    run = open_run(os.path.join(DEMO_RUNS, "fsdp_gpt_4rank"))
    df = findings(run, steps=run.steps)
    m = collective_members(run, None, run.steps)
    m = m[m["complete"]]
    key = ["process_group", "step", "ordinal"]
    for worker in ("rank2", "rank3"):
        f = one(df, "collective_straggler", worker)
        assert f["worker"] == worker
        shortest = m.groupby(key)["dur_ns"].transform("min")
        mine = m[(m["worker"] == worker) & (m["dur_ns"] == shortest)][key]
        members = m.assign(wait=m["dur_ns"] - shortest).merge(mine, on=key)
        hand = float(members.loc[members["worker"] != worker, "wait"].sum())
        assert f["numbers"]["others_wait_ns"] == pytest.approx(hand)
        assert f["win_ms_per_step"] * 1e6 == pytest.approx(hand / (3 * 3))
        assert "t.view=collectives" in f["link"] and "t.metric=wait" in f["link"]
    assert set(df.loc[df["kind"] == "collective_straggler", "worker"]) == {"rank2", "rank3"}


def test_ranks_that_take_turns_arriving_last_are_no_stragglers(ddp):
    """Two DDP ranks, each last at about half the all-reduces: no straggler."""
    df = findings(ddp, steps=ddp.steps, min_win_pct=0)
    assert not (df["kind"] == "collective_straggler").any()


def test_cuda_allocator_calls_count_their_host_time(imported_runs):
    """The A100 trace of HTA's tests frees and refills the allocator's cache: 28 cudaMalloc
    and 17 cudaFree calls (one of 1.3 s) in its one step (no step markers)."""
    path = os.path.join(SHARED_TRACES, "hta_tests", "cupti_profiler",
                        "benchmark_result_924719_1679055439_trace.json.gz")  # fmt: skip
    run = open_run(imported_runs(path))
    base, events = load_trace(path)
    calls = [e for e in events if e["name"] in ("cudaMalloc", "cudaFree")]
    f = one(findings(run, steps=run.steps), "allocator_calls")
    assert f["numbers"]["count"] == len(calls) == 45
    assert f["numbers"]["host_ns"] == sum(ns(e["dur"]) for e in calls)
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(
        min(f["numbers"]["host_ns"], f["numbers"]["gpu_idle_ns"])
    )
    by_call = {it["call"]: it["count"] for it in f["numbers"]["items"]}
    assert by_call == {"cudaMalloc": 28, "cudaFree": 17}
    # The link zooms the timeline to the longest call, the 1.3 s cudaFree.
    state = dict(p.split("=", 1) for p in f["link"].split("&")[1:])
    assert state["t.view"] == "timeline"
    longest = max(calls, key=lambda e: ns(e["dur"]))
    origin = run.load_step(sorted(run.workers)[0], run.steps[0]).start_ns
    start = base + ns(longest["ts"]) - origin
    assert int(state["t.t0"]) < start < start + ns(longest["dur"]) < int(state["t.t1"])


def test_runs_with_a_warm_allocator_have_no_allocator_finding(ddp):
    assert not (findings(ddp, steps=ddp.steps, min_win_pct=0)["kind"] == "allocator_calls").any()
