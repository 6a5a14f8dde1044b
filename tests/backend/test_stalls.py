"""Stall breakdown (METRICS.md, "Stalls") against the stall ratios read by hand from the CSVs."""

from __future__ import annotations

import csv
import os
import shutil

import numpy as np
import pytest

from tessera_tb.backend.stalls import CATEGORY_OF, kernel_stalls, stall_breakdown
from tessera_tb.importers.ncu_attach import import_ncu
from tessera_tb.importers.ncu_csv import STALL_REASONS, counter_profile, read_ncu_csv
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, SHARED_TRACES

MICRO = os.path.join(SHARED_TRACES, "ncu", "microkernels_raw.csv")
GPT = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")
RATIO = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# METRICS.md, "Stalls"
MEMORY = {"long_scoreboard", "short_scoreboard", "lg_throttle", "mio_throttle", "tex_throttle",
          "drain", "membar", "imc_miss"}  # fmt: skip
DEPENDENCY = {"wait", "barrier", "gmma", "branch_resolving", "sleeping"}
STRUCTURAL = {"math_pipe_throttle", "dispatch_stall", "no_instruction", "misc"}


def _hand(path: str) -> tuple[dict[str, int], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return {n: j for j, n in enumerate(rows[0])}, rows[2:]


def _num(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.fixture(scope="module", params=[MICRO, GPT], ids=["micro", "gpt"])
def profile(request):
    return counter_profile(read_ncu_csv(request.param))


def test_the_csvs_hold_the_17_stall_reasons_plus_selected_and_not_selected():
    for path in (MICRO, GPT):
        col, _ = _hand(path)
        reasons = {n[len("smsp__average_warps_issue_stalled_") : -len("_per_issue_active.ratio")]
                   for n in col if n.startswith("smsp__average_warps_issue_stalled_")}  # fmt: skip
        assert reasons == MEMORY | DEPENDENCY | STRUCTURAL | {"selected", "not_selected"}


def test_reasons_fall_into_the_metrics_categories():
    assert set(STALL_REASONS) == MEMORY | DEPENDENCY | STRUCTURAL
    assert {r for r, c in CATEGORY_OF.items() if c == "memory"} == MEMORY
    assert {r for r, c in CATEGORY_OF.items() if c == "dependency"} == DEPENDENCY
    assert {r for r, c in CATEGORY_OF.items() if c == "structural"} == STRUCTURAL


def test_every_kernel_gets_shares_that_sum_to_100(profile):
    k = kernel_stalls(profile)
    stalls = k[k["category"] != "not a stall"]
    sums = stalls.groupby("profiled_id")["share_pct"].sum()
    assert len(sums) == profile.count
    np.testing.assert_allclose(sums, 100.0)
    assert k.loc[k["reason"].isin(["selected", "not_selected"]), "share_pct"].isna().all()


def test_a_kernel_share_is_its_ratio_over_the_sum_of_the_17(profile):
    path = MICRO if profile.count == 34 else GPT
    col, rows = _hand(path)
    k = kernel_stalls(profile).set_index(["profiled_id", "reason"])
    for r in rows[:12]:
        ratios = {x: _num(r[col[RATIO.format(x)]]) for x in STALL_REASONS}
        total = sum(ratios.values())
        for reason, ratio in ratios.items():
            got = k.loc[(int(r[col["ID"]]), reason)]
            assert got["cycles_per_issued_inst"] == pytest.approx(ratio)
            assert got["share_pct"] == pytest.approx(100 * ratio / total)


def test_the_total_is_weighted_by_issued_instructions_not_by_duration():
    col, rows = _hand(MICRO)
    issued = np.array([_num(r[col["smsp__inst_issued.sum"]]) for r in rows])
    dur = np.array([_num(r[col["gpu__time_duration.sum"]]) for r in rows])
    ratio = {x: np.array([_num(r[col[RATIO.format(x)]]) for r in rows]) for x in STALL_REASONS}
    cycles = {x: float((ratio[x] * issued).sum()) for x in STALL_REASONS}
    by_duration = {x: float((ratio[x] * dur).sum()) for x in STALL_REASONS}
    total = sum(cycles.values())

    result = stall_breakdown(counter_profile(read_ncu_csv(MICRO)), group_by="total")
    assert result.available
    table = result.table.set_index("reason")
    for x in STALL_REASONS:
        assert table.loc[x, "stall_warp_cycles"] == pytest.approx(cycles[x])
        assert table.loc[x, "share_pct"] == pytest.approx(100 * cycles[x] / total)
    assert table.loc[list(STALL_REASONS), "share_pct"].sum() == pytest.approx(100)
    top = max(cycles, key=cycles.get)
    dur_share = 100 * by_duration[top] / sum(by_duration.values())
    assert abs(table.loc[top, "share_pct"] - dur_share) > 1  # the weighting matters here
    assert table.loc["selected", "category"] == "not a stall"


def test_issued_instructions_fall_back_to_the_sm_level_rate_times_active_cycles():
    # gpt_step_raw.csv has no smsp__inst_issued.sum; the fallback reproduces the counter
    # where both exist (microkernels_raw.csv).
    col, rows = _hand(MICRO)
    assert "smsp__inst_issued.sum" not in _hand(GPT)[0]
    p = counter_profile(read_ncu_csv(MICRO))
    del p.metrics["smsp__inst_issued.sum"]
    del p.metrics["smsp__issue_active.sum.per_cycle_active"]
    k = kernel_stalls(p)
    issued = k[k["reason"] == "wait"].set_index("profiled_id")["issued_inst"]
    for r in rows:
        assert issued[int(r[col["ID"]])] == pytest.approx(
            _num(r[col["smsp__inst_issued.sum"]]), rel=1e-6
        )
    gpt = kernel_stalls(counter_profile(read_ncu_csv(GPT)))
    assert set(gpt["issued_source"]) == {
        "sm__inst_issued.sum.per_cycle_active x sm__cycles_active.avg"
    }


def test_kernels_smaller_than_one_wave_are_low_confidence():
    col, rows = _hand(GPT)
    limits = ["launch__occupancy_limit_" + x for x in
              ("blocks", "registers", "shared_mem", "warps", "barriers")]  # fmt: skip
    small = {
        int(r[col["ID"]])
        for r in rows
        if _num(r[col["launch__grid_size"]])
        < _num(r[col["launch__sm_count"]]) * min(_num(r[col[m]]) for m in limits)
    }
    assert 0 in small  # a one-block fill
    k = kernel_stalls(counter_profile(read_ncu_csv(GPT)))
    flagged = set(k.loc[k["low_confidence"], "profiled_id"])
    assert flagged == small


@pytest.fixture(scope="module")
def attached_run(tmp_path_factory):
    dest = tmp_path_factory.mktemp("stalls") / "gpt_1gpu"
    shutil.copytree(os.path.join(DEMO_RUNS, "gpt_1gpu"), dest)
    counters = dest / "plugins" / "tessera" / "worker0" / "kernel_counters.pb"
    if counters.exists():
        counters.unlink()
    import_ncu(GPT, str(dest))
    return open_run(str(dest))


@pytest.mark.parametrize("group_by", ["instance", "kernel", "op", "step", "total"])
def test_run_breakdowns_sum_to_100_per_group(attached_run, group_by):
    result = stall_breakdown(attached_run, group_by=group_by)
    assert result.available
    t = result.table
    keys = {"instance": ["worker", "step", "row", "kernel_name"], "kernel": ["kernel_name"],
            "op": ["op_name"], "step": ["worker", "step"], "total": []}[group_by]  # fmt: skip
    stalls = t[t["category"] != "not a stall"]
    sums = stalls.groupby(keys)["share_pct"].sum() if keys else stalls["share_pct"].sum()
    np.testing.assert_allclose(sums, 100.0)
    if group_by == "step":
        assert set(t["step"]) == {4, 5}
        assert t.groupby("step")["kernels"].first().sum() == 98  # every matched kernel


def test_without_counters_it_says_what_is_missing_and_how_to_collect_it(imported_runs):
    trace_dir = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
    trace = next(os.path.join(trace_dir, f) for f in os.listdir(trace_dir) if f.endswith(".gz"))
    run = open_run(imported_runs(trace))
    result = stall_breakdown(run)
    assert not result.available and result.table.empty
    assert "smsp__inst_issued.sum" in result.missing_counters
    assert RATIO.format("long_scoreboard") in result.missing_counters
    cmd = result.collect_command
    assert cmd.startswith(f"tessera-prof counters {run.path} -- <your training command>\n")
    assert "--section WarpStateStats" in cmd and "smsp__inst_issued.sum" in cmd
