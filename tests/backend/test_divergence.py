"""Warp divergence (METRICS.md, "Derived kernel figures") against the CSVs read by hand."""

from __future__ import annotations

import csv
import os
import shutil

import numpy as np
import pytest

from tessera_tb.backend.divergence import divergence
from tessera_tb.importers.ncu_attach import import_ncu
from tessera_tb.importers.ncu_csv import counter_profile, read_ncu_csv
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, SHARED_TRACES

MICRO = os.path.join(SHARED_TRACES, "ncu", "microkernels_raw.csv")
GPT = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")
RATIO = "smsp__thread_inst_executed_per_inst_executed.ratio"


def _hand(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return [dict(zip(rows[0], r)) for r in rows[2:]]


def _num(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_divergence_is_the_share_of_idle_thread_slots_per_kernel():
    rows = _hand(GPT)
    # layer norm of the GPT (d=1024, 32x4 blocks): 30.25 of 32 threads per instruction
    norms = [r for r in rows if "vectorized_layer_norm_kernel" in r["Kernel Name"]]
    assert {r[RATIO] for r in norms} == {"30.25"}
    table = divergence(counter_profile(read_ncu_csv(GPT)), threshold=0.05)
    assert table["kernel_name"].tolist() == [norms[0]["Kernel Name"]]
    assert table["warp_divergence_pct"].iloc[0] == pytest.approx(100 * (1 - 30.25 / 32))
    assert table["count"].iloc[0] == len(norms)
    assert table["dur_ns"].iloc[0] == pytest.approx(
        sum(_num(r["gpu__time_duration.sum"]) for r in norms) * 1e3
    )


def test_the_threshold_is_a_fraction_and_kernels_come_heaviest_first():
    rows = _hand(MICRO)
    p = counter_profile(read_ncu_csv(MICRO))
    threshold = 0.005  # 0.5 %
    above = {}
    for r in rows:
        pct = 100 * (1 - _num(r[RATIO]) / 32)
        if pct > 100 * threshold:
            above.setdefault(r["Kernel Name"], 0.0)
            above[r["Kernel Name"]] += _num(r["gpu__time_duration.sum"]) * 1e3
    table = divergence(p, threshold=threshold)
    assert set(table["kernel_name"]) == set(above)
    assert table["kernel_name"].tolist() == sorted(above, key=above.get, reverse=True)
    assert divergence(p).empty  # nothing above the default 20 %


def test_branch_uniformity_comes_from_its_counter_where_present():
    rows = _hand(MICRO)
    p = counter_profile(read_ncu_csv(MICRO))
    table = divergence(p, threshold=0.0).set_index("kernel_name")
    for name, t in table.iterrows():
        uniform = [_num(r["smsp__sass_average_branch_targets_threads_uniform.pct"])
                   for r in rows if r["Kernel Name"] == name]  # fmt: skip
        if len(set(uniform)) == 1:
            assert t["branch_uniformity_pct"] == pytest.approx(uniform[0])
    gpt = divergence(counter_profile(read_ncu_csv(GPT)), threshold=0.0)
    assert gpt["branch_uniformity_pct"].isna().all()  # not collected in that report


def test_a_run_uses_its_matched_kernels_and_its_own_durations(tmp_path):
    dest = tmp_path / "gpt_1gpu"
    shutil.copytree(os.path.join(DEMO_RUNS, "gpt_1gpu"), dest)
    counters = dest / "plugins" / "tessera" / "worker0" / "kernel_counters.pb"
    if counters.exists():
        counters.unlink()
    import_ncu(GPT, str(dest))
    run = open_run(str(dest))
    table = divergence(run, threshold=0.05)
    assert len(table) == 1 and "vectorized_layer_norm_kernel" in table["kernel_name"].iloc[0]
    step = run.load_step("worker0", 5)
    names = step.string_values(step.events["name_id"])
    is_norm = np.array(["vectorized_layer_norm_kernel<float" in n for n in names])
    assert table["count"].iloc[0] == is_norm.sum()  # the 9 forward norms of step 5
    assert table["dur_ns"].iloc[0] == step.events["dur_ns"][is_norm].sum()
