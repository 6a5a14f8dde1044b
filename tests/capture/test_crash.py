"""A training process killed with SIGKILL mid-run leaves every finished step readable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tessera_tb.trace import open_run
from tessera_tb.trace.layout import worker_dir
from tessera_tb.trace.reader import read_meta

from .conftest import ROOT

TRAIN_FOREVER = textwrap.dedent(
    """
    import sys
    import torch
    from tessera import profile

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    x = torch.randn(32, 64)
    with profile.session(
        activities=["cpu"],
        schedule=profile.schedule(wait=0, warmup=1, active=2, repeat=0),
        tensorboard_dir=sys.argv[1],
        writer=sys.argv[2],
    ) as sess:
        print("writer", sess.writer.pid, flush=True)
        while True:
            with profile.region("train"):
                model(x).square().mean().backward()
            sess.step()
    """
)


def _listed_steps(run_dir: str) -> int:
    try:
        return len(read_meta(os.path.join(worker_dir(run_dir, "worker0"), "meta.pb")).steps)
    except Exception:
        return 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_sigkill_mid_run_leaves_the_finished_steps_readable(tmp_path, writer):
    pytest.importorskip("torch")
    run_dir = str(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAIN_FOREVER, run_dir, writer],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        writer_pid = int(proc.stdout.readline().split()[1])
        deadline = time.monotonic() + 30
        while _listed_steps(run_dir) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _listed_steps(run_dir) >= 4, "the session wrote no steps in 30 s"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if writer == "process":
        # The writer process sees the pipe close, writes what it was handed and exits.
        deadline = time.monotonic() + 30
        while _alive(writer_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(writer_pid)
    run = open_run(run_dir)
    steps = run.steps
    assert len(steps) >= 4
    for s in steps:
        step = run.load_step("worker0", s)
        assert (step.frame().kind == "cpu_op").any()
