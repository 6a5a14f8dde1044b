"""The examples of README.md and docs/CAPTURE.md, and the guide's examples quoted there, run as
written (torch CPU, a small model, NVML through its no-driver branch) and give data.

Each example runs in a fresh Python process in its own directory (relative paths such as
`runs/exp1` land there); the few names an example takes from the reader's program
(`train_epoch`, `model`, `loader`) are defined before it, nothing in it is changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tessera_tb.trace import open_run
from tests.conftest import ROOT, SHARED_TRACES

pytest.importorskip("torch")

PRELUDE = """
import torch
torch.manual_seed(0)
_net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
_opt = torch.optim.AdamW(_net.parameters(), lr=1e-3)
loader = [torch.randn(16, 64) for _ in range(30)]


def model(batch):
    return _net(batch).square().mean()


def train_epoch():
    for batch in loader[:12]:
        model(batch).backward()
        _opt.step()
        _opt.zero_grad()
"""


def _blocks(doc: str) -> list[str]:
    with open(os.path.join(ROOT, doc)) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def _block(doc: str, first_line: str) -> str:
    found = [b for b in _blocks(doc) if first_line in b]
    assert len(found) == 1, (doc, first_line, len(found))
    return found[0]


def _run(code: str, cwd, *, prelude: bool = False) -> subprocess.CompletedProcess:
    script = os.path.join(cwd, "example.py")
    with open(script, "w") as f:
        f.write((PRELUDE if prelude else "") + code)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "capture"), ROOT])
    env["TESSERA_CACHE_DIR"] = os.path.join(str(cwd), ".cache")
    out = subprocess.run(
        [sys.executable, script], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _exit_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("tessera capture: ")]


def test_capture_quick_start_and_records(tmp_path):
    quick = _blocks("docs/CAPTURE.md")[0]
    records = _block("docs/CAPTURE.md", "for rec in sess.records():  # or trace.records")
    out = _run(quick + "\n" + records + "\nprint('frame', list(frame.columns)[:5])\n", tmp_path)
    run = open_run(str(tmp_path / "runs" / "exp1"))
    assert run.steps == [12, 13, 14, 17, 18, 19]
    with open(tmp_path / "trace.0.json") as f:
        assert any(e.get("name") == "forward/attention" for e in json.load(f)["traceEvents"])
    assert (tmp_path / "summary.0.csv").stat().st_size > 0
    assert "frame ['kind', 'kernel_name', 'stream_id', 'start_us', 'end_us']" in out.stdout
    assert _exit_lines(out.stderr)[-1].startswith("tessera capture: recorded steps 12-14, 17-19")


def test_steps_without_step_calls(tmp_path):
    out = _run(_block("docs/CAPTURE.md", "def train_epoch():"), tmp_path)
    assert out.stdout.strip() == "[2, 3, 4]"
    (line,) = _exit_lines(out.stderr)
    assert "recorded steps 2-4 of 0-12 (each optimizer.step() ended a step)" in line
    assert "tensorboard --logdir" in line
    assert open_run(str(tmp_path / "runs" / "exp1")).steps == [2, 3, 4]


def test_the_guides_headline_session(tmp_path):
    """README: `with profile.session(tensorboard_dir="runs/exp1") as sess: train_epoch()`."""
    block = _block("README.md", "train_epoch()  # 12 optimizer steps")
    out = _run("from tessera import profile\n" + block, tmp_path, prelude=True)
    assert open_run(str(tmp_path / "runs" / "exp1")).steps == [2, 3, 4]
    assert "recorded steps 2-4" in _exit_lines(out.stderr)[0]


def test_readme_capture_example(tmp_path):
    out = _run(_blocks("README.md")[0], tmp_path, prelude=True)
    run = open_run(str(tmp_path / "runs" / "exp1"))
    assert run.steps == [12, 13, 14, 17, 18, 19]
    assert (tmp_path / "trace.0.json").exists() and (tmp_path / "summary.0.csv").exists()
    assert "recorded steps" in out.stderr


def test_regions_and_caps_examples(tmp_path):
    _run(_block("docs/CAPTURE.md", '@profile.region("data")'), tmp_path)
    assert open_run(str(tmp_path / "runs" / "regions")).steps == [0, 1]
    out = _run(_block("docs/CAPTURE.md", "max_steps=3"), tmp_path)
    assert out.stdout.splitlines()[0] == "[0, 1, 2]"


def test_readme_analyze_examples_on_runs_and_a_trace_directory(tmp_path):
    block = _block("README.md", "from tessera import analyze")
    out = subprocess.run(
        [sys.executable, "-c", block + "\nprint('done')"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TESSERA_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("done")


def test_the_guides_records_loop_and_analyze_on_logs(tmp_path):
    """The guide's `for rec in sess.records(): if rec.kind == "kernel": print(...)` (on a
    run with kernels) and `analyze.collectives(trace="logs/", min_bytes=64<<20)` on a
    directory of per-rank PyTorch traces."""
    logs = tmp_path / "logs"
    shutil.copytree(os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank"), logs)
    code = f"""
from tessera import analyze
from tessera_tb import trace

n = 0
for rec in trace.records({os.path.join(ROOT, "demo_runs", "ddp_gpt_2rank")!r}, steps=[5]):
    if rec.kind == "kernel":
        print(rec.kernel_name, rec.sm_occupancy, rec.tc_util_pct)
        n += 1
print("kernels", n)
table = analyze.collectives(trace="logs/", min_bytes=64<<20)
print("collectives", len(table), sorted(set(table.collective_type)))
"""
    out = _run(code, tmp_path)
    lines = out.stdout.splitlines()
    n = int([ln for ln in lines if ln.startswith("kernels ")][0].split()[1])
    assert n > 100
    assert all(ln.endswith(" None") for ln in lines[:n])  # tc_util_pct: no counters, None
    coll = [ln for ln in lines if ln.startswith("collectives ")][0]
    assert "all_reduce" in coll and int(coll.split()[1]) > 0
    assert "tessera: " in out.stderr  # the importer's progress


def test_the_guides_cli_line_without_a_driver(tmp_path):
    """`tessera-prof --pid 12345 --sample-ms 10 --gpu --mem --tc --collectives --export
    trace.json --summary perf.csv`, verbatim, against a live process, on a machine without
    an NVIDIA driver: one line naming the problem, exit 2, nothing written."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        line = (
            f"--pid {sleeper.pid} --sample-ms 10 --gpu --mem --tc --collectives "
            "--export trace.json --summary perf.csv"
        ).split()
        out = subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", *line],
            cwd=tmp_path, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": f"{ROOT}/capture{os.pathsep}{ROOT}"},
        )  # fmt: skip
    finally:
        sleeper.kill()
        sleeper.wait()
    try:
        import pynvml

        pynvml.nvmlInit()
        pytest.skip("this machine has an NVIDIA driver")
    except Exception:
        pass
    assert out.returncode == 2 and "cannot read GPU counters" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_the_otlp_file_example(tmp_path):
    code = """
from tessera import profile

with profile.session(
    exporters=[profile.otlp(path="trace.otlp.json")],
    tensorboard_dir="runs/exp1",
) as sess:
    train_epoch()
"""
    pytest.importorskip("opentelemetry.sdk")
    _run(code, tmp_path, prelude=True)
    with open(tmp_path / "trace.otlp.json") as f:
        doc = json.load(f)
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    roots = sorted(s["name"] for s in spans if not s.get("parentSpanId"))
    assert roots == ["step 2", "step 3", "step 4"]
    assert any(s["name"] == "aten::linear" for s in spans)
