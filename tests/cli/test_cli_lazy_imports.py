"""`tessera-prof` imports what a subcommand needs when it runs: a lean install without plotly
(or pandas) still runs `--help`, `import`, `report` and `attach`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import DEMO_RUNS, SHARED_TRACES

GPT = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")

# Runs the CLI with the named modules made unimportable (as where they are not installed), then
# prints which heavy modules ended up loaded.
_DRIVER = """
import json, runpy, sys
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None  # `import name` now raises ImportError
argv = json.loads(sys.argv[2])
sys.argv = ["tessera-prof", *argv]
code = 0
try:
    runpy.run_module("tessera.cli.main", run_name="__main__")
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
loaded = [m for m in ("plotly", "pandas", "torch") if sys.modules.get(m) is not None]
print("LOADED=" + json.dumps(loaded), file=sys.stderr)
sys.exit(code)
"""


def _cli_without(blocked: list[str], *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(blocked), json.dumps(list(args))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED="))
    return proc, json.loads(line[len("LOADED=") :])


def test_help_needs_neither_plotly_nor_pandas():
    proc, loaded = _cli_without(["plotly", "pandas"], "--help")
    assert proc.returncode == 0, proc.stderr
    assert "report" in proc.stdout and "import" in proc.stdout and "unpack" in proc.stdout
    assert loaded == []


def test_subcommand_help_loads_only_that_command():
    proc, loaded = _cli_without(["plotly"], "import", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--overwrite" in proc.stdout
    assert "plotly" not in loaded and "torch" not in loaded


def test_import_runs_without_plotly_or_pandas(tmp_path):
    proc, loaded = _cli_without(
        ["plotly", "pandas"], "import", GPT, "--logdir", str(tmp_path), "--run", "r", "-q"
    )
    assert proc.returncode == 0, proc.stderr
    assert os.path.isdir(tmp_path / "r")
    assert loaded == []


def test_report_runs_without_plotly():
    run_dir = os.path.join(DEMO_RUNS, "gpt_1gpu")
    proc, loaded = _cli_without(["plotly"], "report", run_dir, "--section", "summary")
    assert proc.returncode == 0, proc.stderr
    assert "== summary" in proc.stdout
    assert "plotly" not in loaded


@pytest.mark.parametrize("blocked", [["plotly"], ["plotly", "pandas"]])
def test_attach_starts_without_plotly(blocked):
    # A process that has already exited: attach must get as far as looking for it.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    proc, loaded = _cli_without(blocked, "attach", "--pid", str(dead.pid), "--duration-s", "0.1")
    assert "ModuleNotFoundError" not in proc.stderr and "ImportError" not in proc.stderr
    assert "tessera-prof attach:" in proc.stderr, proc.stderr
    assert "plotly" not in loaded
