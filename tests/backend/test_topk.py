"""Operator and kernel tables against a plain-Python reading of the JSON and against PyTorch."""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections import Counter, defaultdict
from decimal import Decimal

import numpy as np
import pytest

from tessera_tb.backend.topk import OTHER_NAME, kernel_table, op_table
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, SHARED_TRACES

GPT_JSON = glob.glob(os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack", "*.json.gz"))[0]
GPT_RUN = os.path.join(DEMO_RUNS, "gpt_1gpu")
STEP = 5
HOST_TREE = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
DEVICE_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}
CHECKED_OPS = [
    "aten::mm",
    "aten::addmm",
    "aten::linear",  # autocast nests aten::linear in aten::linear: totals count once
    "aten::copy_",
    "MmBackward0",
    "autograd::engine::evaluate_function: MmBackward0",
    "aten::_fused_adamw_",
]


def _ns(us) -> int:
    return int((Decimal(us) * 1000).to_integral_value())


def _hand_op_stats(path: str, step_number: int) -> dict[str, dict[str, int]]:
    """calls, host self/total and device self/total per cpu_op name of one step, from the JSON.

    Nesting per thread by interval containment (on equal intervals the lower External id is
    the outer one); device work is owned by the innermost cpu_op around its launching call,
    found by the shared correlation.
    """
    with gzip.open(path, "rt") as f:
        trace = json.load(f, parse_float=Decimal)
    base = int(trace["baseTimeNanoseconds"])
    nodes = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in HOST_TREE | DEVICE_WORK:
            start = base + _ns(e["ts"])
            nodes.append(
                {
                    "name": e["name"],
                    "cat": e["cat"],
                    "start": start,
                    "end": start + _ns(e["dur"]),
                    "dur": _ns(e["dur"]),
                    "thread": (e["pid"], e["tid"]),
                    "ext": int(e["args"].get("External id", 0)),
                    "corr": e["args"].get("correlation"),
                    "parent": None,
                    "children_ns": 0,
                }
            )
    marks = sorted(
        (n["start"], int(n["name"].split("#")[1]))
        for n in nodes
        if n["cat"] == "user_annotation" and n["name"].startswith("ProfilerStep#")
    )

    def step_of(ts: int) -> int:
        found = marks[0][1]
        for start, number in marks:
            if start <= ts:
                found = number
        return found

    host = [n for n in nodes if n["cat"] in HOST_TREE]
    host.sort(key=lambda n: (n["thread"], n["start"], -n["dur"], n["ext"]))
    stack: list[dict] = []
    for n in host:
        while stack and not (
            stack[-1]["thread"] == n["thread"]
            and stack[-1]["start"] <= n["start"]
            and n["end"] <= stack[-1]["end"]
        ):
            stack.pop()
        if stack:
            n["parent"] = stack[-1]
            stack[-1]["children_ns"] += n["dur"]
        stack.append(n)

    def op_chain(n):  # cpu_ops enclosing n, innermost first (n itself included)
        out = []
        while n is not None:
            if n["cat"] == "cpu_op":
                out.append(n)
            n = n["parent"]
        return out

    stats: dict[str, dict[str, int]] = defaultdict(Counter)
    for n in host:
        if n["cat"] != "cpu_op" or step_of(n["start"]) != step_number:
            continue
        s = stats[n["name"]]
        s["calls"] += 1
        s["host_self_ns"] += n["dur"] - n["children_ns"]
        if all(a["name"] != n["name"] for a in op_chain(n)[1:]):
            s["host_total_ns"] += n["dur"]
    launcher = {n["corr"]: n for n in host if n["cat"] in ("cuda_runtime", "cuda_driver")}
    for d in nodes:
        call = launcher.get(d["corr"]) if d["cat"] in DEVICE_WORK else None
        if call is None or step_of(call["start"]) != step_number:
            continue
        chain = op_chain(call)
        if chain:
            stats[chain[0]["name"]]["device_self_ns"] += d["dur"]
        for name in {a["name"] for a in chain}:
            stats[name]["device_total_ns"] += d["dur"]
    return stats


@pytest.fixture(scope="module")
def hand_stats():
    return _hand_op_stats(GPT_JSON, STEP)


@pytest.fixture(scope="module")
def gpt_ops():
    return op_table(open_run(GPT_RUN), steps=[STEP], k=None).set_index("name")


@pytest.mark.parametrize("name", CHECKED_OPS)
def test_op_calls_and_self_and_total_times_match_a_hand_computation(name, hand_stats, gpt_ops):
    want = hand_stats[name]
    got = gpt_ops.loc[name]
    assert want["calls"] > 0
    for column in ("calls", "host_self_ns", "host_total_ns", "device_self_ns", "device_total_ns"):
        assert int(got[column]) == want[column], column


def test_every_op_of_the_step_has_its_hand_computed_calls_and_self_times(hand_stats, gpt_ops):
    want = {
        name: (s["calls"], s["host_self_ns"], s["device_self_ns"])
        for name, s in hand_stats.items()
        if s["calls"]
    }
    got = {
        name: (int(r.calls), int(r.host_self_ns), int(r.device_self_ns))
        for name, r in gpt_ops.iterrows()
    }
    assert got == want


def test_device_self_times_sum_to_all_device_work_of_the_step(gpt_ops):
    step = open_run(GPT_RUN).load_step("worker0", STEP)
    frame = step.frame()
    work = frame[frame.kind.isin(["kernel", "collective", "memcpy", "memset"])]
    assert gpt_ops["device_self_ns"].sum() == work["dur_ns"].sum() > 0


def test_top_k_keeps_k_rows_and_an_other_row_that_completes_the_sums(gpt_ops):
    top = op_table(open_run(GPT_RUN), steps=[STEP], k=5)
    assert len(top) == 6 and top["is_other"].tolist() == [False] * 5 + [True]
    assert top["name"].iloc[-1] == OTHER_NAME
    by_device = gpt_ops.sort_values("device_self_ns", ascending=False)
    assert top["name"].iloc[:5].tolist() == by_device.index[:5].tolist()
    for column in ("calls", "host_self_ns", "device_self_ns"):
        assert top[column].sum() == gpt_ops[column].sum()
    assert top["device_self_pct"].sum() == pytest.approx(100.0)


def test_sort_and_search_choose_the_rows(gpt_ops):
    run = open_run(GPT_RUN)
    by_host = op_table(run, steps=[STEP], sort="host_self_ns", k=3)
    assert by_host["host_self_ns"].iloc[:3].is_monotonic_decreasing
    found = op_table(run, steps=[STEP], search="ADDMM", k=None)
    want = {name for name in gpt_ops.index if "addmm" in name.lower()}
    assert set(found["name"]) == want and {"aten::addmm", "AddmmBackward0"} <= want
    with pytest.raises(ValueError, match="unknown sort column"):
        op_table(run, steps=[STEP], sort="nope")


def test_grouping_by_input_dims_splits_an_op_by_its_shapes(gpt_ops):
    run = open_run(GPT_RUN)
    step = run.load_step("worker0", STEP)
    frame = step.frame().join(step.attr("Input Dims"))
    mm = frame[(frame.kind == "cpu_op") & (frame.name == "aten::mm")]
    grouped = op_table(run, steps=[STEP], by_input_dims=True, search="aten::mm", k=None)
    grouped = grouped[grouped["name"] == "aten::mm"].set_index("input_dims")
    assert grouped["calls"].to_dict() == mm["Input Dims"].value_counts().to_dict()
    assert grouped["device_self_ns"].sum() == gpt_ops.loc["aten::mm", "device_self_ns"]


def _hand_kernel_stats(path: str, step_number: int):
    """Per kernel name of one step: calls, durations, grids, occupancy pairs, from the JSON."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f, parse_float=Decimal)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    step_ts = sorted(
        (Decimal(e["ts"]), int(e["name"].split("#")[1]))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    call_ts = {
        e["args"]["correlation"]: Decimal(e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
    }
    out = defaultdict(lambda: {"durs": [], "grids": Counter(), "occ": []})
    for e in events:
        if e.get("cat") != "kernel" or e["args"]["correlation"] not in call_ts:
            continue
        ts = call_ts[e["args"]["correlation"]]
        number = max([n for s, n in step_ts if s <= ts] or [step_ts[0][1]])
        if number != step_number:
            continue
        k = out[e["name"]]
        k["durs"].append(_ns(e["dur"]))
        k["grids"][json.dumps(e["args"]["grid"], separators=(",", ":"))] += 1
        k["occ"].append((e["args"]["est. achieved occupancy %"], _ns(e["dur"])))
    return out


def test_kernel_table_matches_a_hand_count_of_the_step():
    want = _hand_kernel_stats(GPT_JSON, STEP)
    table = kernel_table(open_run(GPT_RUN), steps=[STEP], k=None).set_index("name")
    assert set(table.index) == set(want)
    for name, w in want.items():
        got = table.loc[name]
        assert (got.calls, got.total_dur_ns) == (len(w["durs"]), sum(w["durs"]))
        assert (got.min_dur_ns, got.max_dur_ns) == (min(w["durs"]), max(w["durs"]))
        top_grid, top_n = w["grids"].most_common(1)[0]
        assert w["grids"][got.grid] == top_n
        occ = sum(o * d for o, d in w["occ"]) / sum(d for _, d in w["occ"])
        assert got.est_occupancy_pct == pytest.approx(occ)
        assert got.kind == "kernel"
    assert table["total_pct"].sum() == pytest.approx(100.0)


def test_kernel_table_names_the_owning_op_with_the_most_time():
    table = kernel_table(open_run(GPT_RUN), steps=[STEP], search="nvjet", k=None)
    assert len(table) and table["name"].str.contains("nvjet").all()
    assert set(table["top_op"]) <= {"aten::mm", "aten::addmm", "aten::bmm"}
    assert ((table["top_op_pct"] > 0) & (table["top_op_pct"] <= 100)).all()


def test_nccl_kernels_are_collectives_in_the_kernel_table():
    table = kernel_table(open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank")), k=None)
    nccl = table[table["name"].str.startswith("nccl")]
    assert len(nccl) and (nccl["kind"] == "collective").all()
    assert (table.loc[~table["name"].str.startswith("nccl"), "kind"] == "kernel").all()


def _profile_small_model(trace_dir: str):
    """A few Linear+ReLU layers and a custom autograd function whose backward holds a
    record_function range (an annotation nested inside an op), profiled on the CPU."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, grad):
            with torch.profiler.record_function("scale_backward_region"):
                return grad * 2.0

    class ScaleModule(torch.nn.Module):
        def forward(self, x):
            return Scale.apply(x)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        ScaleModule(),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=tensorboard_trace_handler(trace_dir),
    ) as prof:
        for _ in range(6):
            with torch.profiler.record_function("forward_region"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    return prof.key_averages()


@pytest.fixture(scope="module")
def small_cpu_run(tmp_path_factory):
    """(key_averages() of a small CPU-only profile, the same trace imported as a run)."""
    from tessera_tb.importers.kineto_import import import_traces

    tmp = tmp_path_factory.mktemp("small_cpu")
    averages = _profile_small_model(str(tmp / "trace"))
    files = glob.glob(str(tmp / "trace" / "*.json"))
    return averages, open_run(import_traces(files, str(tmp / "logdir"), "small").run_dir)


def test_op_calls_and_host_self_times_agree_with_pytorch_key_averages(small_cpu_run):
    averages, run = small_cpu_run
    # Every imported step: key_averages covers the whole active window, and events before
    # the first ProfilerStep are stored in the first step.
    table = op_table(run, k=None).set_index("name")
    annotations = set()
    for _, step in run.iter_steps():
        frame = step.frame()
        annotations |= set(frame.loc[frame.kind == "annotation", "name"])
    compared = 0
    for avg in averages:
        if avg.key == "ProfilerStep*" or avg.key in annotations:
            # User annotations (record_function ranges; ProfilerStep#N, which key_averages
            # renames ProfilerStep*) are not operators: the op table has no row for them.
            assert avg.key not in table.index
            continue
        row = table.loc[avg.key]
        assert int(row.calls) == avg.count, avg.key
        assert row.host_self_ns / 1000 == pytest.approx(avg.self_cpu_time_total, rel=0.01), avg.key
        compared += 1
    assert compared == len(table) > 20
    # The annotation inside ScaleBackward is a child of the op: not part of its self time.
    assert "scale_backward_region" in annotations and "ScaleBackward" in table.index


def test_a_run_without_device_work_sorts_by_host_self_time(small_cpu_run):
    _, run = small_cpu_run
    table = op_table(run, k=5)
    assert (table["device_self_ns"] == 0).all()
    assert np.all(np.diff(table["host_self_ns"].iloc[:5].to_numpy()) <= 0)
    assert kernel_table(run).empty
