"""Steps encoded in several threads are written in order, byte for byte as by one thread,
and an encode error stops the import with nothing written after it."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest

from tessera_tb.importers import kineto_import
from tessera_tb.importers.kineto_decode import read_trace
from tessera_tb.importers.kineto_import import StepWriterThread, import_traces
from tessera_tb.importers.kineto_span import StringTable, build_span
from tessera_tb.trace.writer import encode_step
from tests.conftest import SHARED_TRACES, assert_same_files
from tests.importers.test_parallel_import import _run_files

STACK = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")


@pytest.mark.parametrize("encoders", [2, 3])
def test_steps_encoded_in_threads_are_the_same_files(encoders, tmp_path, monkeypatch):
    monkeypatch.setattr(kineto_import, "INLINE_SPAN_EVENTS", 0)  # threads for every span
    monkeypatch.setattr(kineto_import, "encoder_threads", lambda: 1)
    one = import_traces([DDP, STACK], str(tmp_path / "a"), "r", jobs=1)
    monkeypatch.setattr(kineto_import, "encoder_threads", lambda: encoders)
    many = import_traces([DDP, STACK], str(tmp_path / "b"), "r", jobs=1)
    assert [w.steps for w in many.workers] == [w.steps for w in one.workers]
    a, b = _run_files(one.run_dir), _run_files(many.run_dir)
    assert len(a) == 2 * 4 + 3 + 3  # 3 steps + meta of 2 ranks, 2 steps + meta, 3 event files
    assert_same_files(a, b)


def test_a_small_span_is_written_without_threads_to_the_same_files(
    tmp_path, monkeypatch, started_threads
):
    """Spans of fewer than INLINE_SPAN_EVENTS events are encoded and written in the calling
    thread (no thread is started for them); the files are those the threads write."""
    inline = import_traces([DDP, STACK], str(tmp_path / "a"), "r", jobs=1)
    assert not [n for n in started_threads if n.startswith(("tessera-encode", "tessera-write"))]
    monkeypatch.setattr(kineto_import, "INLINE_SPAN_EVENTS", 0)
    threaded = import_traces([DDP, STACK], str(tmp_path / "b"), "r", jobs=1)
    assert [n for n in started_threads if n.startswith("tessera-write")]
    assert_same_files(_run_files(inline.run_dir), _run_files(threaded.run_dir))


def _steps(n: int) -> list:
    """n copies of a real step (the single-GPU trace's first), numbered 0 to n - 1."""
    path = next(os.path.join(STACK, f) for f in sorted(os.listdir(STACK)) if ".pt.trace" in f)
    base = build_span(read_trace(path), StringTable(), 0, 0).steps[0]
    return [dataclasses.replace(base, step=i) for i in range(n)]


def test_writes_come_in_put_order_from_slow_and_fast_encoders():
    steps = _steps(12)
    written: list[tuple[int, bytes]] = []
    release = threading.Event()

    def encode(step):
        if step.step == 0:  # the first step is the slowest: later ones finish before it
            release.wait(5)
        elif step.step == 5:
            release.set()
        return encode_step(step)

    with StepWriterThread(lambda s, d: written.append((s.step, d)), encode, encoders=3) as out:
        for s in steps:
            out.put(s)
    assert [n for n, _ in written] == list(range(12))
    assert all(d == encode_step(s) for (_, d), s in zip(written, steps))


def test_an_encode_error_is_raised_and_later_steps_are_not_written():
    steps = _steps(8)
    written: list[int] = []

    def encode(step):
        if step.step == 3:
            raise ValueError("step 3 cannot be encoded")
        return encode_step(step)

    with pytest.raises(ValueError, match="step 3 cannot be encoded"):
        with StepWriterThread(lambda s, d: written.append(s.step), encode, encoders=2) as out:
            for s in steps:
                out.put(s)
    assert written == [0, 1, 2]


def test_leaving_on_the_callers_error_writes_nothing_more():
    steps = _steps(6)
    written: list[int] = []
    gate = threading.Event()

    def write(step, data):
        gate.wait(10)  # held until the caller's error is seen
        written.append(step.step)

    out = StepWriterThread(write, encode_step, encoders=2, depth=4)

    def release_once_abandoned():
        while not out._abandon:
            time.sleep(0.001)
        gate.set()

    threading.Thread(target=release_once_abandoned, daemon=True).start()
    with pytest.raises(RuntimeError, match="caller failed"):
        with out:
            for s in steps[:4]:
                out.put(s)
            raise RuntimeError("caller failed")
    # At most the step already in the writer's hands; none of those still waiting.
    assert written in ([], [0])
