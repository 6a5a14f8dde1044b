"""The planted-problem suite (bench/planted_problems.py, captured on an H100 into
tests/data/planted): each problem run's finding names the planted problem among its top two,
is gone in the fixed run, and predicts the win measured between the two runs.

Measured win = median step span of the problem run minus that of the fixed run. The spans are
used (not planted.json's profiler-free times) because the prediction is made from the profiled
run: both sides of the comparison then carry the same profiler overhead. The bench script
bench/planted_findings.py prints both.
"""

from __future__ import annotations

import json
import os
import statistics
import urllib.parse

import numpy as np
import pytest

from bench.planted_findings import PLANTED_KINDS, PlantedRow, median_span_ms, planted_rows
from tessera_tb.backend.devices import device_peaks
from tessera_tb.backend.findings import findings, step_findings
from tessera_tb.backend.kernel_findings import (
    ATTAINABLE_ROOF_FRACTION,
    TINY_KERNEL_NS,
    kernel_arch_tag,
)
from tessera_tb.trace import open_run
from tessera_tb.trace.step import KIND
from tests.conftest import ROOT

PLANTED = os.path.join(ROOT, "tests", "data", "planted")
H100 = device_peaks("NVIDIA H100 80GB HBM3")

# The one planted problem whose prediction misses the band: `.item()` per layer (12 layers of
# 4096 x 4096 on 8192 tokens, so the fixed step is GPU-bound). The finding predicts the GPU idle
# from each sync's drain point to the next device work (0.88 ms per step) and ranks second,
# after the generic host-bound idle (1.69 ms); the profiled step spans differ by 2.55 ms,
# because after each sync the host stays behind the GPU for the small relu/isnan/any kernels of
# the next layer, whose gaps the rule does not count, and the check's own kernels go too. The
# profiler-free steps differ by 1.15 ms, within the band. Strict: it fails once the model
# counts those gaps.
KNOWN_MISSES = {"item_sync"}


@pytest.fixture(scope="module")
def rows() -> dict[str, PlantedRow]:
    return {r.problem: r for r in planted_rows(PLANTED)}


def run_of(problem: str, variant: str):
    with open(os.path.join(PLANTED, "planted.json")) as f:
        entry = json.load(f)["problems"][problem][variant]
    return open_run(os.path.join(PLANTED, entry["run"]))


def one(df, kind: str):
    rows = df[df["kind"] == kind]
    assert len(rows) == 1, f"expected one {kind} finding, got {len(rows)}"
    return rows.iloc[0]


def mark_known(problem: str):
    if problem in KNOWN_MISSES:
        return pytest.param(
            problem, marks=pytest.mark.xfail(strict=True, reason="see KNOWN_MISSES")
        )
    return problem


@pytest.mark.parametrize("problem", list(PLANTED_KINDS))
def test_the_planted_problem_is_among_the_top_two_findings(problem, rows):
    assert rows[problem].rank is not None and rows[problem].rank <= 2


@pytest.mark.parametrize("problem", list(PLANTED_KINDS))
def test_the_finding_is_gone_in_the_fixed_run(problem, rows):
    assert rows[problem].rank is not None
    assert not rows[problem].in_fixed


@pytest.mark.parametrize("problem", [mark_known(p) for p in PLANTED_KINDS])
def test_the_predicted_win_is_within_30pct_or_1ms_of_the_measured_one(problem, rows):
    r = rows[problem]
    assert r.span_ms > 0
    assert r.within(r.span_ms), f"predicted {r.predicted_ms:.2f} ms, measured {r.span_ms:.2f} ms"


def test_the_measured_win_is_the_difference_of_median_step_spans():
    bad, good = run_of("tiny_kernels", "problem"), run_of("tiny_kernels", "fixed")
    spans = [bad.load_step("worker0", s).span_ns for s in bad.steps]
    fixed = [good.load_step("worker0", s).span_ns for s in good.steps]
    assert median_span_ms(bad) - median_span_ms(good) == pytest.approx(
        (statistics.median(spans) - statistics.median(fixed)) / 1e6
    )


def test_fixed_runs_with_nothing_left_to_win_have_no_finding():
    for problem in ("unaligned_gemm", "pageable_copy"):
        run = run_of(problem, "fixed")
        assert findings(run, steps=run.steps).empty, problem


def test_an_unaligned_vocabulary_gemm_cites_its_dims_its_old_kernel_and_the_roof():
    """The LM head of the workload: x [4096, 1024] @ w[50257, 1024]^T, forward and two
    backward GEMMs, twice per step: six GEMMs of 2 x 4096 x 1024 x 50257 FLOPs each."""
    run = run_of("unaligned_gemm", "problem")
    step = run.load_step("worker0", 3)
    ev = step.events
    names = step.string_values(ev["name_id"])
    gemm = np.flatnonzero(
        (ev["kind"] == KIND["kernel"]) & np.array(["cutlass_75" in n for n in names])
    )
    assert gemm.size == 6
    flops = 2 * 4096 * 1024 * 50257
    kernel_ns = ev["dur_ns"][gemm].astype(float)
    hand_win = float((kernel_ns - flops / (ATTAINABLE_ROOF_FRACTION * 989e12) * 1e9).sum())
    f = one(step_findings(step, peaks=H100), "gemm_below_roof")
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(hand_win, rel=1e-6)
    assert f["numbers"]["ops"] == 6
    top = f["numbers"]["items"][0]
    assert top["roof_pct"] == pytest.approx(
        100 * 2 * flops / (989e12 * top["dur_ns"] * 1e-9), rel=1e-6
    )
    assert "50257 not multiples of 8" in f["title"] and "sm75 on an sm90" in f["title"]
    assert "4096x50257x1024" in f["evidence"]


def test_without_device_peaks_there_is_no_roof_finding():
    run = run_of("unaligned_gemm", "problem")
    step = run.load_step("worker0", 3)
    assert "gemm_below_roof" not in step_findings(step)["kind"].tolist()


def test_a_host_sync_counts_the_gpu_idle_after_each_item_call():
    """12 layers, one `.item()` each: 12 cudaStreamSynchronize per step, under aten::item."""
    run = run_of("item_sync", "problem")
    step = run.load_step("worker0", 3)
    df = step.frame()
    device = df[df["kind"].isin(["kernel", "memcpy", "memset", "collective"])]
    syncs = df[df["name"] == "cudaStreamSynchronize"]
    assert len(syncs) == 12
    hand = 0
    for _, s in syncs.iterrows():
        done = device[device["start_ns"] < s["end_ns"]]["end_ns"].max()
        after = device[device["start_ns"] >= s["end_ns"]]["start_ns"].min()
        hand += max(min(after, step.end_ns) - max(s["start_ns"], done), 0)
    f = one(step_findings(step), "host_sync")
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(hand)
    assert f["numbers"]["count"] == 12
    assert f["numbers"]["items"][0]["cause"].startswith("aten::item @ planted_problems.py(")


def test_tiny_kernels_count_the_elementwise_chain():
    """8 calls x 8 iterations x 7 ops (mul, add, sin, sigmoid, mul, mean, sub) = 448 kernels,
    each under 10 us; the compiled variant launches 8 fused kernels and has no finding."""
    run = run_of("tiny_kernels", "problem")
    step = run.load_step("worker0", 3)
    f = one(step_findings(step), "tiny_kernels")
    assert f["numbers"]["count"] == 448 and f["numbers"]["ops"] == 448
    assert f["numbers"]["runs"] == 1
    ev = step.events
    kernels = ev["kind"] == KIND["kernel"]
    assert (ev["dur_ns"][kernels] < TINY_KERNEL_NS).sum() == 448
    hand_host = 0
    for r in np.flatnonzero(kernels):
        op = ev["parent"][ev["launch"][r]]
        while ev["parent"][op] >= 0 and ev["kind"][ev["parent"][op]] == KIND["cpu_op"]:
            op = ev["parent"][op]
        hand_host += ev["dur_ns"][op]
    assert f["numbers"]["host_ns"] == hand_host


def test_an_unfused_adamw_is_a_per_parameter_loop():
    """96 Linear layers = 192 parameters; single-tensor AdamW launches 8 kernels per
    parameter (mul_, lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_)."""
    run = run_of("unfused_optimizer", "problem")
    step = run.load_step("worker0", 3)
    f = one(step_findings(step), "unfused_optimizer")
    assert f["numbers"]["kernels"] == 192 * 8
    df = step.frame()
    region = df[df["name"] == "Optimizer.step#AdamW.step"].iloc[0]
    assert f["numbers"]["region_ns"] >= region["dur_ns"]
    assert f["win_ms_per_step"] * 1e6 == pytest.approx(
        f["numbers"]["region_ns"] - f["numbers"]["device_ns"]
    )
    fused = run_of("unfused_optimizer", "fixed")
    assert "unfused_optimizer" not in step_findings(fused.load_step("worker0", 3))["kind"].tolist()


@pytest.mark.parametrize(
    "name, arch",
    [
        ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>", 75),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3", 80),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 90),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::sin_kernel_cuda>", None),
        ("triton_per_fused_add_mean_mul_sigmoid_sin_sub_0", None),
    ],
)
def test_the_architecture_tag_of_a_kernel_name(name, arch):
    assert kernel_arch_tag(name) == arch


@pytest.mark.parametrize(
    "problem, view, q",
    [
        ("unaligned_gemm", "kernels", "void cutlass::Kernel2<cutlass_75_tensorop_bf16"),
        ("item_sync", "timeline", None),
        ("tiny_kernels", "operators", "aten::mul"),
        ("unfused_optimizer", "timeline", None),
        ("pageable_copy", "timeline", "Pageable"),
        ("fp32_matmul", "roofline", None),
    ],
)
def test_each_planted_finding_links_to_the_view_that_shows_it(problem, view, q):
    run = run_of(problem, "problem")
    f = one(findings(run, steps=run.steps), PLANTED_KINDS[problem])
    assert f["link"].startswith(f"#tessera&t.run={run.name}&t.workers=worker0&t.steps=2-4&")
    state = dict(p.split("=", 1) for p in f["link"].split("&")[1:])
    assert state["t.view"] == view
    if q is None:
        assert "t.q" not in state
    else:
        assert urllib.parse.unquote(state["t.q"]).startswith(q)


def test_the_fp32_mlp_finding_names_its_four_linear_layers():
    """4 x nn.Linear(4096, 4096) on a [2048, 4096] fp32 batch: four addmm forward ops."""
    run = run_of("fp32_matmul", "problem")
    f = one(findings(run, steps=run.steps), "low_tensor_core_share")
    top = {(it["op"], it["dims"]): it["count"] for it in f["numbers"]["items"]}
    assert top[("aten::addmm", "[[4096],[2048,4096],[4096,4096],[],[]]")] == 4
    assert "Most time: aten::addmm [[4096],[2048,4096],[4096,4096],[],[]] x4" in f["evidence"]


def test_a_timeline_link_zooms_to_the_first_syncs_of_the_median_step():
    run = run_of("item_sync", "problem")
    f = one(findings(run, steps=run.steps), "host_sync")
    state = dict(p.split("=", 1) for p in f["link"].split("&")[1:])
    origin = run.load_step("worker0", 2).start_ns  # one worker: its first step's start
    t0, t1 = origin + int(state["t.t0"]), origin + int(state["t.t1"])
    wins = {
        s: one(step_findings(run.load_step("worker0", s)), "host_sync")["win_ms_per_step"]
        for s in run.steps
    }
    median_step = sorted(wins, key=wins.get)[len(wins) // 2]  # the link's step
    median = run.load_step("worker0", median_step)
    df = median.frame()
    syncs = df[df["name"] == "cudaStreamSynchronize"].sort_values("start_ns")
    assert t0 < syncs["start_ns"].iloc[0] < syncs["start_ns"].iloc[2] < t1
    assert t1 < syncs["start_ns"].iloc[3] + 1_000_000


def test_a_gpt2_lm_head_with_vocabulary_50257_is_named_with_its_win():
    """Hugging Face GPT-2 (n_embd 512, batch 8 x 256 tokens, vocabulary 50,257, bf16
    autocast) on an H100: the LM head's forward and two backward GEMMs, 2 x 2048 x 512 x 50257
    FLOPs each, run in cuBLAS' sm75 CUTLASS kernels; the finding names them first."""
    run = open_run(os.path.join(ROOT, "tests", "data", "ncu_step", "gpt2"))
    step = run.load_step("worker0", 3)
    f = one(step_findings(step, peaks=H100), "gemm_below_roof")
    items = f["numbers"]["items"]
    # (M, N, K): logits = x [2048, 512] @ W^T; grad_x = g [2048, 50257] @ W; grad_W = g^T @ x
    assert sorted(it["dims"] for it in items) == sorted(
        [[2048, 50257, 512], [2048, 512, 50257], [50257, 512, 2048]]
    )
    assert all("dims 50257 not multiples of 8" in it["reasons"] for it in items)
    assert all(any("sm75 on an sm90" in r for r in it["reasons"]) for it in items)
    # By hand: every kernel launched inside an aten::mm whose input dims hold 50257.
    ev = step.events
    names = step.string_values(ev["name_id"])
    dims = step.attr("Input Dims")
    kernels = np.flatnonzero((ev["kind"] == KIND["kernel"]) & (ev["launch"] >= 0))
    ops = ev["parent"][ev["launch"][kernels]]
    lm_head = kernels[
        (names[ops] == "aten::mm") & np.array(["50257" in str(dims.get(o, "")) for o in ops])
    ]
    assert sum("cutlass_75" in n for n in names[lm_head]) == 3  # one GEMM kernel per op
    flops = 2 * 2048 * 512 * 50257
    hand = (
        float(ev["dur_ns"][lm_head].sum()) - 3 * flops / (ATTAINABLE_ROOF_FRACTION * 989e12) * 1e9
    )
    assert sum(it["win_ns"] for it in items) == pytest.approx(hand, rel=1e-6)
    assert "; most to win: aten::mm [2048x50257x512] at " in f["title"]


@pytest.mark.parametrize("run_name", ["gpt_1gpu", "ddp_gpt_2rank", "fsdp_gpt_4rank"])
def test_the_demo_runs_have_no_gemm_sync_optimizer_or_allocator_finding(run_name):
    """GEMMs within reach of their roof, a sync or two per step, a fused/foreach optimizer, a
    warm allocator: measured (below the threshold) but none reported."""
    run = open_run(os.path.join(ROOT, "demo_runs", run_name))
    new_kinds = {"gemm_below_roof", "host_sync", "unfused_optimizer", "allocator_calls"}
    assert not set(findings(run, steps=run.steps)["kind"]) & new_kinds
    everything = findings(run, steps=run.steps, min_win_pct=0)
    below = everything[everything["kind"].isin(new_kinds)]
    assert not below.empty and (below["win_pct_of_step"] < 2.0).all()
    assert not set(below["kind"]) & {"unfused_optimizer", "allocator_calls"}
