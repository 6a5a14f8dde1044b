"""Installed as a newcomer would, into a fresh virtual environment: the declared runtime
dependencies bring the fast inflate path (isal), and a lean install without plotly still runs
`tessera-prof --help`, `report` and `diff`; `html` says in one line that it needs plotly."""

from __future__ import annotations

import os
import subprocess
import venv

from tests.conftest import ROOT

RUN_1GPU = os.path.join(ROOT, "tests", "data", "gpu_capture", "run_1gpu")


def _run(*cmd: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_fresh_install_has_isal_and_runs_without_plotly(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    out = _run(*pip, "--no-deps", ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    # What the package declares (not a list written here), less plotly: a lean install.
    reqs = _run(
        py,
        "-c",
        "import importlib.metadata as m; print('\\n'.join(r for r in m.requires("
        "'tessera-profiler') if 'extra ==' not in r))",
    )
    declared = reqs.stdout.split("\n")
    assert any(r.startswith("isal") for r in declared), declared
    assert any(r.startswith("zstandard") for r in declared), declared
    lean = [r for r in declared if r.strip() and not r.startswith("plotly")]
    out = _run(*pip, *lean)
    assert out.returncode == 0, out.stderr[-2000:]

    fast = _run(
        py,
        "-c",
        "import zlib; from tessera_tb.trace import columns; print(columns.deflate_module.__name__)",
    )
    assert fast.stdout.strip() == "isal.isal_zlib", fast.stderr

    prof = str(env_dir / "bin" / "tessera-prof")
    assert _run(py, "-c", "import plotly").returncode != 0  # really not there
    helped = _run(prof, "--help")
    assert helped.returncode == 0 and "report" in helped.stdout, helped.stderr
    report = _run(prof, "report", RUN_1GPU)
    assert report.returncode == 0, report.stderr
    assert "== summary" in report.stdout
    diff = _run(prof, "diff", RUN_1GPU, RUN_1GPU)
    assert diff.returncode in (0, 1), diff.stderr
    html = _run(prof, "html", RUN_1GPU, "-o", str(tmp_path / "r.html"))
    assert html.returncode == 2
    assert html.stderr.strip().splitlines() == [
        "tessera-prof html: error: the HTML report needs plotly (pip install plotly)"
    ]
