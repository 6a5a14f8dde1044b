"""Run creation is exclusive and leaves nothing behind: racing imports of one run name, bundles
unpacked into one run, imports killed with SIGKILL at random points (trace/run_placement.py)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from tessera_tb.importers.kineto_import import ImportFailed, import_traces
from tessera_tb.trace import open_run
from tessera_tb.trace.bundle import pack_run, unpack_bundle
from tessera_tb.trace.layout import find_runs
from tests.conftest import SHARED_TRACES, assert_same_files, file_contents

AMD = os.path.join(SHARED_TRACES, "hta_tests", "amd_trace")
GPT = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")


def _hidden(logdir) -> list[str]:
    return sorted(n for n in os.listdir(logdir) if n.startswith("."))


def _race(logdir, sources: list[str], overwrite: bool) -> dict[int, object]:
    """Import each source into `logdir/r` at once, in threads; {index: result or exception}."""
    outcome: dict[int, object] = {}
    barrier = threading.Barrier(len(sources))

    def one(i: int, src: str) -> None:
        barrier.wait()
        try:
            outcome[i] = import_traces([src], str(logdir), "r", overwrite=overwrite)
        except ImportFailed as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=one, args=(i, s)) for i, s in enumerate(sources)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


@pytest.mark.parametrize("attempt", range(4))
def test_of_racing_imports_into_one_run_exactly_one_wins(tmp_path, attempt):
    sources = [AMD, GPT, AMD]
    outcome = _race(tmp_path, sources, overwrite=False)
    won = [i for i, r in outcome.items() if not isinstance(r, Exception)]
    lost = [r for r in outcome.values() if isinstance(r, Exception)]
    assert len(won) == 1, outcome
    assert len(lost) == 2 and all("run already exists" in str(e) for e in lost)
    # The run on disk is the winner's, whole: its workers and steps.
    winner = outcome[won[0]]
    run = open_run(str(tmp_path / "r"))
    assert sorted(run.workers) == sorted(w.worker for w in winner.workers)
    assert run.steps == sorted({s for w in winner.workers for s in w.steps})
    assert _hidden(tmp_path) == []


def test_racing_overwrites_leave_one_whole_run(tmp_path):
    import_traces([DDP], str(tmp_path), "r")
    outcome = _race(tmp_path, [GPT, AMD, GPT], overwrite=True)
    assert all(not isinstance(r, Exception) for r in outcome.values()), outcome
    run = open_run(str(tmp_path / "r"))
    # One of the new imports, whole: never the old DDP run, never a mix of two.
    assert sorted(run.workers) in (["worker0"], [w.worker for w in outcome[1].workers])
    assert "rank0" not in run.workers
    assert _hidden(tmp_path) == []


def test_racing_bundle_unpacks_into_one_run_exactly_one_wins(tmp_path):
    src = tmp_path / "src"
    import_traces([GPT], str(src), "a")
    bundle = str(tmp_path / "a.tessera.zip")
    pack_run(str(src / "a"), bundle)
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    results: list[object] = []
    barrier = threading.Barrier(4)

    def one() -> None:
        barrier.wait()
        try:
            results.append(unpack_bundle(bundle, str(logdir / "a")))
        except ValueError as exc:
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(not isinstance(r, Exception) for r in results) == 1, results
    assert all("exists" in str(r) for r in results if isinstance(r, Exception))
    assert_same_files(file_contents(logdir / "a"), file_contents(src / "a"))
    assert _hidden(logdir) == []


_IMPORT = """
import sys
from tessera_tb.importers.kineto_import import import_traces
import_traces([sys.argv[1]], sys.argv[2], "r", overwrite=True, jobs=1)
"""
FSDP = os.path.join(SHARED_TRACES, "pytorch", "fsdp_gpt_4rank")


def _wait_for_staging(logdir, proc, timeout: float = 60.0) -> bool:
    """Wait until `proc`'s staging directory shows in `logdir`; False if it ended first."""
    mark = f"-{proc.pid}-"
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if any(mark in n for n in _hidden(logdir)):
            return True
        time.sleep(0.001)
    return False


def test_sigkill_at_random_points_keeps_the_old_run_and_the_next_import_cleans_up(tmp_path):
    import_traces([GPT], str(tmp_path), "r")
    before = file_contents(tmp_path / "r")
    rng = random.Random(15)
    killed, left = 0, 0
    for i in range(8):
        proc = subprocess.Popen([sys.executable, "-c", _IMPORT, FSDP, str(tmp_path)])
        if i % 2 == 0:
            # Anywhere from the interpreter's start-up to the end of the import (~1 s in all).
            time.sleep(rng.uniform(0.05, 1.1))
        elif _wait_for_staging(tmp_path, proc):
            # While the run is being written: at once the first time, then anywhere in the
            # ~0.4 s that the staging directory lives. A wall-clock guess alone missed it on
            # a machine faster or slower than expected.
            time.sleep(0.0 if i == 1 else rng.uniform(0.0, 0.4))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait()
        run = open_run(str(tmp_path / "r"))
        # The old run or the new one, whole: never neither, never a mix.
        assert sorted(run.workers) in (["worker0"], ["rank0", "rank1", "rank2", "rank3"])
        if sorted(run.workers) == ["worker0"]:
            assert_same_files(file_contents(tmp_path / "r"), before)
        # Each import removes what the one killed before it left: at most one at a time.
        assert len(_hidden(tmp_path)) <= 1
        left += bool(_hidden(tmp_path))
    assert killed >= 1
    assert left, "no kill left a staging directory: the test proves nothing"
    # The next import into that logdir removes what a killed one left; discovery never
    # listed it meanwhile.
    import_traces([AMD], str(tmp_path), "other")
    assert _hidden(tmp_path) == []
    assert sorted(find_runs(str(tmp_path))) == ["other", "r"]


def test_a_live_importers_staging_directory_is_left_alone(tmp_path):
    from tessera_tb.trace import run_placement

    mine = run_placement.make_staging_dir(str(tmp_path))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = os.path.join(
            str(tmp_path), f".tessera-import-{run_placement._HOST}-{sleeper.pid}-0a0b0c0d"
        )
        os.mkdir(other)
        assert run_placement.remove_stale_staging(str(tmp_path)) == []
        assert os.path.isdir(mine) and os.path.isdir(other)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert run_placement.remove_stale_staging(str(tmp_path)) == [other]
