"""The committed trace_pb2.py matches trace.proto (compared by descriptor, not by text).

Needs protoc 31.1 (grpcio-tools 1.74.0): either importable here, or a Python that has it
named by TESSERA_PROTOC_PYTHON (.ci/run makes one in a throwaway venv). Set
TESSERA_REQUIRE_PROTOC=1 to turn a missing generator into a failure instead of a skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from tessera_tb.proto import trace_pb2
from tests.conftest import ROOT

PROTO = os.path.join("tessera_tb", "proto", "trace.proto")


def _protoc_python() -> str | None:
    named = os.environ.get("TESSERA_PROTOC_PYTHON")
    if named:
        return named
    if importlib.util.find_spec("grpc_tools") is not None:
        return sys.executable
    return None


def test_generated_module_matches_the_proto(tmp_path):
    python = _protoc_python()
    if python is None:
        if os.environ.get("TESSERA_REQUIRE_PROTOC") == "1":
            pytest.fail("TESSERA_REQUIRE_PROTOC=1 but no grpcio-tools to run protoc")
        pytest.skip("grpcio-tools==1.74.0 not available (see module docstring)")
    shutil.copytree(os.path.join(ROOT, "tessera_tb", "proto"), tmp_path / "tessera_tb" / "proto")
    (tmp_path / "tessera_tb" / "__init__.py").write_text("")
    subprocess.run(
        [python, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", PROTO],
        cwd=tmp_path,
        check=True,
    )
    script = (
        "import sys; sys.path.insert(0, '.'); "
        "from tessera_tb.proto import trace_pb2; "
        "sys.stdout.buffer.write(trace_pb2.DESCRIPTOR.serialized_pb)"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, check=True
    ).stdout
    assert fresh == trace_pb2.DESCRIPTOR.serialized_pb, (
        "tessera_tb/proto/trace_pb2.py is stale: regenerate it (docs/FORMAT.md, 'Schema changes')"
    )
