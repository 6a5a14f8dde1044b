"""`tessera-prof report RUN` prints the analyses' own numbers."""

from __future__ import annotations

import os

from tessera_tb.backend import topk
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, tessera_prof


def _report(*args: str):
    return tessera_prof("report", *args)


def test_report_prints_every_section_with_the_backend_numbers():
    run_dir = os.path.join(DEMO_RUNS, "gpt_1gpu")
    proc = _report(run_dir, "-k", "3")
    assert proc.returncode == 0, proc.stderr
    for section in (
        "summary",
        "breakdown",
        "findings",
        "ops",
        "kernels",
        "roofline",
        "stalls",
        "collectives",
        "memory",
    ):
        assert f"== {section}" in proc.stdout
    top = topk.op_table(open_run(run_dir), k=3).iloc[0]
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(top["name"]))
    assert f"{top['device_self_ns'] / 1e6:.3f}" in line


def test_report_without_counters_prints_the_collect_command():
    proc = _report(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"), "--section", "stalls")
    assert proc.returncode == 0, proc.stderr
    assert "no stall counters" in proc.stdout and "ncu " in proc.stdout


def test_report_of_a_missing_run_is_one_line_and_exit_2(tmp_path):
    proc = _report(str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no such file" in proc.stderr
