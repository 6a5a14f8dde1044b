"""An install where no C compiler built the extensions (the scanner and the column packer):
`tessera-prof import` still imports, through the whole-file and the bounded readers, and
writes the same steps as with them.

The modules are made unimportable in a fresh interpreter (None in sys.modules), as on a
machine that never built them; TESSERA_PURE_PYTHON=1 alone would still import them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tessera_tb.trace.reader import open_run
from tests.conftest import SHARED_TRACES

DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")
_WITHOUT_C = (
    "import sys, runpy\n"
    "sys.modules['tessera_tb.importers._kineto_scan'] = None\n"
    "sys.modules['tessera_tb.trace._colpack'] = None\n"
    "from tessera_tb.importers import kineto_decode\n"
    "from tessera_tb.trace import columns\n"
    "assert kineto_decode._kineto_scan is None and columns._colpack is None\n"
    "sys.argv = ['tessera-prof', *sys.argv[1:]]\n"
    "runpy.run_module('tessera.cli.main', run_name='__main__')\n"
)


def _import(logdir: str, *, without_c: bool, stream: str) -> subprocess.CompletedProcess:
    cmd = (
        [sys.executable, "-c", _WITHOUT_C]
        if without_c
        else [sys.executable, "-m", "tessera.cli.main"]
    )
    env = {**os.environ, "TESSERA_IMPORT_STREAM": stream}
    return subprocess.run(
        [*cmd, "import", DDP, "--logdir", logdir, "--run", "ddp"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _steps(run_dir: str) -> dict:
    out = {}
    for worker, step in open_run(run_dir).iter_steps():
        names = step.string_values(step.events["name_id"])
        out[(worker, step.step)] = (
            sorted(zip(step.events["start_ns"].tolist(), names.tolist())),
            int(step.events["dur_ns"].sum()),
        )
    return out


@pytest.mark.parametrize("stream", ["never", "always"])
def test_import_without_the_c_modules(tmp_path, stream):
    plain = _import(str(tmp_path / "c"), without_c=False, stream=stream)
    assert plain.returncode == 0, plain.stderr
    done = _import(str(tmp_path / "noc"), without_c=True, stream=stream)
    assert done.returncode == 0, done.stderr
    assert "the C trace scanner is not built" in done.stderr  # and how to build it
    want = _steps(str(tmp_path / "c" / "ddp"))
    assert want and _steps(str(tmp_path / "noc" / "ddp")) == want
