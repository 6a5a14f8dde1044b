"""Kernel selection and the step join of `tessera-prof counters`, on real runs and ncu CSVs of
GPT-2 and ResNet-50 taken on an H100 (tests/data/ncu_step/README.md)."""

from __future__ import annotations

import csv
import gzip
import os

import numpy as np
import pytest

from tessera_tb.importers.ncu_attach import run_kernel_sequence
from tessera_tb.importers.ncu_csv import NcuTable, read_ncu_csv
from tessera_tb.importers.ncu_selection import kernel_key, plan_counters
from tessera_tb.importers.ncu_step_join import (
    concat_tables,
    join_steps,
    nvtx_steps,
    profiled_keys,
)
from tessera_tb.trace import open_run
from tessera_tb.trace.kernel_counters import MATCH_INSTANCE, MATCH_NAME, MATCH_NONE
from tests.conftest import ROOT

DATA = os.path.join(ROOT, "tests", "data", "ncu_step")


@pytest.fixture(scope="module")
def gpt2():
    run = open_run(os.path.join(DATA, "gpt2"))
    return (
        run,
        run_kernel_sequence(run, "worker0"),
        read_ncu_csv(os.path.join(DATA, "gpt2_step3_raw.csv.gz")),
    )


@pytest.fixture(scope="module")
def resnet():
    run = open_run(os.path.join(DATA, "resnet50"))
    return (
        run,
        run_kernel_sequence(run, "worker0"),
        read_ncu_csv(os.path.join(DATA, "resnet50_step3_first250_raw.csv.gz")),
    )


def _raw_rows(name: str) -> list[list[str]]:
    with gzip.open(os.path.join(DATA, name), "rt", encoding="utf-8") as f:
        return list(csv.reader(f))


def _subset(table: NcuTable, keep: np.ndarray) -> NcuTable:
    return NcuTable(
        table.path,
        table.kernel_names[keep],
        np.arange(keep.size, dtype=np.int64),  # ncu numbers what it profiled 0, 1, 2, ...
        {k: v[keep] for k, v in table.values.items()},
        table.units,
        table.source_units,
        {k: v[keep] for k, v in table.text.items()},
    )


def _one_per_configuration(table: NcuTable) -> NcuTable:
    """What `--filter-mode per-launch-config --launch-count 1` keeps of a step: the first
    launch of each (name, grid, block)."""
    first: dict[str, int] = {}
    for i, k in enumerate(profiled_keys(table)):
        first.setdefault(k, i)
    return _subset(table, np.array(sorted(first.values())))


def test_plan_counts_the_distinct_kernels_of_the_second_recorded_step(gpt2, resnet):
    for (run, rk, _), distinct, launches in ((gpt2, 83, 388), (resnet, 185, 865)):
        plan = plan_counters(run, "worker0", run_kernels=rk)
        assert plan.steps == [3] and plan.step_launches == launches
        assert len(plan.distinct) == plan.kernels_to_profile == distinct
        assert sum(d.launches for d in plan.distinct) == launches
        # distinct by hand: (name, grid, block) of step 3's kernels in the step file
        step = run.load_step("worker0", 3)
        ev = step.events
        rows = np.flatnonzero(ev["kind"] == 6)  # KIND kernel
        names = step.string_values(ev["name_id"][rows])
        grid = step.attr("grid").reindex(rows).to_numpy(object)
        block = step.attr("block").reindex(rows).to_numpy(object)
        assert len(set(zip(names, grid, block))) == distinct
        args = plan.filter_args()
        assert args == ["--nvtx", "--nvtx-include", "tessera_step_3", "--kernel-name-base",
                        "demangled", "--filter-mode", "per-launch-config", "--launch-count",
                        "1"]  # fmt: skip
        all_plan = plan_counters(run, "worker0", all_launches=True, run_kernels=rk)
        assert all_plan.kernels_to_profile == launches
        assert "--filter-mode" not in all_plan.filter_args()


def test_kernels_and_max_kernels_keep_the_heaviest_matching_kernels(gpt2):
    run, rk, _ = gpt2
    full = plan_counters(run, "worker0", run_kernels=rk)
    plan = plan_counters(run, "worker0", kernels="elementwise", max_kernels=3, run_kernels=rk)
    heaviest = sorted(
        (d for d in full.distinct if "elementwise" in d.name), key=lambda d: -d.dur_ns
    )[:3]
    assert {(d.name, d.config) for d in plan.distinct} == {(d.name, d.config) for d in heaviest}
    assert plan.narrowed and plan.all_distinct == 83
    name_filter = plan.filter_args()[plan.filter_args().index("--kernel-name") + 1]
    assert name_filter.startswith("regex:^(") and "elementwise" in name_filter
    with pytest.raises(ValueError, match="matches none"):
        plan_counters(run, "worker0", kernels="no_such_kernel", run_kernels=rk)
    with pytest.raises(ValueError, match="has no step 7"):
        plan_counters(run, "worker0", steps=[7], run_kernels=rk)


def test_every_launch_of_the_step_joins_by_launch_order(gpt2):
    run, rk, table = gpt2
    assert set(nvtx_steps(table).tolist()) == {3}
    profile, info = join_steps(table, rk, worker="worker0")
    assert info.exact_steps == [3] and info.profiled_matched == 388 and info.mismatched == 0
    assert (info.launches_measured, info.launches_same_instance, info.launches_without) == (
        388, 776, 0
    )  # fmt: skip
    step3 = np.flatnonzero(rk.step == 3)
    own = profile.match == MATCH_NAME
    # profiled row i (ncu ID i) is launch i of step 3
    by_row = dict(zip(profile.row[own].tolist(), profile.profiled_id[own].tolist()))
    assert [by_row[r] for r in rk.row[step3].tolist()] == list(range(388))
    # launch i of step 2 and 4 carries the counters of ncu row i (same key at that position)
    inst = profile.match == MATCH_INSTANCE
    for s in (2, 4):
        launches = np.flatnonzero(rk.step == s)
        got = dict(zip(profile.row[inst & (profile.step == s)].tolist(),
                       profile.profiled_id[inst & (profile.step == s)].tolist()))  # fmt: skip
        assert [got[r] for r in rk.row[launches].tolist()] == list(range(388))


def test_one_instance_per_kernel_stands_for_every_launch_of_that_kernel(gpt2):
    run, rk, table = gpt2
    sub = _one_per_configuration(table)
    assert sub.count == 83
    profile, info = join_steps(sub, rk, worker="worker0")
    assert info.exact_steps == []  # not every launch was profiled
    assert (info.launches_measured, info.launches_same_instance, info.launches_without) == (
        83, 1081, 0
    )  # fmt: skip
    assert info.distinct_covered == info.distinct_run == 83 and not info.missing_keys
    # each profiled instance is the first launch of its key in step 3
    keys = [kernel_key(n, c) for n, c in zip(rk.names, rk.launch_config)]
    step3 = np.flatnonzero(rk.step == 3)
    first = {}
    for j in step3:
        first.setdefault(keys[j], int(rk.row[j]))
    own = profile.match == MATCH_NAME
    skeys = profiled_keys(sub)
    for pid, row in zip(profile.profiled_id[own].tolist(), profile.row[own].tolist()):
        assert first[skeys[pid]] == row
    # every same-instance launch has the key of the row whose counters it carries
    inst = np.flatnonzero(profile.match == MATCH_INSTANCE)
    launch_of = {(int(s), int(r)): j for j, (s, r) in enumerate(zip(rk.step, rk.row))}
    for i in inst:
        j = launch_of[(int(profile.step[i]), int(profile.row[i]))]
        assert keys[j] == skeys[profile.profiled_id[i]]


def test_a_partial_step_joins_its_prefix_and_names_the_kernels_left_without(resnet):
    run, rk, table = resnet
    profile, info = join_steps(table, rk, worker="worker0")
    assert info.exact_steps == [3] and info.profiled_matched == 250
    assert info.distinct_run == 185 and info.distinct_covered == 58
    assert len(info.missing_keys) == 185 - 58
    assert info.launches_measured == 250 and info.launches_without > 0


def test_another_model_matches_almost_nothing_and_says_which(gpt2, resnet):
    _, rk, _ = gpt2
    _, _, other = resnet
    profile, info = join_steps(other, rk, worker="worker0")
    # 32 of its 250 launches are kernels GPT-2's step 3 also runs (fills, copies): 3 find a
    # launch of their own, 29 find theirs taken; the other 218 are mismatches
    assert (info.profiled_matched, info.duplicates, info.mismatched) == (3, 29, 218)
    assert info.mismatches[0].startswith("profiled #0 (step 3) ")
    assert int((profile.match == MATCH_NONE).sum()) == info.mismatched


def test_passes_concatenate_with_later_ids_after_earlier_ones(gpt2):
    _, rk, table = gpt2
    a = _subset(table, np.arange(0, 100))
    b = _subset(table, np.arange(100, 388))
    both = concat_tables([a, b])
    assert both.ids.tolist() == list(range(388))
    profile, info = join_steps(both, rk, worker="worker0")
    assert info.exact_steps == [3] and info.launches_measured == 388


def test_the_csv_parse_follows_the_unit_row_of_the_h100_csv(gpt2):
    _, _, table = gpt2
    rows = _raw_rows("gpt2_step3_raw.csv.gz")
    header, units = rows[0], rows[1]
    col = header.index("dram__bytes_read.sum")
    assert units[col] == "Gbyte"  # by hand: row 7 says 0.004223 Gbyte
    assert rows[2 + 7][col] == "0.004223"
    assert table.values["dram__bytes_read.sum"][7] == pytest.approx(0.004223e9)
    col = header.index("gpu__time_duration.sum")
    assert units[col] == "ms" and rows[2 + 7][col] == "0.008832"
    assert table.values["gpu__time_duration.sum"][7] == pytest.approx(8.832e-6)
    # thousands separators: 3,221,225,472 bf16 tensor FLOPs of the GEMM in row 11
    col = header.index("sm__ops_path_tensor_src_bf16_dst_fp32.sum")
    assert rows[2 + 11][col] == "3,221,225,472"
    assert table.values["sm__ops_path_tensor_src_bf16_dst_fp32.sum"][11] == 3221225472.0
