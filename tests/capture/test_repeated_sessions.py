"""A second session into the same tensorboard_dir keeps the first one's capture: the new one is
a capture (run) of its own, steps never mixed; overwrite=True replaces it."""

from __future__ import annotations

import warnings

from tessera import profile
from tessera_tb.trace import open_run
from tessera_tb.trace.layout import find_runs
from tests.conftest import tessera_prof


def _capture(run_dir, counter_base: int, steps: int, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile.session(
            activities=[],
            schedule=profile.schedule(wait=0, warmup=0, active=steps, repeat=1),
            tensorboard_dir=str(run_dir),
            writer="thread",
            **kwargs,
        ) as sess:
            for i in range(steps + 1):
                profile.counter(name="tokens", value=counter_base + i, unit="count")
                sess.step()
    return sess, [str(w.message) for w in caught]


def _tokens(run_dir) -> dict[int, float]:
    run = open_run(str(run_dir))
    out = {}
    for s in run.steps:
        (c,) = [c for c in run.load_step("worker0", s).counters if c.name == "tokens"]
        out[s] = c.values.tolist()[0]
    return out


def test_second_and_third_sessions_keep_the_earlier_captures(tmp_path):
    logdir = tmp_path / "runs"
    first, msgs = _capture(logdir / "exp1", 100, 3)
    assert first.run_dir == str(logdir / "exp1") and msgs == []
    second, msgs = _capture(logdir / "exp1", 200, 2)
    assert second.run_dir == str(logdir / "exp1" / "capture-2")
    assert any("earlier capture" in m and "capture-2" in m for m in msgs), msgs
    third, _ = _capture(logdir / "exp1", 300, 1)
    assert third.run_dir == str(logdir / "exp1" / "capture-3")
    # Each capture whole and alone: its own steps, its own counter values.
    assert _tokens(logdir / "exp1") == {0: 100, 1: 101, 2: 102}
    assert _tokens(logdir / "exp1" / "capture-2") == {0: 200, 1: 201}
    assert _tokens(logdir / "exp1" / "capture-3") == {0: 300}
    # Listed as three runs by discovery (the plugin's run list) and by the CLI.
    assert sorted(find_runs(str(logdir))) == ["exp1", "exp1/capture-2", "exp1/capture-3"]
    bundle = tmp_path / "c2.tessera.zip"
    proc = tessera_prof("pack", str(logdir / "exp1" / "capture-2"), "-o", str(bundle))
    assert proc.returncode == 0, proc.stderr
    assert open_run(str(bundle)).steps == [0, 1]


def test_overwrite_true_replaces_the_earlier_capture(tmp_path):
    run_dir = tmp_path / "exp1"
    _capture(run_dir, 100, 3)
    sess, msgs = _capture(run_dir, 200, 2, overwrite=True)
    assert sess.run_dir == str(run_dir)
    assert _tokens(run_dir) == {0: 200, 1: 201}
    assert not (run_dir / "capture-2").exists()
