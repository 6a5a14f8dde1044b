"""glibc's malloc set for an import while it runs (background.import_malloc): applied once
before the import's threads start, changed once more when the last import ends (the arena
limit glibc's again, the thresholds where its adaptation would take them), never in the
way of the run files, and nothing at all where TESSERA_MALLOC=default or malloc is not
glibc's."""

from __future__ import annotations

import os

import pytest

from tessera_tb.importers import background, kineto_import
from tessera_tb.importers.kineto_import import import_traces
from tests.conftest import SHARED_TRACES, assert_same_files
from tests.importers.test_parallel_import import _run_files

RESNET = os.path.join(SHARED_TRACES, "pytorch_2021", "resnet50_num_workers_0")
DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")

pytestmark = pytest.mark.skipif(
    background._mallopt() is None, reason="malloc is not glibc's: import_malloc does nothing"
)


class _Recorder:
    """glibc's mallopt, each call noted with how many imports were running."""

    def __init__(self) -> None:
        self.real = background._mallopt()
        self.calls: list[tuple[int, int]] = []

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.real(param, value)


def _record(monkeypatch) -> _Recorder:
    recorder = _Recorder()
    monkeypatch.setattr(background, "_mallopt", lambda: recorder)
    return recorder


def _tuned_at_each_step(monkeypatch) -> list[int]:
    """How many imports held the settings as each step was encoded (filled as they are)."""
    seen: list[int] = []
    encode = kineto_import.encode_step

    def noting(step):
        seen.append(background._tuned)
        return encode(step)

    monkeypatch.setattr(kineto_import, "encode_step", noting)
    return seen


def test_an_import_runs_with_the_settings_and_puts_glibcs_back(tmp_path, monkeypatch):
    recorder = _record(monkeypatch)
    seen = _tuned_at_each_step(monkeypatch)
    trims = []
    monkeypatch.setattr(
        background, "_trim_later", lambda delay: trims.append((background._tuned, delay))
    )
    import_traces([RESNET], str(tmp_path), "r")
    assert seen and set(seen) == {1}  # every step was encoded with the settings on
    assert recorder.calls == list(background._IMPORT_SETTINGS + background._AFTER_SETTINGS)
    assert background._tuned == 0
    # memory freed on the way is reused, not trimmed; once the import ends, it is given
    # back a while later
    assert trims == [(0, background.TRIM_DELAY_S)]


def _trims(monkeypatch) -> list[int]:
    """malloc_trim's calls (their pad), glibc's own trim made after each."""
    calls: list[int] = []
    real = background._malloc_trim()

    def trim(pad: int) -> int:
        calls.append(pad)
        return real(pad)

    monkeypatch.setattr(background, "_malloc_trim", lambda: trim)
    return calls


def test_the_freed_memory_is_given_back_after_the_import_not_during_it(tmp_path, monkeypatch):
    calls = _trims(monkeypatch)
    monkeypatch.setattr(background, "TRIM_DELAY_S", 1.0)
    import_traces([RESNET], str(tmp_path), "r")
    timer = background._pending_trim
    assert calls == [] and timer is not None and timer.name == "tessera-trim" and timer.daemon
    timer.join(10)
    assert calls == [0]


def test_an_import_started_before_the_trim_reuses_the_memory_instead(tmp_path, monkeypatch):
    calls = _trims(monkeypatch)
    monkeypatch.setattr(background, "TRIM_DELAY_S", 60.0)
    import_traces([RESNET], str(tmp_path), "a")
    first = background._pending_trim
    assert first is not None and first.is_alive()
    import_traces([DDP], str(tmp_path), "b")  # the first one's trim is called off
    first.join(10)
    assert not first.is_alive() and calls == []
    second = background._pending_trim
    assert second is not first and second.is_alive()
    second.cancel()


def test_workers_imported_at_once_share_one_setting(tmp_path, monkeypatch):
    recorder = _record(monkeypatch)
    import_traces([DDP], str(tmp_path), "r", jobs=2)
    assert recorder.calls == list(background._IMPORT_SETTINGS + background._AFTER_SETTINGS)
    with background.import_malloc():  # nested: the outer one applies and puts back
        with background.import_malloc():
            assert background._tuned == 2
        assert background._tuned == 1
    assert background._tuned == 0
    assert recorder.calls[-6:] == list(background._IMPORT_SETTINGS + background._AFTER_SETTINGS)


def test_the_run_files_are_the_same_with_glibcs_own_settings(tmp_path, monkeypatch):
    tuned = import_traces([RESNET, DDP], str(tmp_path / "a"), "r")
    monkeypatch.setenv("TESSERA_MALLOC", "default")
    recorder = _Recorder()
    monkeypatch.setattr(background, "ctypes", _NoMallopt(recorder))
    plain = import_traces([RESNET, DDP], str(tmp_path / "b"), "r")
    assert recorder.calls == []  # TESSERA_MALLOC=default: glibc's settings stay as they are
    assert_same_files(_run_files(plain.run_dir), _run_files(tuned.run_dir))


class _NoMallopt:
    """ctypes whose C library's mallopt records instead of calling (to see it is not used)."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder

    def CDLL(self, _name):  # noqa: N802 - ctypes' name
        recorder = self.recorder

        class _Lib:
            def mallopt(self, param, value):
                recorder.calls.append((param, value))
                return 1

            def malloc_trim(self, _pad):
                return 1

        return _Lib()


def test_without_glibcs_mallopt_nothing_is_set_and_the_import_works(tmp_path, monkeypatch):
    monkeypatch.setattr(background, "_mallopt", lambda: None)
    with background.import_malloc():
        assert background._tuned == 0
    result = import_traces([DDP], str(tmp_path), "r")
    assert [len(w.steps) for w in result.workers] == [3, 3]


def test_a_worker_imported_alone_runs_with_the_settings(tmp_path, monkeypatch):
    """A Dask task imports one worker (import_worker) in a worker process: the settings
    hold there too, and are changed back after it."""
    recorder = _record(monkeypatch)
    seen = _tuned_at_each_step(monkeypatch)
    files = sorted(os.path.join(RESNET, f) for f in os.listdir(RESNET) if f.endswith(".json.gz"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    kineto_import.import_worker("worker0", files[:1], str(run_dir))
    assert seen and set(seen) == {1}
    assert recorder.calls == list(background._IMPORT_SETTINGS + background._AFTER_SETTINGS)


def test_a_refused_setting_leaves_none_of_them(monkeypatch):
    """Where glibc refuses one setting, the import runs with none (those applied are set as
    an import's end leaves them) and nothing more is changed when it ends."""
    calls = []

    def refusing(param, value):
        calls.append((param, value))
        return (
            0
            if param == background._M_MMAP_THRESHOLD and value == 32 << 20 and len(calls) < 3
            else 1
        )

    monkeypatch.setattr(background, "_mallopt", lambda: refusing)
    with background.import_malloc():
        assert background._tuned == 0
    assert calls == list(background._IMPORT_SETTINGS + background._AFTER_SETTINGS)
