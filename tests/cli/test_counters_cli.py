"""`tessera-prof counters RUN -- PROGRAM`: the command's flow and every error a user meets.

There is no GPU here, so `ncu` is tests/cli/fake_ncu.py on PATH: it runs the program as ncu
does (the program's session sees the injection environment and records markers only), prints
ncu's console lines, exits as ncu does, and replays a real ncu CSV of the same run's step 3
taken on an H100 (tests/data/ncu_step). The real ncu run is bench/gpu_counters_check.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys

import numpy as np
import pytest

from tessera_tb.importers.ncu_selection import NCU_METRICS, NCU_SECTIONS
from tessera_tb.trace.kernel_counters import (
    MATCH_INSTANCE,
    MATCH_NAME,
    METHOD_NVTX_STEP,
    load_kernel_counters,
)
from tests.conftest import ROOT, assert_same_files, file_contents, tessera_prof

DATA = os.path.join(ROOT, "tests", "data", "ncu_step")
GPT2_CSV = os.path.join(DATA, "gpt2_step3_raw.csv.gz")
RESNET_CSV = os.path.join(DATA, "resnet50_step3_first250_raw.csv.gz")
FAKE = os.path.join(ROOT, "tests", "cli", "fake_ncu.py")

# The user's program: a session writing to RUN, as the script that wrote the run does.
PROGRAM = """
import os, sys
from tessera import profile
with profile.session(activities=["cpu"], tensorboard_dir=sys.argv[1]) as sess:
    for i in range(5):
        with profile.region("forward"):
            pass
        sess.step()
print("program ran; markers_only =", sess.markers_only)
"""


@pytest.fixture()
def gpt2_run(tmp_path):
    dest = tmp_path / "gpt2"
    shutil.copytree(os.path.join(DATA, "gpt2"), dest)
    return str(dest)


def _fake_ncu(tmp_path, mode: str = "ok", csv_path: str = GPT2_CSV) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    ncu = bin_dir / "ncu"
    ncu.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_NCU_MODE": mode,
        "FAKE_NCU_CSV": csv_path,
        "FAKE_NCU_LOG": str(tmp_path / "ncu_calls.jsonl"),
    }


def _program(run_dir: str) -> list[str]:
    return [sys.executable, "-c", PROGRAM, run_dir]


def _calls(tmp_path) -> list[list[str]]:
    with open(tmp_path / "ncu_calls.jsonl") as f:
        return [json.loads(line) for line in f]


def test_default_profiles_one_instance_per_distinct_kernel_of_step_3_and_joins_all_steps(
    tmp_path, gpt2_run
):
    before = file_contents(gpt2_run)
    csv_copy = tmp_path / "kept.csv"
    out = tessera_prof(
        "counters", gpt2_run, "--save-csv", str(csv_copy), "--", *_program(gpt2_run),
        env=_fake_ncu(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # the estimate comes first, then the command and progress per kernel
    assert lines[0].startswith(
        "profiling one instance of each of 83 distinct kernels of step 3 (388 launches): "
        "83 kernels x 27 passes"
    )
    assert any(ln.startswith("pass 1: ") and "--nvtx-include tessera_step_3" in ln for ln in lines)
    progress = [ln for ln in lines if " kernel " in ln and "/83 " in ln]
    assert len(progress) == 83 and "(27 passes)" in progress[-1]
    assert "distinct kernels with counters: 83 of 83" in out.stdout
    assert "83 measured, 1081 measured:same-kernel-instance, 0 without" in out.stdout
    assert "took " in lines[-1]
    # ncu was asked for the step's NVTX range, one launch per configuration, every section
    profile_call = [c for c in _calls(tmp_path) if "--import" not in c][0]
    joined = " ".join(profile_call)
    assert "--nvtx --nvtx-include tessera_step_3" in joined
    assert "--filter-mode per-launch-config --launch-count 1" in joined
    assert [profile_call[i + 1] for i, a in enumerate(profile_call) if a == "--section"] == list(
        NCU_SECTIONS
    )
    assert profile_call[profile_call.index("--metrics") + 1] == ",".join(NCU_METRICS)
    # the program ran with its session in marker-only mode: RUN changed only by the counters
    assert "program ran; markers_only = Nsight Compute" not in out.stdout  # not echoed without -v
    after = file_contents(gpt2_run)
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed == {
        "plugins/tessera/worker0/kernel_counters.pb",
        "plugins/tessera/worker0/meta.pb",
    }
    p = load_kernel_counters(gpt2_run, "worker0")
    assert p.match_method == METHOD_NVTX_STEP
    assert int((p.match == MATCH_NAME).sum()) == 83
    assert int((p.match == MATCH_INSTANCE).sum()) == 1081
    assert sorted(set(p.step.tolist())) == [2, 3, 4]
    assert csv_copy.read_text().startswith("ID,Process ID")


def test_all_launches_joins_every_launch_of_the_step_by_launch_order(tmp_path, gpt2_run):
    out = tessera_prof(
        "counters", gpt2_run, "--all-launches", "--", *_program(gpt2_run),
        env=_fake_ncu(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "every launch of step 3: 388 kernels x 27 passes" in out.stdout
    assert "388 measured, 776 measured:same-kernel-instance, 0 without" in out.stdout
    joined = " ".join([c for c in _calls(tmp_path) if "--import" not in c][0])
    assert "--filter-mode" not in joined and "--nvtx-include tessera_step_3" in joined


def test_kernels_and_max_kernels_narrow_what_ncu_is_asked_for(tmp_path, gpt2_run):
    out = tessera_prof(
        "counters", gpt2_run, "--kernels", "nvjet", "--max-kernels", "2", "--steps", "4",
        "--", *_program(gpt2_run), env=_fake_ncu(tmp_path),
    )  # fmt: skip
    # the replayed CSV is of step 3, so asking for step 4 profiles kernels outside it
    assert "2 distinct kernels (of 83) of step 4" in out.stdout
    call = [c for c in _calls(tmp_path) if "--import" not in c][0]
    assert "tessera_step_4" in call
    name_filter = call[call.index("--kernel-name") + 1]
    assert name_filter.startswith("regex:^(nvjet_sm90_tst_") and name_filter.count("|") == 1


def test_kernels_a_pass_missed_get_a_pass_of_their_own(tmp_path, gpt2_run):
    # an ncu whose configuration key left out the function (grid and block only) would miss
    # kernels sharing a grid and block with an earlier one; later passes ask for the missing
    # kernels' function names, and what is still missing is listed, not hidden
    out = tessera_prof(
        "counters", gpt2_run, "--", *_program(gpt2_run), env=_fake_ncu(tmp_path, "coarse"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    calls = [c for c in _calls(tmp_path) if "--import" not in c]
    assert len(calls) == 3 and "--kernel-name" not in calls[0]
    pass2 = calls[1][calls[1].index("--kernel-name") + 1]
    assert pass2.startswith("regex:^(") and "fused_dropout_kernel_vec" in pass2
    first = int(out.stdout.split(" distinct kernels got no counters in pass 1")[0].split()[-1])
    covered = int(out.stdout.split("distinct kernels with counters: ")[1].split()[0])
    assert 83 - first < covered < 83
    assert out.stdout.count("  no counters: ") == min(5, 83 - covered)


def test_a_metric_ncu_refuses_is_left_out_and_the_pass_runs_again(tmp_path, gpt2_run):
    out = tessera_prof(
        "counters", gpt2_run, "--", *_program(gpt2_run), env=_fake_ncu(tmp_path, "badmetric"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "ncu does not know a metric it was asked for on this GPU" in out.stdout
    calls = [c for c in _calls(tmp_path) if "--import" not in c]
    refused = "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum"
    assert len(calls) == 2 and refused in calls[0][calls[0].index("--metrics") + 1]
    retry = calls[1][calls[1].index("--metrics") + 1].split(",")
    assert refused not in retry and "smsp__inst_issued.sum" in retry
    assert "distinct kernels with counters: 83 of 83" in out.stdout


def _assert_error(out, *needles: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = out.stderr.strip().splitlines()
    assert len(err) == 1, out.stderr
    assert err[0].startswith("tessera-prof counters: error: ")
    for n in needles:
        assert n in err[0], err[0]


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        ("no_ncu", ("ncu (Nsight Compute) not found on PATH", "--ncu")),
        ("perm", ("ERR_NVGPUCTRPERM", "NVreg_RestrictProfilingToAdminUsers=0", "root")),
        ("program_fails", ("the program failed under ncu (exit status 3)", "CUDA out of memory")),
        ("no_kernels", ("ncu profiled no kernel in the chosen step", "tessera_step_N")),
        ("kernel_error", ("ncu could not collect the counters of a kernel", "--kernels")),
        ("na_row", ("ncu could not collect the counters of kernel #1", "--kernels")),
        (
            "other_model",
            (
                "do not match the run: 32 of 250 profiled kernels of step 3",
                "first mismatch: profiled #0",
            ),
        ),
        ("no_program", ("no program",)),
        ("bad_step", ("has no step 9", "its steps: 2,3,4")),
    ],
)
def test_each_error_is_one_line_with_the_fix_exit_2_and_the_run_untouched(
    tmp_path, gpt2_run, case, needles
):
    modes = {"perm": "perm", "no_kernels": "nokernels", "kernel_error": "kernelerr"}
    env = _fake_ncu(tmp_path, modes.get(case, "na_row" if case == "na_row" else "ok"))
    program = _program(gpt2_run)
    args = [gpt2_run]
    if case == "no_ncu":
        env["PATH"] = os.path.dirname(sys.executable)
    if case == "program_fails":
        fails = "import sys; print('RuntimeError: CUDA out of memory'); sys.exit(3)"
        program = [sys.executable, "-c", fails]
    if case == "other_model":
        env["FAKE_NCU_CSV"] = RESNET_CSV
        args += ["--all-launches"]
    if case == "no_program":
        program = []
    if case == "bad_step":
        args += ["--steps", "9"]
    before = file_contents(gpt2_run)
    out = tessera_prof("counters", *args, "--", *program, env=env)
    _assert_error(out, *needles)
    assert_same_files(file_contents(gpt2_run), before)


def test_import_ncu_joins_a_csv_of_nvtx_steps_by_step_and_launch_order(tmp_path, gpt2_run):
    out = tessera_prof("import-ncu", GPT2_CSV, gpt2_run)
    assert out.returncode == 0, out.stderr
    p = load_kernel_counters(gpt2_run, "worker0")
    assert p.match_method == METHOD_NVTX_STEP
    assert int((p.match == MATCH_NAME).sum()) == 388
    assert int((p.match == MATCH_INSTANCE).sum()) == 776
    assert np.isfinite(p.values("sm_occupancy")).all()


def test_import_ncu_reads_a_ncu_rep_through_ncu(tmp_path, gpt2_run):
    env = _fake_ncu(tmp_path)
    report = tmp_path / "counters.ncu-rep"  # the fake's report holds its CSV
    import gzip

    report.write_bytes(gzip.decompress(open(GPT2_CSV, "rb").read()))
    out = tessera_prof("import-ncu", str(report), gpt2_run, env=env)
    assert out.returncode == 0, out.stderr
    assert ["--import", str(report), "--csv", "--page", "raw"] == _calls(tmp_path)[0]
    assert load_kernel_counters(gpt2_run, "worker0").count == 1164
    # without ncu: one line saying how to export the CSV instead
    gpt2_b = tmp_path / "b"
    shutil.copytree(os.path.join(DATA, "gpt2"), gpt2_b)
    out = tessera_prof(
        "import-ncu", str(report), str(gpt2_b), env={"PATH": os.path.dirname(sys.executable)}
    )
    assert out.returncode == 2
    assert "--csv --page raw > REPORT.csv" in out.stderr and len(out.stderr.splitlines()) == 1
