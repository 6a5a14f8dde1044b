"""A session over a small CPU training loop writes the scheduled steps, with torch's numbers."""

from __future__ import annotations

import collections
import os
import threading

import pytest

from tessera import profile
from tessera_tb.trace import open_run
from tessera_tb.trace.step import KIND

from .conftest import key_averages_view

torch = pytest.importorskip("torch")

SCHEDULE = dict(wait=0, warmup=1, active=2, repeat=2)  # steps 0..5: active 1, 2, 4, 5
N_STEPS = 6


@pytest.fixture(scope="module")
def captured(tmp_path_factory, tiny_model):
    run_dir = tmp_path_factory.mktemp("capture") / "exp1"
    side = {}

    def side_thread(step: int) -> None:
        side[step] = threading.get_native_id()
        with profile.region(f"side{step}"):
            pass

    with profile.session(
        activities=["cpu", "gpu", "memory"],
        record_shapes=True,
        schedule=profile.schedule(**SCHEDULE),
        tensorboard_dir=str(run_dir),
    ) as sess:
        for i in range(N_STEPS):
            with profile.region("forward"):
                with profile.region("forward/inner"):
                    tiny_model()
            t = threading.Thread(target=side_thread, args=(i,))
            t.start()
            t.join()
            sess.mark(f"mark{i}")
            profile.counter(name="loss", value=1.5 * i, unit="scalar")
            sess.step()
    # The torch profiler object keeps the last window (steps 4 and 5) for key_averages().
    averages = sess.torch_source.prof.key_averages()
    return {
        "sess": sess,
        "run": open_run(str(run_dir)),
        "averages": averages,
        "main_tid": threading.get_native_id(),
        "side_tids": side,
    }


def test_exactly_the_active_steps_are_written(captured):
    run = captured["run"]
    assert run.steps == [1, 2, 4, 5]
    assert list(run.workers) == ["worker0"]
    meta = run.workers["worker0"].meta
    assert (meta.origin, meta.source_format, meta.rank, meta.world_size) == (
        "capture", "capture", 0, 1,
    )  # fmt: skip
    assert meta.pid == os.getpid()
    assert [e.step for e in meta.steps] == [1, 2, 4, 5]


def test_steps_tile_the_timeline(captured):
    run = captured["run"]
    spans = [(e.start_ns, e.end_ns) for e in run.workers["worker0"].meta.steps]
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert s0 < e0 <= s1 < e1


def test_cpu_op_counts_and_host_self_times_match_key_averages(captured):
    """Steps 4 and 5 are torch's last window: the same ops, the same self times (1%).

    Compared the way key_averages() counts (torch merges an op into a same-named parent
    that has no other child; `key_averages_view` applies that rule to the step files).
    """
    run = captured["run"]
    calls: collections.Counter = collections.Counter()
    self_ns: collections.Counter = collections.Counter()
    not_ops = {"ProfilerStep*"}  # key_averages' name for every ProfilerStep#N
    for s in (4, 5):
        step = run.load_step("worker0", s)
        names, selfs = key_averages_view(step)
        for name, ns in zip(names, selfs.tolist()):
            calls[name] += 1
            self_ns[name] += ns
        kinds = step.events["kind"]
        # Annotations, runtime calls (cudaDeviceSynchronize) and profiler overhead events are
        # in key_averages() too, but they are not ops.
        not_ops |= set(step.string_values(step.events["name_id"][kinds != KIND["cpu_op"]]))
    theirs = {e.key: e for e in captured["averages"]}
    assert len(calls) > 10
    for name, n in calls.items():
        assert theirs[name].count == n, name
        expected_us = theirs[name].self_cpu_time_total
        assert self_ns[name] / 1e3 == pytest.approx(expected_us, rel=0.01, abs=0.5), name
    # Every op torch saw in the window is in the steps.
    assert set(theirs) - not_ops == set(calls)


def _events(step, kind: str):
    df = step.frame()
    tracks = step.tracks
    df = df[df.kind == kind].copy()
    df["tid"] = [tracks[t].tid for t in df.track_id]
    df["pid"] = [tracks[t].pid for t in df.track_id]
    return df


def test_regions_are_on_the_thread_that_recorded_them_in_every_step(captured):
    run, main = captured["run"], captured["main_tid"]
    for s in run.steps:
        side = captured["side_tids"][s]
        step = run.load_step("worker0", s)
        regions = _events(step, "region")
        mine = regions[regions.tid == str(main)]
        assert sorted(mine.name) == ["forward", "forward/inner"]
        assert set(mine.pid) == {str(os.getpid())}
        assert list(regions[regions.tid == str(side)].name) == [f"side{s}"]
        outer = mine[mine.name == "forward"].iloc[0]
        inner = mine[mine.name == "forward/inner"].iloc[0]
        assert outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns
        assert step.start_ns <= outer.start_ns and outer.end_ns <= step.end_ns


def test_regions_enclose_the_ops_recorded_inside_them(captured):
    """Our clock and Kineto's agree: the model's linear ops lie inside the forward region."""
    run, main = captured["run"], captured["main_tid"]
    step = run.load_step("worker0", 4)
    regions = _events(step, "region")
    inner = regions[(regions.name == "forward/inner") & (regions.tid == str(main))].iloc[0]
    ops = _events(step, "cpu_op")
    linear = ops[ops.name == "aten::linear"]
    forward_linear = linear[linear.start_ns < inner.end_ns]
    assert len(forward_linear) == 2
    assert (forward_linear.start_ns >= inner.start_ns).all()
    assert (forward_linear.end_ns <= inner.end_ns).all()
    assert set(forward_linear.tid) == {str(main)}  # the same track as the region


def test_marks_and_counters_land_in_their_own_step(captured):
    run = captured["run"]
    for s in run.steps:
        step = run.load_step("worker0", s)
        marks = _events(step, "mark")
        assert list(marks[marks.name.str.startswith("mark")].name) == [f"mark{s}"]
        loss = [c for c in step.counters if c.name == "loss"]
        assert len(loss) == 1
        assert (loss[0].unit, loss[0].source, loss[0].device) == ("scalar", "user", -1)
        assert loss[0].values.tolist() == [1.5 * s]
        assert step.start_ns <= loss[0].ts_ns[0] <= step.end_ns


def test_capabilities_say_what_this_machine_could_not_capture(captured):
    caps = {c.name: c for c in captured["run"].workers["worker0"].meta.capabilities}
    assert caps["cpu_ops"].status == "ok"
    assert caps["shapes"].status == "ok"
    assert caps["memory"].status == "ok"
    assert caps["stacks"].status == "unavailable" and "with_stack" in caps["stacks"].reason
    if not torch.cuda.is_available():
        assert caps["device_activity"].status == "unavailable"
        assert "torch.cuda.is_available() is False" in caps["device_activity"].reason
    assert caps["nvml"].reason == "not requested (activity 'power')"
    assert caps["ncu_counters"].status == "unavailable"
    assert run_has_memory_events(captured["run"])


def run_has_memory_events(run) -> bool:
    step = run.load_step("worker0", run.steps[0])
    return bool((step.events["kind"] == KIND["memory"]).any())


def test_step_files_appear_soon_after_their_window_is_handed_over(captured):
    sess = captured["sess"]
    assert sess.steps_written == [1, 2, 4, 5]
    assert len(sess.handed_over_at) == 2
    written = sess.writer.step_written_at
    # The first window also waits for the writer process to start (imports); the second
    # one is the steady state. Generous bounds: the test machine is shared.
    assert written[2] - sess.handed_over_at[0] < 10.0
    assert written[5] - sess.handed_over_at[1] < 5.0
