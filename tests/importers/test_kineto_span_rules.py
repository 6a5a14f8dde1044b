"""The binding and nesting rules on small hand-made traces whose answers are counted by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tessera_tb.importers.kineto_decode import decode
from tessera_tb.importers.kineto_span import StringTable, build_span


def _span(events: list[dict]):
    trace = decode("hand.json", json.dumps({"traceEvents": events}).encode())
    return build_span(trace, StringTable(), 0, 0)


def _x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_flow_point_binds_to_the_enclosing_slice_not_the_last_one_started():
    # A [0,100] contains B [10,20]; a point at 50 is inside A only.
    (step,) = _span(
        [
            _x("A", 0, 100),
            _x("B", 10, 10),
            {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 1, "pid": 1, "tid": 1, "ts": 50},
            {
                "ph": "f",
                "cat": "fwdbwd",
                "name": "fwdbwd",
                "id": 1,
                "pid": 1,
                "tid": 1,
                "ts": 15,
                "bp": "e",
            },
        ]
    ).steps
    names = step.string_values(step.events["name_id"])
    bound = dict(zip(step.flows["phase"].tolist(), names[step.flows["row"]].tolist()))
    assert bound == {0: "A", 2: "B"}


def _flow_end(ts, tid=1):
    return {
        "ph": "f",
        "cat": "fwdbwd",
        "name": "fwdbwd",
        "id": 1,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "bp": "e",
    }


def test_flow_point_on_equal_intervals_binds_to_the_later_one_in_the_file():
    # Two slices with the same interval: the point binds to the one written later, whatever
    # their External ids (which order the step's rows, not the binding).
    for first, second in ((5, 7), (7, 5)):
        (step,) = _span(
            [
                _x("early", 0, 10, **{"External id": first}),
                _x("late", 0, 10, **{"External id": second}),
                _flow_end(6),
            ]
        ).steps
        names = step.string_values(step.events["name_id"])
        assert names[step.flows["row"]].tolist() == ["late"], (first, second)


def test_flow_point_after_an_ended_slice_binds_to_its_innermost_container():
    # The last slice started before the point ended before it: the point goes up the host
    # tree, to the higher External id of the two equal intervals (the inner one).
    for first, second, want in ((5, 7, "late"), (7, 5, "early")):
        (step,) = _span(
            [
                _x("early", 0, 10, **{"External id": first}),
                _x("late", 0, 10, **{"External id": second}),
                _x("ended", 0, 4, **{"External id": 9}),
                _flow_end(6),
            ]
        ).steps
        names = step.string_values(step.events["name_id"])
        assert names[step.flows["row"]].tolist() == [want], (first, second)


def test_equal_intervals_nest_under_the_lower_external_id():
    (step,) = _span(
        [_x("outer", 0, 10, **{"External id": 5}), _x("inner", 0, 10, **{"External id": 7})]
    ).steps
    names = step.string_values(step.events["name_id"]).tolist()
    parent = step.events["parent"]
    assert names[parent[names.index("inner")]] == "outer"
    assert parent[names.index("outer")] == -1


def test_partial_overlap_is_not_nesting():
    (step,) = _span([_x("A", 0, 10), _x("B", 5, 10)]).steps
    assert (step.events["parent"] == -1).all()


def test_kernel_belongs_to_the_step_of_its_launch_even_when_it_runs_later():
    events = [
        _x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        _x("ProfilerStep#2", 100, 100, cat="user_annotation"),
        _x("cudaLaunchKernel", 90, 5, cat="cuda_runtime", correlation=3),
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 120,
            "dur": 30,
            "args": {"correlation": 3, "device": 0, "stream": 7},
        },
    ]
    s1, s2 = _span(events).steps
    assert "k" in s1.string_values(s1.events["name_id"]).tolist()
    # step 1 ends when its kernel ends; step 2 starts there (steps tile, METRICS.md)
    assert (s1.start_ns, s1.end_ns) == (0, 150_000)
    assert (s2.start_ns, s2.end_ns) == (150_000, 200_000)
    kernel_row = int(np.flatnonzero(s1.events["launch"] >= 0)[0])
    launch = s1.events["launch"][kernel_row]
    assert s1.string_values(s1.events["name_id"])[launch] == "cudaLaunchKernel"


@pytest.mark.parametrize("form", ["c", "numpy"])
def test_previous_greater_equal_matches_the_monotonic_stack(form):
    from tessera_tb.importers import kineto_span

    if form == "c":
        if kineto_span._kineto_scan is None:
            pytest.skip("the C scanner module is not built")
        previous_greater_equal = kineto_span.previous_greater_equal
    else:
        previous_greater_equal = kineto_span._previous_greater_equal_lifting

    def stack_answer(values):
        out, stack = [], []
        for i, v in enumerate(values):
            while stack and values[stack[-1]] < v:
                stack.pop()
            out.append(stack[-1] if stack else -1)
            stack.append(i)
        return out

    assert previous_greater_equal(np.array([5, 3, 4, 4, 9, 1])).tolist() == [-1, 0, 0, 2, -1, 4]
    rng = np.random.default_rng(1)
    for n in (0, 1, 2, 8, 9, 1000, 4097):
        for high in (3, 10**9):
            values = rng.integers(0, high, n)
            assert previous_greater_equal(values).tolist() == stack_answer(values.tolist())
    # ends in nanoseconds since the epoch, negative ones, and the int64 extremes
    values = np.array([2**62, -5, 2**62, np.iinfo(np.int64).min, np.iinfo(np.int64).max, -5])
    assert previous_greater_equal(values).tolist() == stack_answer(values.tolist())


@pytest.mark.parametrize("in_c", [True, False], ids=["C", "numpy"])
def test_step_string_tables_are_the_used_ids_sorted_and_renumbered(in_c):
    from tessera_tb.importers import kineto_span

    if in_c and kineto_span._kineto_scan is None:
        pytest.skip("the C scanner is not built")
    rng = np.random.default_rng(3)
    # dense and sparse tables: the C pass reads its marks in order or sorts what it found,
    # numpy marks them or sorts them
    for table, count in ((50, 400), (5000, 300), (200_000, 50), (10, 0), (1, 3)):
        tables = kineto_span._StepStrings(table, in_c)
        for _ in range(3):  # the scratch is left ready for the next step
            used = [rng.integers(0, table, count).astype(np.int32), rng.integers(0, table, 7)]
            ids, renumbered = tables.renumber(used)
            want = np.unique(np.concatenate([[0], *used]))
            assert ids.tolist() == want.tolist(), (table, count)
            for u, r in zip(used, renumbered):
                assert r.dtype == np.int32
                assert ids[r].tolist() == u.tolist()
        assert tables.renumber([])[0].tolist() == [0]


def test_step_string_ids_out_of_range_are_refused_and_leave_the_marks_clear():
    from tessera_tb.importers import kineto_span

    if kineto_span._kineto_scan is None:
        pytest.skip("the C scanner is not built")
    tables = kineto_span._StepStrings(10)
    for bad in ([3, 10], [4, -1]):
        with pytest.raises(ValueError, match="out of range"):
            tables.renumber([np.array([1, 2], dtype=np.int32), np.array(bad, dtype=np.int32)])
        assert (tables.marks == -1).all()
    ids, (r,) = tables.renumber([np.array([9, 2, 9], dtype=np.int32)])
    assert ids.tolist() == [0, 2, 9] and r.tolist() == [2, 1, 2]
