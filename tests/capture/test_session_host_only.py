"""Without torch (or without asking for it) a session still writes steps: regions, marks,
counters and step times, through the writer process or a writer thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tessera import profile
from tessera_tb.trace import open_run

from .conftest import ROOT

NO_TORCH_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    sys.modules["torch"] = None  # `import torch` now raises ImportError
    from tessera import profile

    with profile.session(
        activities=["cpu"],
        schedule=profile.schedule(wait=1, warmup=0, active=2, repeat=2),
        tensorboard_dir=sys.argv[1],
    ) as sess:
        for i in range(8):
            with profile.region("work"):
                time.sleep(0.01)
            sess.mark(f"m{i}")
            sess.step()
    print(json.dumps({"written": sess.steps_written,
                      "torch_loaded": sys.modules.get("torch") is not None}))
    """
)


def test_without_torch_steps_hold_regions_and_capabilities_say_why(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH_SCRIPT, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"written": [1, 2, 4, 5], "torch_loaded": False}
    run = open_run(str(run_dir))
    assert run.steps == [1, 2, 4, 5]
    for s in run.steps:
        step = run.load_step("worker0", s)
        df = step.frame()
        work = df[df.kind == "region"]
        assert list(work.name) == ["work"]
        assert work.dur_ns.iloc[0] >= 10_000_000  # the 10 ms sleep
        assert list(df[df.kind == "mark"].name) == [f"m{s}"]
        # The step span is the time between step() calls: it holds the region and the mark.
        assert step.start_ns <= work.start_ns.iloc[0] and work.end_ns.iloc[0] <= step.end_ns
        assert step.span_ns >= 10_000_000
    caps = {c.name: c for c in run.workers["worker0"].meta.capabilities}
    assert caps["cpu_ops"].status == "unavailable"
    assert "torch is not importable" in caps["cpu_ops"].reason
    assert caps["host_regions"].status == "ok"


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_host_only_session_writes_every_active_step(tmp_path, writer):
    run_dir = tmp_path / "run"
    with profile.session(
        activities=[],
        schedule=profile.schedule(wait=0, warmup=0, active=3, repeat=1),
        tensorboard_dir=str(run_dir),
        writer=writer,
    ) as sess:
        for i in range(5):
            with profile.region("step-body"):
                time.sleep(0.002)
            profile.counter(name="tokens", value=100 + i, unit="count")
            sess.step()
    assert sess.steps_written == [0, 1, 2]
    run = open_run(str(run_dir))
    assert run.steps == [0, 1, 2]
    for s in run.steps:
        step = run.load_step("worker0", s)
        (tokens,) = [c for c in step.counters if c.name == "tokens"]
        assert tokens.values.tolist() == [100 + s]
        assert tokens.source == "user"
    assert run.workers["worker0"].meta.pid == os.getpid()


def test_regions_outside_a_session_record_nothing_and_cost_little():
    start = time.perf_counter()
    for _ in range(10_000):
        with profile.region("idle"):
            pass
        profile.counter(name="x", value=1.0)
    assert (time.perf_counter() - start) / 10_000 < 50e-6


def test_region_works_as_a_decorator(tmp_path):
    @profile.region("decorated")
    def work(x: int) -> int:
        return x + 1

    with profile.session(
        activities=[],
        schedule=profile.schedule(wait=0, warmup=0, active=1, repeat=1),
        tensorboard_dir=str(tmp_path / "run"),
    ) as sess:
        assert work(1) == 2
        assert work(2) == 3
        sess.step()
    step = open_run(str(tmp_path / "run")).load_step("worker0", 0)
    df = step.frame()
    assert list(df[df.kind == "region"].name) == ["decorated", "decorated"]
