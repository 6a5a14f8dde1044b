"""`tessera-prof attach`: one-line refusals without a driver or a process, and the sampling
loop, counter tracks and summary checked against a stand-in for NVML."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from tessera.cli import attach_cmd
from tessera.cli.main import main


def _driver_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def test_a_pid_that_does_not_exist_is_refused_in_one_line(capsys):
    assert main(["attach", "--pid", "999999999", "--export", "t.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tessera-prof attach: error: no process with pid 999999999"]


def test_without_a_driver_attach_says_so_in_one_line_and_exits_2(capsys, tmp_path):
    if _driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        code = main(["attach", "--pid", str(sleeper.pid), "--export", str(tmp_path / "t.json")])
    finally:
        sleeper.kill()
        sleeper.wait()
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("tessera-prof attach: error: cannot read GPU counters (")
    assert "NVIDIA driver" in err[0]
    assert not (tmp_path / "t.json").exists()


class FakeNvml(types.SimpleNamespace):
    """Just enough of pynvml for one GPU whose counters count up with every read."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    class NVMLError_NotSupported(Exception):  # noqa: N801 (pynvml's name)
        pass

    def __init__(self, pid: int):
        super().__init__(reads=0, pid=pid)

    def nvmlDeviceGetCount(self):  # noqa: N802 (pynvml's names)
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return f"gpu{i}"

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        self.reads += 1
        return 100_000 + 1000 * self.reads  # mW

    def nvmlDeviceGetTemperature(self, h, kind):  # noqa: N802
        return 40

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return types.SimpleNamespace(gpu=50, memory=20)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):  # noqa: N802
        return 4  # sw power cap

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return types.SimpleNamespace(used=2**30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        return [types.SimpleNamespace(pid=self.pid, usedGpuMemory=5 * 2**20)]

    def nvmlDeviceGetProcessUtilization(self, h, last):  # noqa: N802
        raise self.NVMLError_NotSupported()


def test_sampling_stops_after_the_duration_and_tracks_every_counter(tmp_path):
    me = os.getpid()  # a process that outlives the sampling
    nv = FakeNvml(pid=me)
    assert attach_cmd.compute_devices(nv, me) == [0]
    assert attach_cmd.compute_devices(nv, me + 1) == []
    ts, rows, reason = attach_cmd.sample(nv, me, [0], 0.01, 0.2)
    assert reason == "0.2 s elapsed"
    assert ts == sorted(ts) and len(ts) >= 5
    series = {c.name: c for c in attach_cmd.counter_series(ts, rows)}
    assert series["power_w"].values.tolist() == [100.0 + k for k in range(1, len(ts) + 1)]
    assert series["proc_mem_used_bytes"].values.tolist() == [5.0 * 2**20] * len(ts)
    # Not supported by the device: NaN (not measured), never 0.
    assert np.isnan(series["proc_sm_util_pct"].values).all()
    summary = {r["counter"]: r for r in attach_cmd.summary_rows(series.values())}
    assert summary["power_w"]["max"] == 100.0 + len(ts)
    assert summary["power_w"]["mean"] == pytest.approx(100.0 + (len(ts) + 1) / 2)
    assert summary["proc_sm_util_pct"]["samples"] == 0


def test_attach_writes_counter_tracks_and_a_summary(tmp_path, monkeypatch):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        nv = FakeNvml(pid=sleeper.pid)
        monkeypatch.setattr(nv, "nvmlInit", lambda: None, raising=False)
        monkeypatch.setattr(nv, "nvmlShutdown", lambda: None, raising=False)
        from tessera.profile.sources import nvml_source

        monkeypatch.setattr(nvml_source, "init_nvml", lambda: nv)
        trace, summary = tmp_path / "trace.json", tmp_path / "perf.csv"
        args = ["--pid", str(sleeper.pid), "--sample-interval-ms", "10", "--duration-s", "0.2"]
        code = main(["attach", *args, "--export", str(trace), "--summary", str(summary)])
    finally:
        sleeper.kill()
        sleeper.wait()
    assert code == 0
    events = json.loads(trace.read_text())["traceEvents"]
    power = [e["args"]["power_w"] for e in events if e["ph"] == "C" and e["name"] == "power_w (W)"]
    assert len(power) >= 5 and power == sorted(power)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert "GPU 0" in names
    with open(summary) as f:
        rows = {r["counter"]: r for r in csv.DictReader(f)}
    assert rows["throttle_reasons"]["max"] == "4.0"
    assert int(rows["power_w"]["samples"]) == len(power)


def test_sampling_stops_when_the_process_exits():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    nv = FakeNvml(pid=proc.pid)
    try:
        ts, _, reason = attach_cmd.sample(nv, proc.pid, [0], 0.01, 20.0)
    finally:
        proc.wait()
    assert reason == "process exited"
    assert 0 < len(ts)
