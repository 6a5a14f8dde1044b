#!/usr/bin/env bash
# Install the test dependencies into .venv and run the whole test suite (lint included).
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -k roundtrip`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

step() { printf '\n== %s\n' "$*"; }

step "project and test dependencies (.venv)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,torch]' -c constraints/test.txt

step "protoc 31.1 for the generated-module freshness test (.venv-protoc, outside the project)"
[ -x .venv-protoc/bin/python ] || {
  "$PY" -m venv .venv-protoc &&
    .venv-protoc/bin/python -m pip install -q --disable-pip-version-check grpcio-tools==1.74.0
}
export TESSERA_PROTOC_PYTHON="$PWD/.venv-protoc/bin/python" TESSERA_REQUIRE_PROTOC=1

step "ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

step "pytest"
exec .venv/bin/python -m pytest "$@"
