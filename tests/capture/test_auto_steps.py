"""Steps without `sess.step()`: each optimizer step ends a step; with none, the block is one."""

from __future__ import annotations

import pytest

from tessera import profile
from tessera_tb.trace import open_run

torch = pytest.importorskip("torch")

N_ITERS = 12


def _optimizer_step_spans(step) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of the `Optimizer.step#...` ops torch records in a step."""
    df = step.frame()
    df = df[df.name.str.startswith("Optimizer.step#")]
    return list(zip(df.start_ns.astype(int), df.end_ns.astype(int)))


@pytest.fixture(scope="module")
def no_step_calls(tmp_path_factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    run_dir = tmp_path_factory.mktemp("auto") / "exp1"
    with profile.session(tensorboard_dir=str(run_dir)) as sess:
        for _ in range(N_ITERS):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    # The session's wrapper of opt.step is gone once the session has ended.
    assert "step" not in opt.__dict__
    return sess, open_run(str(run_dir))


def test_default_schedule_active_steps_each_one_optimizer_step(no_step_calls):
    sess, run = no_step_calls
    assert sess.step_source == "optimizer"
    assert run.steps == profile.schedule().active_steps(N_ITERS) == [2, 3, 4]
    worker = run.workers["worker0"]
    spans = {e.step: (e.start_ns, e.end_ns) for e in worker.meta.steps}
    for step_num in run.steps:
        step = run.load_step("worker0", step_num)
        start, end = spans[step_num]
        # The step ends when the optimizer step has returned: the op lies inside the step,
        # the last thing in it (only the profiler's step switch follows).
        opt = _optimizer_step_spans(step)
        assert len(opt) == 1, (step_num, opt)
        o_start, o_end = opt[0]
        assert start <= o_start < o_end <= end
        df = step.frame()
        later = df[(df.kind == "cpu_op") & (df.start_ns >= o_end)]
        assert later.empty, (step_num, later.name.tolist())  # zero_grad is in the next step
    assert "recorded steps 2-4 of 0-12" in sess.exit_line
    assert str(sess.run_dir) in sess.exit_line


def test_inference_block_is_one_step(tmp_path, capfd):
    model = torch.nn.Linear(16, 16)
    with profile.session(tensorboard_dir=str(tmp_path / "inf")) as sess, torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 16))
    run = open_run(str(tmp_path / "inf"))
    assert run.steps == [0]
    names = set(run.load_step("worker0", 0).frame().name)
    assert "aten::linear" in names
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("tessera capture:")]
    assert len(lines) == 1 and "recorded steps 0 of 0-0" in lines[0], err
    assert "whole block is one step" in lines[0] and "tensorboard --logdir" in lines[0]
    assert sess.step_source == "pending"


def test_explicit_step_calls_win(tmp_path, tiny_model):
    """`opt.step()` then work then `sess.step()`: steps end at the `sess.step()` calls."""
    sched = profile.schedule(wait=1, warmup=1, active=2)
    with profile.session(schedule=sched, tensorboard_dir=str(tmp_path / "ex")) as sess:
        for i in range(5):
            tiny_model()
            with profile.region(f"after_optimizer{i}"):
                pass
            sess.step()
    run = open_run(str(tmp_path / "ex"))
    assert sess.step_source == "explicit"
    assert run.steps == [2, 3]
    for s in run.steps:
        df = run.load_step("worker0", s).frame()
        assert sorted(df[df.kind == "region"].name) == [f"after_optimizer{s}"]
        assert len(_optimizer_step_spans(run.load_step("worker0", s))) == 1


def test_nothing_recorded_says_why(tmp_path, capfd):
    with profile.session(activities=["cpu"], tensorboard_dir=str(tmp_path / "few")) as sess:
        sess.step()
    err = capfd.readouterr().err
    assert "tessera capture: nothing recorded (sess.step() calls)" in err
    assert "records steps 2-4 but the session saw 2 steps" in err
