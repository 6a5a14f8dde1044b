"""Caps stop capture cleanly, and no failure of the capture stops the training loop."""

from __future__ import annotations

import os
import time
import warnings

import pytest

from tessera import profile
from tessera.profile import TesseraWarning
from tessera_tb.trace import open_run
from tessera_tb.trace.layout import worker_dir


def _tessera_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, TesseraWarning)]


def test_max_steps_stops_an_endless_schedule_with_one_warning(tmp_path, tiny_model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile.session(
            activities=["cpu"],
            schedule=profile.schedule(wait=0, warmup=1, active=2, repeat=0),
            tensorboard_dir=str(tmp_path / "run"),
            max_steps=3,
        ) as sess:
            done = 0
            for _ in range(12):
                tiny_model()
                sess.step()
                done += 1
    assert done == 12
    assert sess.steps_written == [1, 2, 4]
    assert open_run(str(tmp_path / "run")).steps == [1, 2, 4]
    messages = _tessera_warnings(caught)
    assert len(messages) == 1 and "max_steps=3" in messages[0]
    # The window cut by the cap is ended cleanly: torch never sees RECORD followed by NONE.
    assert not [w for w in caught if "Incorrect schedule" in str(w.message)]


def test_max_bytes_stops_capture_with_one_warning(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile.session(
            activities=[],
            schedule=profile.schedule(wait=0, warmup=0, active=1, repeat=0),
            tensorboard_dir=str(tmp_path / "run"),
            max_bytes=1,
        ) as sess:
            for _ in range(20):
                with profile.region("r"):
                    time.sleep(0.002)
                sess.step()
    assert sess.steps_written == [0]
    messages = _tessera_warnings(caught)
    assert len(messages) == 1 and "max_bytes=1" in messages[0]
    assert open_run(str(tmp_path / "run")).steps == [0]


def test_an_unwritable_tensorboard_dir_warns_and_the_loop_runs_to_the_end(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile.session(
            activities=["cpu"],
            schedule=profile.schedule(wait=0, warmup=0, active=2, repeat=0),
            tensorboard_dir=str(blocker / "run"),
        ) as sess:
            done = 0
            for _ in range(5):
                with profile.region("r"):
                    pass
                sess.step()
                done += 1
    assert done == 5
    assert not sess.enabled and sess.steps_written == []
    assert sess.torch_source is None  # no profiler was started
    messages = _tessera_warnings(caught)
    assert len(messages) == 1 and "cannot write" in messages[0]


def test_a_write_failure_mid_run_stops_capture_and_the_loop_runs_on(tmp_path):
    run_dir = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile.session(
            activities=[],
            schedule=profile.schedule(wait=0, warmup=0, active=1, repeat=0),
            tensorboard_dir=str(run_dir),
        ) as sess:
            done = 0
            for i in range(12):
                sess.step()
                done += 1
                if i == 2:
                    deadline = time.monotonic() + 20
                    while not sess.steps_written and time.monotonic() < deadline:
                        time.sleep(0.01)
                    # The worker directory becomes a file: every later write fails. (Moved
                    # away in one rename: the writer may be writing into it right now.)
                    directory = worker_dir(str(run_dir), "worker0")
                    os.rename(directory, str(tmp_path / "moved_away"))
                    with open(directory, "w") as f:
                        f.write("in the way")
    assert done == 12
    messages = _tessera_warnings(caught)
    assert len(messages) == 1
    assert "capture stopped after an error" in messages[0] and "cannot write" in messages[0]
    assert len(sess.steps_written) < 12


def test_a_source_that_raises_is_disabled_with_one_warning(tmp_path, tiny_model, monkeypatch):
    from tessera.profile.sources import torch_source

    real_step = torch_source.TorchSource.step
    calls = {"n": 0}

    def flaky_step(self):
        calls["n"] += 1
        # The step() call that ends step 3: the first sess.step() ends the provisional
        # step 0 by restarting the profiler (TorchSource.restart_at), not by its step().
        if calls["n"] == 3:
            raise RuntimeError("simulated profiler failure")
        real_step(self)

    monkeypatch.setattr(torch_source.TorchSource, "step", flaky_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile.session(
            activities=["cpu"],
            schedule=profile.schedule(wait=0, warmup=1, active=2, repeat=0),
            tensorboard_dir=str(tmp_path / "run"),
        ) as sess:
            for _ in range(9):
                with profile.region("train"):
                    tiny_model()
                sess.step()
    messages = _tessera_warnings(caught)
    assert len(messages) == 1 and "simulated profiler failure" in messages[0]
    run = open_run(str(tmp_path / "run"))
    # Steps 1 and 2 came from the profiler; 4, 5, 7 and 8 from the host source alone.
    assert run.steps == [1, 2, 4, 5, 7, 8]
    with_ops = run.load_step("worker0", 2).frame()
    assert (with_ops.kind == "cpu_op").any()
    for s in (4, 5, 7, 8):
        step = run.load_step("worker0", s)
        df = step.frame()
        assert not (df.kind == "cpu_op").any()
        assert list(df[df.kind == "region"].name) == ["train"]
    caps = {c.name: c for c in run.workers["worker0"].meta.capabilities}
    assert caps["torch_profiler"].status == "unavailable"
    assert "simulated profiler failure" in caps["torch_profiler"].reason


def test_nvml_without_a_driver_is_unavailable_with_nvmls_own_reason(tmp_path):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        expected = str(exc)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with profile.session(
        activities=["power"],
        schedule=profile.schedule(wait=0, warmup=0, active=1, repeat=1),
        tensorboard_dir=str(tmp_path / "run"),
    ) as sess:
        sess.step()
    caps = {c.name: c for c in open_run(str(tmp_path / "run")).workers["worker0"].meta.capabilities}
    assert caps["nvml"].status == "unavailable"
    assert caps["nvml"].reason == f"NVML: {expected}"
    assert sess.steps_written == [0]


def test_ranks_not_listed_run_untouched(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with profile.session(
        activities=["cpu"], ranks=[0, 1], tensorboard_dir=str(tmp_path / "run")
    ) as sess:
        for _ in range(3):
            sess.step()
    assert (sess.rank, sess.worker, sess.enabled) == (3, "rank3", False)
    assert sess.torch_source is None and sess.writer is None
    assert not os.path.exists(tmp_path / "run")


def test_a_listed_rank_is_named_after_its_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with profile.session(
        activities=[],
        ranks=[0, 1],
        schedule=profile.schedule(wait=0, warmup=0, active=1, repeat=1),
        tensorboard_dir=str(tmp_path / "run"),
    ) as sess:
        sess.step()
    meta = open_run(str(tmp_path / "run")).workers["rank1"].meta
    assert (meta.rank, meta.world_size) == (1, 4)
