"""`tessera-prof import`: selection flags, NVML counter tracks and progress output."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from tessera_tb.trace import open_run
from tests.conftest import SHARED_TRACES, tessera_prof

DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")
GPT = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")


def _cli(*args: str):
    return tessera_prof("import", *args)


def test_steps_and_workers_select_what_is_written(tmp_path):
    proc = _cli(
        DDP, "--logdir", str(tmp_path), "--run", "sel", "--steps", "5-6", "--workers", "rank1"
    )
    assert proc.returncode == 0, proc.stderr
    run = open_run(str(tmp_path / "sel"))
    assert sorted(run.workers) == ["rank1"]
    assert run.steps == [5, 6]
    assert "rank1 steps 5-6" in proc.stdout


def test_unknown_worker_is_an_error_listing_the_known_ones(tmp_path):
    proc = _cli(DDP, "--logdir", str(tmp_path), "--workers", "rank7", "-q")
    assert proc.returncode == 2
    assert "rank7" in proc.stderr and "rank0" in proc.stderr


def test_a_logdir_that_cannot_be_made_is_a_one_line_error(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    logdir = tmp_path / "a_file" / "runs"
    proc = _cli(GPT, "--logdir", str(logdir), "-q")
    assert proc.returncode == 2
    assert proc.stderr == f"tessera-prof import: error: {logdir}: Not a directory\n"


def test_progress_names_each_file_and_its_steps(tmp_path):
    proc = _cli(DDP, "--logdir", str(tmp_path), "--run", "p")
    assert proc.returncode == 0
    for f in os.listdir(DDP):
        if f.endswith(".json.gz"):
            assert f"reading {f}" in proc.stderr
            assert "3 of 3 steps written" in proc.stderr


def test_run_name_defaults_to_the_directory_name(tmp_path):
    assert _cli(GPT, "--logdir", str(tmp_path), "-q").returncode == 0
    assert open_run(str(tmp_path / "gpt_1gpu_stack")).steps == [4, 5]


@pytest.mark.parametrize("explicit", [False, True])
def test_nvml_samples_become_counter_tracks_inside_each_step(tmp_path, explicit):
    csv = os.path.join(GPT, "nvml_worker0.csv")
    args = [GPT, "--logdir", str(tmp_path), "--run", "n", "-q"]
    if explicit:
        args += ["--nvml", csv]
    assert _cli(*args).returncode == 0
    samples = pd.read_csv(csv)
    run = open_run(str(tmp_path / "n"))
    assert (
        next(c for c in run.worker("worker0").meta.capabilities if c.name == "nvml").status == "ok"
    )
    for step_num in run.steps:
        step = run.load_step("worker0", step_num)
        inside = samples[(samples.t_ns >= step.start_ns) & (samples.t_ns < step.end_ns)]
        assert len(inside) > 0
        counters = {c.name: c for c in step.counters}
        np.testing.assert_array_equal(counters["power_w"].ts_ns, inside.t_ns.to_numpy())
        np.testing.assert_array_equal(counters["power_w"].values, inside.power_w.to_numpy())
        np.testing.assert_array_equal(counters["temp_c"].values, inside.temp_c.to_numpy())
        np.testing.assert_array_equal(counters["sm_clock_mhz"].values, inside.sm_mhz.to_numpy())
        assert counters["throttle_reasons"].unit == "bitmask"
        assert {c.device for c in step.counters} == {0}


def test_worker_metadata_carries_rank_devices_versions_and_groups(tmp_path):
    assert _cli(DDP, "--logdir", str(tmp_path), "--run", "m", "-q").returncode == 0
    meta = open_run(str(tmp_path / "m")).worker("rank1").meta
    assert (meta.rank, meta.world_size, meta.backend) == (1, 2, "nccl")
    assert meta.devices[0].name == "NVIDIA H200" and meta.devices[0].num_sms == 132
    assert meta.versions["nccl"] == "2.28.9" and meta.versions["cuda_runtime"] == "13000"
    assert list(meta.process_groups[0].ranks) == [0, 1]
    assert meta.clock_base_ns == 1790857026000000000
    assert [os.path.sep in s for s in meta.sources] == [False]


def test_nested_run_name_is_built_beside_its_destination(tmp_path):
    proc = _cli(GPT, "--logdir", str(tmp_path), "--run", "group/exp1", "-q")
    assert proc.returncode == 0, proc.stderr
    assert open_run(str(tmp_path / "group" / "exp1")).steps == [4, 5]
    assert os.listdir(tmp_path / "group") == ["exp1"]  # no hidden leftovers


def test_failed_nested_import_leaves_no_empty_parent(tmp_path):
    bad = tmp_path / "w.1.pt.trace.json"
    bad.write_text("{}")
    proc = _cli(str(bad), "--logdir", str(tmp_path / "logs"), "--run", "a/b/c", "-q")
    assert proc.returncode == 2
    assert os.listdir(tmp_path / "logs") == []


def test_without_the_c_scanner_the_import_says_so_and_still_works(tmp_path, monkeypatch, capsys):
    from tessera.cli.main import main
    from tessera_tb.importers import kineto_decode

    monkeypatch.setattr(kineto_decode, "_kineto_scan", None)  # as an install without gcc
    assert main(["import", GPT, "--logdir", str(tmp_path), "--run", "slow"]) == 0
    err = capsys.readouterr().err
    assert "C trace scanner is not built" in err and "python3-dev" in err
    assert open_run(str(tmp_path / "slow")).steps == [4, 5]


def test_with_the_c_scanner_there_is_no_such_note(tmp_path, capsys):
    from tessera.cli.main import main
    from tessera_tb.importers import kineto_decode

    if kineto_decode._kineto_scan is None:
        pytest.skip("the C scanner is not built here")
    assert main(["import", GPT, "--logdir", str(tmp_path), "--run", "fast"]) == 0
    assert "scanner" not in capsys.readouterr().err


def test_the_summary_counts_workers_per_step_range_past_sixteen():
    from tessera.cli.import_cmd import _workers_and_steps
    from tessera_tb.importers.kineto_import import WorkerImport

    few = [WorkerImport(f"rank{r}", [], steps=[4, 5, 6]) for r in range(2)]
    assert _workers_and_steps(few) == "rank0 steps 4-6, rank1 steps 4-6"
    many = [WorkerImport(f"rank{r}", [], steps=[4, 5, 6]) for r in range(1023)]
    many.append(WorkerImport("rank1023", [], steps=[4, 6]))
    assert _workers_and_steps(many) == "1023 workers steps 4-6, 1 workers steps 4,6"
