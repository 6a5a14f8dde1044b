"""The guide's CLI line, verbatim: `tessera-prof --pid PID --sample-ms N --gpu --mem --tc
--collectives --export F --summary F` (the same command as `tessera-prof attach`)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tessera.cli.main import main

from .test_attach_cli import FakeNvml, _driver_present


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def fake_nvml(monkeypatch, sleeper):
    nv = FakeNvml(pid=sleeper.pid)
    monkeypatch.setattr(nv, "nvmlInit", lambda: None, raising=False)
    monkeypatch.setattr(nv, "nvmlShutdown", lambda: None, raising=False)
    from tessera.profile.sources import nvml_source

    monkeypatch.setattr(nvml_source, "init_nvml", lambda: nv)
    return nv


def _guide_line(pid: int, tmp_path, *domains: str, interval: str = "--sample-ms") -> list[str]:
    return [
        "--pid", str(pid), interval, "10", *domains, "--duration-s", "0.2",
        "--export", str(tmp_path / "trace.json"), "--summary", str(tmp_path / "perf.csv"),
    ]  # fmt: skip


def _summary(tmp_path) -> dict[str, dict]:
    with open(tmp_path / "perf.csv") as f:
        return {r["counter"]: r for r in csv.DictReader(f)}


def test_the_guide_line_samples_and_reports_what_it_cannot_as_null(
    tmp_path, sleeper, fake_nvml, capsys
):
    domains = ("--gpu", "--mem", "--tc", "--collectives")
    assert main(_guide_line(sleeper.pid, tmp_path, *domains)) == 0
    rows = _summary(tmp_path)
    assert int(rows["power_w"]["samples"]) >= 5 and rows["power_w"]["capability"] == "ok"
    assert rows["mem_used_bytes"]["max"] == str(float(2**30))
    for name in ("tc_util_pct", "collective_bytes", "collective_overlap_pct"):
        row = rows[name]
        assert (row["samples"], row["mean"]) == ("0", "")  # null, never 0
        assert row["capability"].startswith("unavailable: ")
    assert "hardware counters" in rows["tc_util_pct"]["capability"]
    err = capsys.readouterr().err
    assert err.count("tc_util_pct") == 1 and err.count("collective_bytes") == 1
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e["ph"] == "C" and e["name"] == "power_w (W)" for e in events)


def test_domain_flags_choose_what_is_sampled(tmp_path, sleeper, fake_nvml, capsys):
    assert main(_guide_line(sleeper.pid, tmp_path, "--mem", interval="--sample-interval-ms")) == 0
    rows = _summary(tmp_path)
    assert "mem_used_bytes" in rows and "proc_mem_used_bytes" in rows
    assert "power_w" not in rows and "tc_util_pct" not in rows
    assert "null" not in capsys.readouterr().err


def test_a_dead_pid_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert main(_guide_line(proc.pid, tmp_path, "--gpu", "--tc")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tessera-prof attach: error: no process with pid {proc.pid}"]
    assert list(tmp_path.iterdir()) == []


def test_the_guide_line_from_the_console_script_without_a_driver(tmp_path, sleeper):
    """The real NVML, through its no-driver branch: one line, exit 2, nothing written."""
    if _driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    line = _guide_line(sleeper.pid, tmp_path, "--gpu", "--mem", "--tc", "--collectives")
    out = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", *line], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "cannot read GPU counters" in out.stderr
    assert list(tmp_path.iterdir()) == []
