"""NVTX step and region ranges, and the marker-only mode under Nsight Compute / Systems.

The machine running these tests has no GPU, so the NVTX calls go to a recording stand-in with
torch.cuda.nvtx's four functions; on a GPU `tessera-prof counters` proves the real ranges
(ncu selects the step by them, bench/gpu_counters_check.py).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tessera import profile
from tessera.profile import nvtx_markers
from tessera.profile.nvtx_markers import NvtxMarkers, injected_tool
from tessera_tb.trace import open_run

from .conftest import ROOT

session_mod = importlib.import_module("tessera.profile.session")

NCU_LIB = (
    "/opt/nvidia/nsight-compute/2025.3.1/target/linux-desktop-glibc_2_11_3-x64/"
    "libTreeLauncherTargetInjection.so"
)
NSYS_LIB = "/opt/nvidia/nsight-systems/2025.3.2/target-linux-x64/libToolsInjection64.so"


class RecordingNvtx:
    """torch.cuda.nvtx's range functions, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._next = 0

    def range_start(self, name: str) -> int:
        self._next += 1
        self.calls.append(("start", name, self._next))
        return self._next

    def range_end(self, rid: int) -> None:
        self.calls.append(("end", rid))

    def range_push(self, name: str) -> int:
        self.calls.append(("push", name))
        return 0

    def range_pop(self) -> int:
        self.calls.append(("pop",))
        return 0


def test_injected_tool_names_nsight_compute_and_systems_from_their_injection_library():
    assert injected_tool({"CUDA_INJECTION64_PATH": NCU_LIB}) == "Nsight Compute"
    assert injected_tool({"CUDA_INJECTION64_PATH": NSYS_LIB}) == "Nsight Systems"
    assert injected_tool({"CUDA_INJECTION64_PATH": "/x/libother.so"}).endswith("(libother.so)")
    assert injected_tool({"TESSERA_MARKERS_ONLY": "Nsight Compute"}) == "Nsight Compute"
    assert injected_tool({}) is None
    assert injected_tool({"CUDA_INJECTION64_PATH": " "}) is None
    assert injected_tool({"CUDA_INJECTION64_PATH": "none"}) is None
    assert injected_tool({"NSYS_PROFILING_SESSION_ID": "7"}) == "Nsight Systems"


def _loop(sess, steps: int) -> None:
    for _ in range(steps):
        with profile.region("forward"):
            with profile.region("forward/attention"):
                pass
        sess.step()


def test_marker_only_mode_opens_step_and_region_ranges_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    api = RecordingNvtx()
    monkeypatch.setenv("CUDA_INJECTION64_PATH", NCU_LIB)
    monkeypatch.setattr(session_mod, "torch_nvtx_markers", lambda torch: NvtxMarkers(api))
    run_dir = tmp_path / "run"
    with profile.session(activities=["cpu"], tensorboard_dir=run_dir) as sess:
        _loop(sess, 3)
    assert sess.markers_only == "Nsight Compute"
    assert not run_dir.exists()  # the run the counters attach to is never touched
    assert sess.steps_written == [] and sess.run() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "running under Nsight Compute" in err[0]
    assert "no Kineto trace" in err[0] and str(run_dir) in err[0]
    starts = [c for c in api.calls if c[0] == "start"]
    assert [c[1] for c in starts] == [f"tessera_step_{i}" for i in range(4)]
    # each step range ends before the next starts; the last ends at stop()
    opened = None
    for c in api.calls:
        if c[0] == "start":
            assert opened is None
            opened = c[2]
        elif c[0] == "end":
            assert c[1] == opened
            opened = None
    assert opened is None
    regions = [c for c in api.calls if c[0] in ("push", "pop")]
    assert regions == [("push", "forward"), ("push", "forward/attention"), ("pop",), ("pop",)] * 3


def test_marker_only_mode_keeps_an_existing_run_as_it_was(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    with profile.session(
        activities=[],
        schedule=profile.schedule(wait=0, warmup=0, active=2),
        tensorboard_dir=run_dir,
    ) as sess:
        _loop(sess, 2)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    monkeypatch.setenv("CUDA_INJECTION64_PATH", NSYS_LIB)
    monkeypatch.setattr(
        session_mod, "torch_nvtx_markers", lambda torch: NvtxMarkers(RecordingNvtx())
    )
    with profile.session(
        activities=[],
        schedule=profile.schedule(wait=0, warmup=0, active=2),
        tensorboard_dir=run_dir,
    ) as sess:
        _loop(sess, 2)
    assert sess.markers_only == "Nsight Systems"
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    assert open_run(str(run_dir)).steps == [0, 1]


def test_normal_session_with_cuda_also_opens_the_step_ranges(tmp_path, monkeypatch):
    api = RecordingNvtx()
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    monkeypatch.setattr(session_mod, "torch_nvtx_markers", lambda torch: NvtxMarkers(api))
    with profile.session(
        activities=[],
        schedule=profile.schedule(wait=0, warmup=0, active=2),
        tensorboard_dir=tmp_path / "run",
    ) as sess:
        _loop(sess, 2)
    assert sess.markers_only is None and sess.steps_written == [0, 1]
    assert [c[1] for c in api.calls if c[0] == "start"] == [
        "tessera_step_0",
        "tessera_step_1",
        "tessera_step_2",
    ]
    assert sum(c[0] == "push" for c in api.calls) == sum(c[0] == "pop" for c in api.calls) == 4
    # regions outside a session open no ranges
    n = len(api.calls)
    with profile.region("after"):
        pass
    assert len(api.calls) == n


MARKERS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from tessera import profile

    seen = []
    with profile.session(activities=["cpu", "gpu", "memory"], record_shapes=True,
                         tensorboard_dir=sys.argv[1]) as sess:
        for i in range(5):
            with profile.region("forward"):
                torch.randn(64, 64) @ torch.randn(64, 64)
            seen.append(torch.autograd.profiler._is_profiler_enabled)
            sess.step()
    print(json.dumps({"profiler_on": any(seen), "markers_only": sess.markers_only}))
    """
)


def test_under_ncu_a_real_torch_session_starts_no_profiler_and_says_so_in_one_line(tmp_path):
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    env = dict(os.environ, CUDA_INJECTION64_PATH=NCU_LIB)
    out = subprocess.run(
        [sys.executable, "-c", MARKERS_SCRIPT, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "profiler_on": False,
        "markers_only": "Nsight Compute",
    }
    lines = [ln for ln in out.stderr.splitlines() if "tessera" in ln]
    assert len(lines) == 1 and "running under Nsight Compute" in lines[0], out.stderr
    assert not run_dir.exists()
    assert nvtx_markers.step_range_name(3) == "tessera_step_3"
