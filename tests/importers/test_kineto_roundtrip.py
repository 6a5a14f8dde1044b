"""Importing every shared real trace keeps every event, duration, link and argument.

The expected values come from the JSON itself, read with the standard json module and
exact decimals, independently of the importer's decoding.
"""

from __future__ import annotations

import collections
import gzip
import json
from decimal import Decimal

import numpy as np
import pytest

from tessera_tb.backend.linkage import owning_op_rows
from tessera_tb.trace import open_run
from tessera_tb.trace.step import KIND
from tests.conftest import shared_trace_files, trace_id

TRACES = shared_trace_files()
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
COLLECTIVE_ARGS = (
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "dtype",
    "Process Group Name",
    "Process Group Ranks",
)


def _load_json(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


def _ns(us) -> int:
    return int((Decimal(us) * 1000).to_integral_value())


def _ext(args: dict) -> int:
    return int(args.get("External id", args.get("external id", 0)) or 0)


@pytest.fixture(scope="module")
def expected():
    cache = {}

    def get(path):
        if path not in cache:
            cache[path] = _load_json(path)
        return cache[path]

    return get


def _steps(run_dir):
    run = open_run(run_dir)
    return [s for _, s in run.iter_steps()]


@pytest.mark.parametrize("path", TRACES, ids=trace_id)
def test_every_category_keeps_its_count_and_summed_duration(path, imported_runs, expected):
    trace = expected(path)
    want_n, want_dur = collections.Counter(), collections.Counter()
    for e in trace["traceEvents"]:
        if e.get("ph") in ("X", "i"):
            want_n[e.get("cat", "")] += 1
            want_dur[e.get("cat", "")] += _ns(e.get("dur", 0))
    got_n, got_dur = collections.Counter(), collections.Counter()
    for step in _steps(imported_runs(path)):
        cats = step.string_values(step.events["cat_id"])
        for cat, dur in zip(cats.tolist(), step.events["dur_ns"].tolist()):
            got_n[cat] += 1
            got_dur[cat] += dur
    assert got_n == want_n
    assert got_dur == want_dur


@pytest.mark.parametrize("path", TRACES, ids=trace_id)
def test_flow_points_are_kept_per_phase_and_category(path, imported_runs, expected):
    want = collections.Counter(
        (e["ph"], e.get("cat", "")) for e in expected(path)["traceEvents"] if e.get("ph") in "stf"
    )
    got = collections.Counter()
    for step in _steps(imported_runs(path)):
        cats = step.string_values(step.flows["cat_id"])
        for ph, cat in zip(step.flows["phase"].tolist(), cats.tolist()):
            got["stf"[ph], cat] += 1
    assert got == want


@pytest.mark.parametrize("path", TRACES, ids=trace_id)
def test_every_linked_device_event_recovers_its_launch_call_and_owning_op(
    path, imported_runs, expected
):
    events = expected(path)["traceEvents"]
    launchers = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})
    }
    op_ext_ids = {_ext(e["args"]) for e in events if e.get("cat") in ("cpu_op", "Operator")}
    want_launch = {}  # correlation -> launching call name
    want_owner = collections.Counter()  # device events whose owner the JSON names
    for e in events:
        if e.get("cat") in DEVICE_CATS and e["args"].get("correlation") in launchers:
            want_launch[e["args"]["correlation"]] = launchers[e["args"]["correlation"]]["name"]
            if _ext(e["args"]) in op_ext_ids:
                want_owner[e["args"]["correlation"]] += 1

    got_launch, owners_ok = {}, 0
    for step in _steps(imported_runs(path)):
        ev = step.events
        names = step.string_values(ev["name_id"])
        owner = owning_op_rows(step)
        device = np.flatnonzero(
            np.isin(ev["kind"], [KIND[k] for k in ("kernel", "collective", "memcpy", "memset")])
        )
        for row in device[ev["launch"][device] >= 0].tolist():
            launch = ev["launch"][row]
            assert ev["correlation"][launch] == ev["correlation"][row]
            got_launch[int(ev["correlation"][row])] = names[launch]
            if int(ev["correlation"][row]) in want_owner:
                assert owner[row] >= 0, f"no owning op for {names[row]}"
                assert ev["external_id"][owner[row]] == ev["external_id"][row]
                owners_ok += 1
    assert got_launch == want_launch
    assert owners_ok == sum(want_owner.values())


@pytest.mark.parametrize(
    "path", [p for p in TRACES if "/pytorch/" in p and "1gpu" not in p], ids=trace_id
)
def test_collective_args_survive_on_every_nccl_kernel(path, imported_runs, expected):
    want = sorted(
        tuple(e["args"][k] for k in COLLECTIVE_ARGS)
        for e in expected(path)["traceEvents"]
        if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})
    )
    assert want, "the distributed traces hold NCCL kernels"
    got = []
    for step in _steps(imported_runs(path)):
        cols = {k: step.attr(k) for k in COLLECTIVE_ARGS}
        rows = cols["Collective name"].index.to_numpy()
        # record_param_comms cpu ops carry the same args; the device kernels are collectives.
        kinds = step.events["kind"][rows]
        on_device = rows[kinds != KIND["cpu_op"]]
        assert (step.events["kind"][on_device] == KIND["collective"]).all()
        for r in on_device:
            got.append(tuple(cols[k][r] for k in COLLECTIVE_ARGS))
    assert sorted(got) == want


@pytest.mark.parametrize("path", TRACES, ids=trace_id)
def test_steps_follow_the_profiler_step_markers_and_tile(path, imported_runs, expected):
    markers = sorted(
        (_ns(e["ts"]), int(e["name"].split("#")[1]))
        for e in expected(path)["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") in ("user_annotation", "Operator")
        and e.get("name", "").startswith("ProfilerStep#")
    )
    steps = _steps(imported_runs(path))
    if markers:
        assert [s.step for s in steps] == [n for _, n in markers]
    else:
        assert len(steps) == 1  # a trace without markers is one step
    for prev, cur in zip(steps, steps[1:]):
        assert cur.start_ns >= prev.end_ns
    for s in steps:
        assert s.end_ns > s.start_ns
        names = s.string_values(s.events["name_id"])
        if markers:  # the marker is an annotation in every format, never an op
            marker = np.flatnonzero(names == f"ProfilerStep#{s.step}")
            assert KIND["annotation"] in s.events["kind"][marker]
        # A step ends no earlier than the device work launched inside it.
        ev = s.events
        launched = ev["launch"] >= 0
        if launched.any():
            assert (ev["start_ns"] + ev["dur_ns"])[launched].max() <= s.end_ns


def test_json_args_keep_shapes_exactly(imported_runs, expected):
    path = next(p for p in TRACES if "gpt_1gpu_stack" in p)
    want = collections.Counter(
        json.dumps(e["args"]["Input Dims"], separators=(",", ":"))
        for e in expected(path)["traceEvents"]
        if e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {})
    )
    got = collections.Counter()
    for step in _steps(imported_runs(path)):
        got.update(step.attr("Input Dims").tolist())
    assert got == want


def test_python_function_events_form_their_own_tree(imported_runs):
    path = next(p for p in TRACES if "gpt_1gpu_stack" in p)
    for step in _steps(imported_runs(path)):
        ev = step.events
        py = ev["kind"] == KIND["python"]
        assert py.any()
        parents = ev["parent"][py]
        linked = parents >= 0
        assert linked.mean() > 0.9
        assert (ev["kind"][parents[linked]] == KIND["python"]).all()
        # and no host op has a python parent
        ops = np.isin(ev["kind"], [KIND["cpu_op"], KIND["runtime"], KIND["annotation"]])
        op_parents = ev["parent"][ops]
        assert not (ev["kind"][op_parents[op_parents >= 0]] == KIND["python"]).any()


def test_host_tree_parent_contains_child(imported_runs):
    path = next(p for p in TRACES if "ddp_gpt_2rank/rank0" in p)
    for step in _steps(imported_runs(path)):
        ev = step.events
        rows = np.flatnonzero(ev["parent"] >= 0)
        p = ev["parent"][rows]
        assert (ev["track_id"][p] == ev["track_id"][rows]).all()
        assert (ev["start_ns"][p] <= ev["start_ns"][rows]).all()
        assert (
            ev["start_ns"][p] + ev["dur_ns"][p] >= ev["start_ns"][rows] + ev["dur_ns"][rows]
        ).all()


def _canon(value):
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@pytest.mark.parametrize("path", TRACES, ids=trace_id)
def test_every_argument_of_every_event_survives(path, imported_runs):
    """Memory events, CUPTI range-profiler counters, launch configs, shapes: all args."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    want = collections.Counter()
    for e in events:
        if e.get("ph") not in ("X", "i"):
            continue
        for key, value in (e.get("args") or {}).items():
            if value is None:
                continue  # a null argument is stored as absent
            key = {"external id": "External id"}.get(key, key)
            if key in ("External id", "correlation") and value == 0:
                continue  # these become columns where 0 means "none", as in Kineto
            want[e.get("cat", ""), e["name"], key, _canon(value)] += 1
    got = collections.Counter()
    for step in _steps(imported_runs(path)):
        ev = step.events
        names = step.string_values(ev["name_id"])
        cats = step.string_values(ev["cat_id"])
        for a in step.attrs:
            values = step.attr(a.key)
            for row, value in zip(values.index.tolist(), values.tolist()):
                if a.type == "json":  # lists, and keys whose values mix types (AMD's "stream")
                    value = json.loads(value)
                got[cats[row], names[row], a.key, _canon(value)] += 1
        for column, key in (("correlation", "correlation"), ("external_id", "External id")):
            for row in np.flatnonzero(ev[column] != 0).tolist():
                got[cats[row], names[row], key, int(ev[column][row])] += 1
    missing, extra = want - got, got - want
    assert not missing and not extra, (list(missing.items())[:3], list(extra.items())[:3])
