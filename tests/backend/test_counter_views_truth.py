"""What the views show from `tessera-prof counters` data equals the Nsight Compute CSV cells.

Run: GPT-2 (transformers, H100) with the ncu CSV of one instance per distinct kernel of step 3
joined by `ncu_step_join` (tests/data/ncu_step). The expected numbers below were read by hand
from tests/data/ncu_step/gpt2_step3_raw.csv.gz (ncu IDs = launch index in step 3):

- ID 7, `vectorized_layer_norm_kernel`, grid (2048,1,1) block (32,4,1):
  sm__warps_active.avg.pct_of_peak_sustained_active 57.979833 %;
  smsp__thread_inst_executed_per_inst_executed.ratio 29.87 -> divergence 100 x (1 - 29.87/32)
  = 6.65625 %; lts__t_sector_hit_rate.pct 57.258142.
- ID 11, `nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_bias_NNT`, grid (2,64,1) block (384,1,1):
  occupancy 14.586089 %; the 17 stall ratios (barrier 1.028914, branch_resolving 0.078809,
  dispatch_stall 0.094930, drain 0.009667, gmma 1.974798, imc_miss 0.622950, lg_throttle
  0.000685, long_scoreboard 4.638140, math_pipe_throttle 0.251253, membar 0, mio_throttle
  0.993168, misc 0.004547, no_instruction 1.223866, short_scoreboard 0.188075, sleeping
  0.156552, tex_throttle 0, wait 1.524782) sum to 12.791136, so long scoreboard is
  4.638140 / 12.791136 = 36.2607 % of its stall cycles; bf16 tensor FLOPs 3,221,225,472.
- ID 151, `cunn_SoftMaxForward`, grid (2048,1,1) block (1024,1,1): occupancy 93.32627 %;
  31.99 threads per instruction -> divergence 100 x (1 - 31.99/32) = 0.03125 %; long
  scoreboard 93.856328 cycles per issued instruction.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tessera import analyze
from tessera.profile.records import kernel_records
from tessera_tb.importers.ncu_attach import run_kernel_sequence, store_counters
from tessera_tb.importers.ncu_csv import NcuTable, read_ncu_csv
from tessera_tb.importers.ncu_step_join import join_steps, profiled_keys
from tessera_tb.trace import open_run
from tests.conftest import ROOT

DATA = os.path.join(ROOT, "tests", "data", "ncu_step")
HAND = {
    7: {"occ": 57.979833, "div": 100 * (1 - 29.87 / 32), "l2": 57.258142},
    11: {"occ": 14.586089, "div": 100 * (1 - 31.88 / 32), "long_sb_share": 4.638140 / 12.791136},
    151: {"occ": 93.32627, "div": 100 * (1 - 31.99 / 32), "long_sb_ratio": 93.856328},
}


@pytest.fixture(scope="module")
def run_with_counters(tmp_path_factory):
    dest = str(tmp_path_factory.mktemp("runs") / "gpt2")
    shutil.copytree(os.path.join(DATA, "gpt2"), dest)
    table = read_ncu_csv(os.path.join(DATA, "gpt2_step3_raw.csv.gz"))
    first: dict[str, int] = {}
    for i, k in enumerate(profiled_keys(table)):
        first.setdefault(k, i)
    keep = np.array(sorted(first.values()))  # one instance per distinct kernel, as ncu keeps
    assert {7, 11, 151} <= set(keep.tolist())
    sub = NcuTable(table.path, table.kernel_names[keep], keep.astype(np.int64),
                   {k: v[keep] for k, v in table.values.items()}, table.units,
                   table.source_units, {k: v[keep] for k, v in table.text.items()})  # fmt: skip
    run = open_run(dest)
    profile, _ = join_steps(sub, run_kernel_sequence(run, "worker0"), worker="worker0")
    store_counters(dest, run, profile)
    return dest


def _launch(run, step: int, index: int) -> tuple[int, int]:
    """(row, start_ns) of launch `index` of `step` in the run."""
    rk = run_kernel_sequence(run, "worker0")
    row = int(rk.row[np.flatnonzero(rk.step == step)[index]])
    return row, int(run.load_step("worker0", step).events["start_ns"][row])


def test_records_show_the_csv_cells_measured_and_for_the_same_kernel_elsewhere(
    run_with_counters,
):
    run = open_run(run_with_counters)
    records = {(r["step"], r["start_ns"]): r for r in kernel_records(run)}
    for launch, hand in HAND.items():
        _, start = _launch(run, 3, launch)
        r = records[(3, start)]
        assert r["sm_occupancy"] == pytest.approx(hand["occ"], abs=1e-6)
        assert r["warp_divergence_pct"] == pytest.approx(hand["div"], abs=1e-9)
        assert r["capabilities"]["sm_occupancy"] == "measured"
        # the same launch of step 4 was not profiled: same values, tagged as such
        _, start4 = _launch(run, 4, launch)
        r4 = records[(4, start4)]
        assert r4["sm_occupancy"] == r["sm_occupancy"]
        assert r4["capabilities"]["sm_occupancy"] == "measured:same-kernel-instance"
    _, start = _launch(run, 3, 7)
    assert records[(3, start)]["l2_hit_rate"] == pytest.approx(HAND[7]["l2"], abs=1e-6)


def test_stalls_show_the_csv_ratios_and_shares_sum_to_100(run_with_counters):
    run = open_run(run_with_counters)
    table = analyze.stalls(trace=run_with_counters, group_by="instance", steps=[3])
    assert table.attrs["available"]
    stalls = table[table.category != "not a stall"]
    sums = stalls.groupby(["step", "row"]).share_pct.sum()
    assert np.allclose(sums.to_numpy(), 100.0, atol=1e-9) and len(sums) == 388
    row11, _ = _launch(run, 3, 11)
    g = stalls[(stalls.row == row11)].set_index("reason")
    assert g.loc["long_scoreboard", "share_pct"] == pytest.approx(
        100 * HAND[11]["long_sb_share"], abs=1e-4
    )
    assert g.index[0] == "long_scoreboard"  # the largest share first
    row151, _ = _launch(run, 3, 151)
    g = stalls[(stalls.row == row151)].set_index("reason")
    assert g.loc["long_scoreboard", "cycles_per_issued_inst"] == pytest.approx(
        HAND[151]["long_sb_ratio"], abs=1e-6
    )


def test_divergence_and_overview_use_the_measured_counters(run_with_counters):
    div = analyze.divergence(trace=run_with_counters, threshold=0.05, steps=[3])
    layer_norm = div[div.kernel_name.str.contains("vectorized_layer_norm_kernel")]
    assert len(layer_norm) == 1
    # 3 launches of that name in step 3 (one per layer norm position); issued-weighted mean
    assert layer_norm.warp_divergence_pct.iloc[0] > 5.0
    s = analyze.summary(trace=run_with_counters, steps=[3])
    assert s.sm_occupancy_note.iloc[0].startswith("measured on 388 kernel(s)")
    # 83 launches of step 3 were profiled; the other 305 carry their kernel instance's counters
    assert s.sm_occupancy_note.iloc[0].endswith(
        "; 305 of them with the counters of another launch of the same kernel "
        "(measured:same-kernel-instance)"
    )
    assert 0 < s.tensor_core_time_pct.iloc[0] < 100


def test_counter_findings_name_the_kernel_the_numbers_and_the_rule(run_with_counters):
    """ID 151 (`cunn_SoftMaxForward`, one launch per step), by hand from the CSV:
    sm__throughput 13.362637 %, gpu__compute_memory_throughput 84.624328 % -> speed of light
    84.624328 %; gpu__dram_throughput 84.624328 %; its 17 stall ratios sum to 106.947522, long
    scoreboard 93.856328 -> 87.76 % of its stall cycles. Win = its run duration x (1 - 0.846)."""
    from tessera_tb.backend.counter_findings import counter_findings

    run = open_run(run_with_counters)
    row, _ = _launch(run, 3, 151)
    dur = float(run.load_step("worker0", 3).events["dur_ns"][row])
    rows = counter_findings(run, ["worker0"], {"worker0": (3,)}, {"worker0": 20e6}, 0.0, top=500)
    soft = [r for r in rows if "cunn_SoftMaxForward" in r["subject"]]
    assert len(soft) == 1
    f = soft[0]
    assert f["title"].startswith("`cunn_SoftMaxForward<")
    assert f["title"].endswith("`: 88% of stall cycles on long scoreboard; DRAM at 85% of peak")
    n = f["numbers"]
    assert n["sol_pct"] == pytest.approx(84.624328, abs=1e-6)
    assert n["stalls"][0][0] == "long_scoreboard"
    assert n["stalls"][0][1] == pytest.approx(100 * 93.856328 / 106.947522, abs=1e-4)
    assert f["win_ms_per_step"] == pytest.approx(dur * (1 - 0.84624328) / 1e6, rel=1e-9)
    assert "Rule: speed-of-light headroom" in f["evidence"]
    assert "1 launch(es) measured" in f["evidence"]
    # ranked: larger wins first; with a 2% floor on a 20 ms step none below 0.4 ms is kept
    wins = [r["win_ms_per_step"] for r in rows]
    assert wins == sorted(wins, reverse=True)
    kept = counter_findings(run, ["worker0"], {"worker0": (3,)}, {"worker0": 20e6}, 2.0)
    assert all(r["win_ms_per_step"] >= 0.4 for r in kept)
    # other steps: the same kernel's counters stand for the launch of step 4
    rows4 = counter_findings(run, ["worker0"], {"worker0": (4,)}, {"worker0": 20e6}, 0.0, top=500)
    f4 = next(r for r in rows4 if "cunn_SoftMaxForward" in r["subject"])
    assert "0 launch(es) measured, 1 with the counters of the same kernel's" in f4["evidence"]


def test_roofline_points_say_whose_counters_they_carry(run_with_counters):
    own = analyze.roofline(trace=run_with_counters, steps=[3])
    other = analyze.roofline(trace=run_with_counters, steps=[4])
    soft3 = own[own.kernel_name.str.contains("cunn_SoftMaxForward")]
    soft4 = other[other.kernel_name.str.contains("cunn_SoftMaxForward")]
    assert soft3.counters_same_instance_pct.tolist() == [0.0]  # step 3's launch was profiled
    assert soft4.counters_same_instance_pct.tolist() == [100.0]  # step 4's stands in
    assert soft3.flops.tolist() == soft4.flops.tolist()
    measured = other[other.flops_source.isin(["measured", "partial"])]
    assert len(measured) > 0 and (measured.counters_same_instance_pct == 100.0).all()


def test_stalls_count_the_kernels_measured_on_another_launch(run_with_counters):
    by_kernel3 = analyze.stalls(trace=run_with_counters, group_by="kernel", steps=[3])
    by_kernel4 = analyze.stalls(trace=run_with_counters, group_by="kernel", steps=[4])
    soft3 = by_kernel3[by_kernel3.kernel_name.str.contains("cunn_SoftMaxForward")]
    soft4 = by_kernel4[by_kernel4.kernel_name.str.contains("cunn_SoftMaxForward")]
    assert set(soft3.same_instance_kernels) == {0} and set(soft4.same_instance_kernels) == {1}
    assert (by_kernel4.same_instance_kernels == by_kernel4.kernels).all()
    # step 3: one launch per distinct kernel was profiled, the others stand in
    assert (
        by_kernel3.drop_duplicates("kernel_name").eval("kernels - same_instance_kernels").sum()
        == 83
    )
