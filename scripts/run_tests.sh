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

step "chromium for the plugin's browser tests (Debian package; never \`playwright install\`)"
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
fi
# Browser tests fail, rather than skip, when chromium is missing.
export TESSERA_REQUIRE_BROWSER=1
# The importer's C scanner and column packer are built by the install above (gcc and
# Python's headers); their tests fail, rather than skip, when they are missing.
export TESSERA_REQUIRE_SCANNER=1

step "ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

step "pytest"
exec .venv/bin/python -m pytest "$@"
