"""`tessera-prof import-ncu`: Nsight Compute counters attached to a copy of the demo run by
kernel name and launch order, checked against the run's own trace arguments."""

from __future__ import annotations

import csv
import json
import os
import shutil

import numpy as np
import pytest

from tessera_tb.trace import open_run
from tessera_tb.trace.kernel_counters import load_kernel_counters
from tests.conftest import DEMO_RUNS, SHARED_TRACES, assert_same_files, file_contents, tessera_prof

GPT_CSV = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")
MICRO_CSV = os.path.join(SHARED_TRACES, "ncu", "microkernels_raw.csv")


def _cli(*args: str):
    return tessera_prof("import-ncu", *args)


def _copy_demo(tmp_path, name: str = "gpt_1gpu") -> str:
    dest = tmp_path / name
    shutil.copytree(os.path.join(DEMO_RUNS, name), dest)
    counters = dest / "plugins" / "tessera" / "worker0" / "kernel_counters.pb"
    if counters.exists():  # start from the run as imported, without counters
        counters.unlink()
    return str(dest)


def _csv_rows(path: str) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[2:]


@pytest.fixture(scope="module")
def attached(tmp_path_factory):
    """A copy of demo_runs/gpt_1gpu with gpt_step_raw.csv attached; (run dir, CLI result)."""
    run_dir = _copy_demo(tmp_path_factory.mktemp("ncu"))
    proc = _cli(GPT_CSV, run_dir)
    return run_dir, proc


def test_most_kernels_match_by_name_and_order_and_the_rest_are_reported(attached):
    run_dir, proc = attached
    assert proc.returncode == 0, proc.stderr
    p = load_kernel_counters(run_dir, "worker0")
    r = p.report
    assert p.match_method == "name+order"
    assert r.profiled_kernels == 120
    assert r.matched + r.matched_base_name >= 0.8 * r.profiled_kernels
    assert r.matched + r.matched_base_name + r.mismatched + r.outside == r.profiled_kernels
    assert f"{r.matched} matched by name" in proc.stdout
    assert f"{r.mismatched} mismatched" in proc.stdout
    assert proc.stdout.count("not matched:") == min(5, r.mismatched + r.outside)


def test_the_unmatched_kernels_are_the_optimizer_state_fills_of_the_first_step(attached):
    # The capture starts in the first optimizer step, which creates AdamW's state with fills
    # (one-block and 4096-block FillFunctor kernels) that steady-state steps never launch.
    run_dir, _ = attached
    header, rows = _csv_rows(GPT_CSV)
    name = header.index("Kernel Name")
    leading_fills = 0
    while "FillFunctor" in rows[leading_fills][name]:
        leading_fills += 1
    p = load_kernel_counters(run_dir, "worker0")
    unmatched = np.flatnonzero(p.row < 0)
    assert unmatched.tolist() == list(range(leading_fills))


def test_each_match_has_the_run_kernels_launch_configuration(attached):
    run_dir, _ = attached
    header, rows = _csv_rows(GPT_CSV)
    grid, block = header.index("Grid Size"), header.index("Block Size")
    p = load_kernel_counters(run_dir, "worker0")
    run = open_run(run_dir)
    steps = {s: run.load_step("worker0", s) for s in run.steps}
    for i in np.flatnonzero(p.row >= 0):
        step = steps[int(p.step[i])]
        row = int(p.row[i])
        assert json.loads(step.attr("grid")[row]) == json.loads(
            "[" + rows[i][grid].strip("()") + "]"
        )
        assert json.loads(step.attr("block")[row]) == json.loads(
            "[" + rows[i][block].strip("()") + "]"
        )


def test_matched_gemms_measure_exactly_the_flops_of_their_ops_shapes(attached):
    # Tensor FLOPs from the CSV against 2*M*N*K from the run's own Input Dims.
    run_dir, _ = attached
    header, rows = _csv_rows(GPT_CSV)
    tensor = header.index("sm__ops_path_tensor_src_bf16_dst_fp32.sum")
    p = load_kernel_counters(run_dir, "worker0")
    run = open_run(run_dir)
    from tessera_tb.backend.linkage import owning_op_rows

    checked = 0
    for s in run.steps:
        step = run.load_step("worker0", s)
        owner = owning_op_rows(step)
        dims = step.attr("Input Dims")
        for i in np.flatnonzero((p.row >= 0) & (p.step == s)):
            if not p.kernel_names[i].startswith("nvjet"):
                continue
            op = int(owner[p.row[i]])
            shapes = [d for d in json.loads(dims[op]) if len(d) == 2]
            (m, k), (_, n) = shapes[-2], shapes[-1]
            assert float(rows[i][tensor].replace(",", "")) == 2 * m * n * k
            checked += 1
    assert checked == 17  # 4 layers x (qkv, o, up, down) + the LM head


def test_the_worker_records_how_counters_were_matched(attached):
    run_dir, _ = attached
    caps = {c.name: c for c in open_run(run_dir).worker("worker0").meta.capabilities}
    assert caps["ncu_counters"].status == "ok"
    assert caps["ncu_kernel_match"].status == "ok"
    assert "by kernel name and launch order from a separate process" in (
        caps["ncu_kernel_match"].reason
    )


def test_the_demo_runs_themselves_are_not_modified(tmp_path):
    before = file_contents(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    run_dir = _copy_demo(tmp_path)
    assert _cli(GPT_CSV, run_dir, "-q").returncode == 0
    assert_same_files(file_contents(os.path.join(DEMO_RUNS, "gpt_1gpu")), before)


def test_counter_only_stores_counters_without_kernel_links(tmp_path):
    run_dir = _copy_demo(tmp_path)
    proc = _cli(GPT_CSV, run_dir, "--counter-only")
    assert proc.returncode == 0, proc.stderr
    p = load_kernel_counters(run_dir, "worker0")
    assert p.match_method == "counter-only"
    assert (p.row == -1).all() and p.count == 120
    caps = {c.name: c for c in open_run(run_dir).worker("worker0").meta.capabilities}
    assert caps["ncu_kernel_match"].status == "unavailable"


def test_counters_of_other_kernels_are_stored_counter_only(tmp_path):
    run_dir = _copy_demo(tmp_path)
    proc = _cli(MICRO_CSV, run_dir)
    assert proc.returncode == 0, proc.stderr
    p = load_kernel_counters(run_dir, "worker0")
    assert p.match_method == "counter-only"
    assert "counter-only" in proc.stdout


def test_existing_counters_are_kept_without_overwrite(tmp_path):
    run_dir = _copy_demo(tmp_path)
    assert _cli(GPT_CSV, run_dir, "-q").returncode == 0
    before = file_contents(run_dir)
    proc = _cli(MICRO_CSV, run_dir)
    assert proc.returncode == 2
    assert "--overwrite" in proc.stderr
    assert_same_files(file_contents(run_dir), before)
    assert _cli(MICRO_CSV, run_dir, "--overwrite", "-q").returncode == 0
    assert load_kernel_counters(run_dir, "worker0").count == 34


def test_a_run_of_several_workers_needs_worker(tmp_path):
    run_dir = _copy_demo(tmp_path, "ddp_gpt_2rank")
    proc = _cli(GPT_CSV, run_dir)
    assert proc.returncode == 2
    assert "--worker" in proc.stderr and "rank0" in proc.stderr
    assert _cli(GPT_CSV, run_dir, "--worker", "rank1", "-q").returncode == 0
    assert load_kernel_counters(run_dir, "rank1").match_method == "name+order"


@pytest.mark.parametrize(
    "content",
    [
        "",
        '"a","b"\n"1","2"\n',
        '"ID","Kernel Name","gpu__time_duration.sum"\n"","","us"\n"0","k"\n',
    ],
)
def test_bad_csvs_exit_2_with_one_line_naming_the_file(tmp_path, content):
    run_dir = _copy_demo(tmp_path)
    before = file_contents(run_dir)
    bad = tmp_path / "bad_report.csv"
    bad.write_text(content)
    proc = _cli(str(bad), run_dir)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0]
    assert_same_files(file_contents(run_dir), before)


def test_a_missing_run_exits_2(tmp_path):
    proc = _cli(GPT_CSV, str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
