"""`tessera-prof report RUN` prints the analyses' own numbers."""

from __future__ import annotations

import os

import pytest

from tessera_tb.backend import topk
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, ROOT, tessera_prof


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
    assert "no stall counters" in proc.stdout and "tessera-prof counters " in proc.stdout


def test_report_of_a_missing_run_is_one_line_and_exit_2(tmp_path):
    proc = _report(str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no such file" in proc.stderr


def test_report_findings_list_their_deep_links():
    run_dir = os.path.join(ROOT, "tests", "data", "planted", "unaligned_gemm_problem")
    proc = _report(run_dir, "--section", "findings", "--steps", "2-4")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    row = next(ln for ln in lines if ln.strip().startswith("1 ") and "50257" in ln)
    assert "17.38" in row
    link = lines[lines.index("where to look (TensorBoard tab, URL hash):") + 1].strip()
    assert link.startswith("1. #tessera&t.run=unaligned_gemm_problem&t.workers=worker0")
    assert "&t.steps=2-4&t.view=kernels&t.q=void%20cutlass%3A%3AKernel2%3Ccutlass_75" in link


def test_report_of_a_run_captured_without_a_gpu_prints_every_section(tmp_path):
    """A CPU-only capture has no device for roofs: the roofline section says so, the
    report goes on and exits 0 (it used to stop at the roofline with exit 2)."""
    torch = pytest.importorskip("torch")
    from tessera import profile

    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run_dir = str(tmp_path / "cpu")
    with profile.session(record_shapes=True, tensorboard_dir=run_dir):
        for _ in range(6):
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    proc = _report(run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "== memory" in proc.stdout
    assert "(no roofline: worker worker0 records no device" in proc.stdout
    bad_arch = _report(run_dir, "--section", "roofline", "--arch", "no-such-gpu")
    assert bad_arch.returncode == 2 and "no-such-gpu" in bad_arch.stderr
