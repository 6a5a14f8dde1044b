"""Roofline FLOPs, bytes and efficiency (METRICS.md, "Roofline") against GEMM shapes, the CSV
read by hand, CUPTI range counters read from the JSON, and the trace's Input Dims."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil

import numpy as np
import pytest

from tessera_tb.backend.devices import device_peaks
from tessera_tb.backend.roofline import (
    counter_roofline,
    derived_op_work,
    measured_work,
    profiler_range_work,
    roofline,
)
from tessera_tb.importers.ncu_attach import import_ncu
from tessera_tb.importers.ncu_csv import counter_profile, read_ncu_csv
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, SHARED_TRACES

MICRO = os.path.join(SHARED_TRACES, "ncu", "microkernels_raw.csv")
GPT = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")
CUPTI = os.path.join(
    SHARED_TRACES, "hta_tests", "cupti_profiler", "benchmark_result_924719_1679055439_trace.json.gz"
)
H200 = device_peaks("NVIDIA H200")

# capture_scripts/train_gpt.py defaults: d=1024, seq 1024, batch 8, vocab 32000, 4 layers.
TOKENS, D, VOCAB = 8 * 1024, 1024, 32000
GPT_LINEARS = [(TOKENS, 3 * D, D), (TOKENS, D, D), (TOKENS, 4 * D, D), (TOKENS, D, 4 * D)]
LM_HEAD = (TOKENS, VOCAB, D)


def _hand(path: str) -> tuple[dict[str, int], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return {n: j for j, n in enumerate(rows[0])}, rows[2:]


def _num(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.fixture(scope="module")
def micro():
    return counter_profile(read_ncu_csv(MICRO))


@pytest.fixture(scope="module")
def gpt():
    return counter_profile(read_ncu_csv(GPT))


def test_the_4096_cubed_bf16_gemm_measures_exactly_2mnk(micro):
    work = measured_work(micro)
    gemm = np.flatnonzero([n.startswith("nvjet") for n in micro.kernel_names])
    assert gemm.size == 2  # kernels.py runs the GEMM twice
    assert (work["tensor_flops"].to_numpy()[gemm] == 2 * 4096**3).all()
    assert (work["path"].to_numpy()[gemm] == "bf16").all()


def test_every_gpt_gemm_measures_exactly_2mnk_of_its_layer(gpt):
    work = measured_work(gpt)
    gemm = [i for i, n in enumerate(gpt.kernel_names) if n.startswith("nvjet")]
    expected = [2 * m * n * k for m, n, k in GPT_LINEARS * 4 + [LM_HEAD]]
    assert work["tensor_flops"].to_numpy()[gemm].tolist() == expected


def test_the_fp32_gemm_counts_2_n_cubed_sass_flops_within_0_1_pct(micro):
    work = measured_work(micro)
    sgemm = np.flatnonzero(["sgemm" in n for n in micro.kernel_names])
    assert sgemm.size == 2
    flops = work["fp32_flops"].to_numpy()[sgemm]
    np.testing.assert_allclose(flops, 2 * 2048**3, rtol=1e-3)
    assert (work["tensor_flops"].to_numpy()[sgemm] == 0).all()
    assert (work["path"].to_numpy()[sgemm] == "fp32").all()


def test_fp32_flops_are_fadd_plus_fmul_plus_twice_ffma_times_elapsed_cycles(micro):
    col, rows = _hand(MICRO)
    work = measured_work(micro)

    def per_cycle(op: str, r: list[str]) -> float:
        return _num(
            r[col[f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed"]]
        )

    for i, r in enumerate(rows):
        cycles = _num(r[col["smsp__cycles_elapsed.avg"]])
        hand = (per_cycle("fadd", r) + per_cycle("fmul", r) + 2 * per_cycle("ffma", r)) * cycles
        assert work["fp32_flops"][i] == pytest.approx(hand, rel=1e-12, abs=1e-6)


def test_dram_bytes_from_read_plus_write_equal_rate_times_duration_within_1_pct(micro):
    col, rows = _hand(MICRO)
    work = measured_work(micro)
    assert set(work["bytes_source"]) == {"read+write"}
    for i, r in enumerate(rows):
        read_write = _num(r[col["dram__bytes_read.sum"]]) + _num(r[col["dram__bytes_write.sum"]])
        assert work["dram_bytes"][i] == pytest.approx(read_write * 1e6)  # Mbyte columns
        rate_bytes = (
            _num(r[col["dram__bytes.sum.per_second"]])
            * 1e12
            * (_num(r[col["gpu__time_duration.sum"]]) * 1e-6)
        )  # Tbyte/s x us
        assert work["dram_bytes"][i] == pytest.approx(rate_bytes, rel=0.01)


def test_without_read_and_write_sums_bytes_are_rate_times_duration(gpt):
    col, rows = _hand(GPT)
    assert "dram__bytes_read.sum" not in col
    work = measured_work(gpt)
    assert set(work["bytes_source"]) == {"rate x duration"}
    hand = [
        _num(r[col["dram__bytes.sum.per_second"]]) * 1e12 * _num(r[col["gpu__time_duration.sum"]])
        * 1e-6
        for r in rows
    ]  # fmt: skip
    np.testing.assert_allclose(work["dram_bytes"], hand, rtol=1e-12)


def test_efficiency_is_against_the_dense_peak_not_ncus_sparse_percentage(micro):
    col, rows = _hand(MICRO)
    points = counter_roofline(micro, H200)
    for i in np.flatnonzero([n.startswith("nvjet") for n in micro.kernel_names]):
        dur_s = _num(rows[i][col["gpu__time_duration.sum"]]) * 1e-6
        achieved = 2 * 4096**3 / dur_s
        assert points["flops_per_s"][i] == pytest.approx(achieved)
        assert points["efficiency_pct"][i] == pytest.approx(100 * achieved / 989e12)
        assert 75 < points["efficiency_pct"][i] < 80  # ~78 % of 989 TFLOP/s
        ncu_pct = _num(
            rows[i][col["sm__ops_path_tensor_src_bf16_dst_fp32.sum.pct_of_peak_sustained_elapsed"]]
        )
        assert ncu_pct < 50  # Nsight Compute's figure is against the sparse peak
        # The dense counter ceiling at the observed clock, shown beside the datasheet roof.
        ceiling = (
            _num(
                rows[i][
                    col[
                        "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum.peak_sustained"
                    ]
                ]
            )
            * _num(rows[i][col["sm__cycles_elapsed.avg.per_second"]])
            * 1e9
        )
        assert points["counter_ceiling_flops_per_s"][i] == pytest.approx(ceiling)


def test_headroom_is_time_minus_time_at_the_roof(micro):
    points = counter_roofline(micro, H200)
    f, b, t = points["flops"], points["dram_bytes"], points["dur_ns"]
    peak = np.array([H200.peak_flops_per_s(p) or np.nan for p in points["path"]])
    at_roof_ns = np.maximum(np.where(f > 0, f / peak, 0.0), b / 4.8e12) * 1e9
    np.testing.assert_allclose(points["headroom_ms"], (t - at_roof_ns) / 1e6)
    x = f / b
    has = f > 0
    np.testing.assert_allclose(
        points["efficiency_pct"][has],
        100 * (f / (t * 1e-9))[has] / np.minimum(peak, 4.8e12 * x)[has],
    )


def test_flops_with_xu_pipe_work_and_no_tensor_work_are_partial(micro):
    work = measured_work(micro)
    names = micro.kernel_names
    gelu = [i for i, n in enumerate(names) if "Gelu" in n]
    gemm = [i for i, n in enumerate(names) if n.startswith("nvjet") or "sgemm" in n]
    assert set(work["flops_source"][gelu]) == {"partial"}  # tanh/erf on the MUFU
    assert set(work["flops_source"][gemm]) == {"measured"}


def test_cupti_range_profiler_counters_give_measured_flops(imported_runs):
    with gzip.open(CUPTI, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "cuda_profiler_range"]
    run = open_run(imported_runs(CUPTI))
    worker = next(iter(run.workers))
    work = profiler_range_work(run.load_step(worker, run.steps[0]))
    assert len(work) == len(events)
    by_start = work.sort_values("start_ns")

    def c(e, op):
        return e["args"][f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"]

    fp32 = [c(e, "fadd") + c(e, "fmul") + 2 * c(e, "ffma") for e in events]
    fp64 = [c(e, "dadd") + c(e, "dmul") + 2 * c(e, "dfma") for e in events]
    fp16 = [2 * c(e, "hadd") + 2 * c(e, "hmul") + 4 * c(e, "hfma") for e in events]
    assert by_start["fp32_flops"].tolist() == fp32
    assert by_start["fp64_flops"].tolist() == fp64
    assert by_start["fp16_vector_flops"].tolist() == fp16
    assert by_start["flops"].tolist() == [a + b + h for a, b, h in zip(fp32, fp64, fp16)]
    assert max(fp32) == 2 * 9119334400 + 24780800


@pytest.fixture(scope="module")
def demo_step():
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    return run.load_step("worker0", 5)


def test_matmul_flops_are_derived_as_2mnk_from_input_dims(demo_step):
    work = derived_op_work(demo_step)
    names = demo_step.string_values(demo_step.events["name_id"][work.index.to_numpy()])
    dims = demo_step.attr("Input Dims")
    mm = [row for row, name in zip(work.index, names) if name in ("aten::mm", "aten::addmm")]
    assert len(mm) > 30
    for row in mm:
        shapes = [s for s in json.loads(dims[row]) if len(s) == 2]  # addmm: bias [N] first
        (m, k), (_, n) = shapes[-2], shapes[-1]
        assert work.loc[row, "flops"] == 2 * m * n * k
        assert work.loc[row, "flops_source"] == "derived"
        assert work.loc[row, "path"] == "bf16"


def test_causal_attention_counts_useful_flops_and_backward_is_2_5x(demo_step):
    work = derived_op_work(demo_step)
    names = demo_step.string_values(demo_step.events["name_id"][work.index.to_numpy()])
    full = 2 * 8 * 16 * 1024 * 1024 * (64 + 64)  # B, H, Sq, Sk, Dqk + Dv of the GPT
    fwd = work[names == "aten::_cudnn_attention_forward"]
    bwd = work[names == "aten::_cudnn_attention_backward"]
    assert len(fwd) == len(bwd) == 4
    assert (fwd["flops"] == full * 1025 / 2048).all()
    assert (bwd["flops"] == 2.5 * full * 1025 / 2048).all()


@pytest.fixture(scope="module")
def attached_run(tmp_path_factory):
    dest = tmp_path_factory.mktemp("roofline") / "gpt_1gpu"
    shutil.copytree(os.path.join(DEMO_RUNS, "gpt_1gpu"), dest)
    counters = dest / "plugins" / "tessera" / "worker0" / "kernel_counters.pb"
    if counters.exists():
        counters.unlink()
    import_ncu(GPT, str(dest))
    return open_run(str(dest))


def test_a_run_roofline_uses_measured_flops_for_matched_kernels(attached_run):
    points = roofline(attached_run, group_by="kernel")
    measured = points[points["flops_source"] == "measured"].set_index("kernel_name")
    bias_gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT"
    row = measured.loc[bias_gemm]
    assert row["count"] == 16
    tensor = sum(2 * m * n * k for m, n, k in GPT_LINEARS) * 4
    assert row["flops"] >= tensor  # plus the bias additions counted by SASS
    assert row["flops"] == pytest.approx(tensor, rel=1e-3)
    assert row["time_source"] == "run"
    assert set(points["worker"]) == {"worker0"}
    assert (points["dur_ns"].diff().dropna() <= 0).all()  # longest first


def test_a_run_roofline_per_op_has_measured_and_derived_points(attached_run):
    points = roofline(attached_run, group_by="op", steps=[5])
    head = points[(points["op_name"] == "aten::mm")
                  & (points["op_input_dims"] == "[[8192,1024],[1024,32000]]")]  # fmt: skip
    assert head["flops_source"].tolist() == ["measured"]
    assert head["flops"].iloc[0] == 2 * TOKENS * VOCAB * D
    backward = points[(points["op_name"] == "aten::mm")
                      & (points["op_input_dims"] == "[[8192,32000],[32000,1024]]")]  # fmt: skip
    assert backward["flops_source"].tolist() == ["derived"]
    assert backward["flops"].iloc[0] == 2 * TOKENS * VOCAB * D
    assert (points["efficiency_pct"].dropna() > 0).all()


def test_a_run_without_counters_has_derived_points_only(imported_runs):
    trace_dir = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
    trace = next(os.path.join(trace_dir, f) for f in os.listdir(trace_dir) if f.endswith(".gz"))
    run = open_run(imported_runs(trace))
    points = roofline(run, steps=[5])
    assert not points["flops_source"].isin(["measured", "partial"]).any()
    assert (points["flops_source"] == "derived").any()
    assert points.loc[points["flops_source"] == "none", "flops"].isna().all()
