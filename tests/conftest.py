"""Shared fixtures: the real traces in ../shared/traces and runs imported from them once."""

from __future__ import annotations

import glob
import json
import os
import threading
from urllib.parse import quote

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TRACES = os.path.join(os.path.dirname(ROOT), "shared", "traces")
DEMO_RUNS = os.path.join(ROOT, "demo_runs")


def live_threads() -> set[threading.Thread]:
    """The threads running, but the memory's trim (background._trim_later): a timer that an
    import leaves behind, which may start or end at any moment of a later test."""
    return {t for t in threading.enumerate() if t.name != "tessera-trim"}


def shared_trace_files() -> list[str]:
    files = sorted(glob.glob(os.path.join(SHARED_TRACES, "**", "*.json.gz"), recursive=True))
    if not files:
        raise RuntimeError(
            f"no traces under {SHARED_TRACES}: the tests need ../shared beside the repo"
        )
    return files


def trace_id(path: str) -> str:
    return os.path.relpath(path, SHARED_TRACES)


@pytest.fixture
def started_threads(monkeypatch) -> list[str]:
    """The names of the threads started from here on, in order (Thread.start spied on)."""
    names: list[str] = []
    real_start = threading.Thread.start

    def spy(thread: threading.Thread) -> None:
        names.append(thread.name)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", spy)
    return names


@pytest.fixture(scope="session")
def imported_runs(tmp_path_factory):
    """Each shared trace file imported on its own: {path: run_dir}. Imported lazily, once."""
    from tessera_tb.importers.kineto_import import import_traces

    logdir = tmp_path_factory.mktemp("imported")
    cache: dict[str, str] = {}

    def get(path: str) -> str:
        if path not in cache:
            run = trace_id(path).replace("/", "_").replace(".", "_")
            cache[path] = import_traces([path], str(logdir), run).run_dir
        return cache[path]

    return get


def tessera_prof(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    """Run `tessera-prof ARGS...` in a fresh interpreter; returns the CompletedProcess."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


def file_contents(directory) -> dict[str, bytes]:
    """Every file under `directory`: '/'-separated relative path -> bytes."""
    out = {}
    for dirpath, _, files in os.walk(directory):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, directory).replace(os.sep, "/")] = fh.read()
    return out


def needs_scanner() -> list:
    """`pytestmark` of a module that needs the C scanner: a skip where it is not built, an
    error instead where TESSERA_REQUIRE_SCANNER=1 (CI builds it)."""
    from tessera_tb.importers import kineto_decode

    return _needs_c_module(kineto_decode._kineto_scan, "the C scanner (_kineto_scan)")


def needs_colpack() -> list:
    """needs_scanner for the C column packer (trace/_colpack.c), built beside it."""
    from tessera_tb.trace import columns

    return _needs_c_module(columns._colpack, "the C column packer (_colpack)")


def _needs_c_module(module, what: str) -> list:
    if module is not None:
        return []
    if os.environ.get("TESSERA_REQUIRE_SCANNER") == "1":
        raise RuntimeError(f"{what} is not built: is a C compiler there?")
    return [pytest.mark.skip(reason=f"{what} is not built (no C compiler)")]


def assert_same_files(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    """Two {path: bytes} maps (file_contents) are equal; else fails naming only what differs:
    the paths on one side only and, per differing file, its sizes and first differing byte."""
    lines = [f"only in got: {p}" for p in sorted(set(got) - set(want))]
    lines += [f"only in want: {p}" for p in sorted(set(want) - set(got))]
    for p in sorted(set(got) & set(want)):
        a, b = got[p], want[p]
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            lines.append(
                f"differs: {p} ({len(a)} vs {len(b)} bytes, first at byte {at}: "
                f"{a[at : at + 16]!r} vs {b[at : at + 16]!r})"
            )
    if lines:
        raise AssertionError(f"{len(lines)} file(s) differ:\n" + "\n".join(lines[:20]))


def run_links_named(view: dict, run: str) -> dict:
    """`view` with its findings' deep links' run (`t.run=<run>`) replaced by `RUN`, so that two
    copies of one run under different names (a directory and its bundle) compare equal; fails if
    a link names another run."""
    text = json.dumps(view)
    own = f"t.run={quote(run, safe='')}"
    assert text.count("t.run=") == text.count(own), f"a link names a run other than {run}"
    return json.loads(text.replace(own, "t.run=RUN"))
