"""Memory over time, the peak and its op, and the allocation table, against the JSON."""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections import defaultdict

import pandas as pd
import pytest

from tessera_tb.backend.memory import (
    allocation_table,
    memory_events,
    memory_peaks,
    memory_timeline,
    python_stack,
)
from tessera_tb.trace import open_run
from tessera_tb.trace.step import KIND
from tests.backend.test_breakdown import RESNET_2021, ns
from tests.conftest import DEMO_RUNS, SHARED_TRACES

CASES = [
    ("gpt_1gpu", "worker0", "pytorch/gpt_1gpu_stack/worker0.*.json.gz"),
    ("ddp_gpt_2rank", "rank0", "pytorch/ddp_gpt_2rank/rank0.*.json.gz"),
    ("ddp_gpt_2rank", "rank1", "pytorch/ddp_gpt_2rank/rank1.*.json.gz"),
    ("fsdp_gpt_4rank", "rank2", "pytorch/fsdp_gpt_4rank/rank2.*.json.gz"),
]


def trace_path(pattern: str) -> str:
    return glob.glob(os.path.join(SHARED_TRACES, pattern))[0]


def load(path: str):
    """(memory events, complete events) of a trace, times in epoch ns, in file order."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    base = int(trace.get("baseTimeNanoseconds", 0))
    memory, complete = [], []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            start = base + ns(repr(e["ts"]))
            complete.append((start, start + ns(repr(e["dur"])), e))
        elif e.get("name") == "[memory]":
            memory.append((base + ns(repr(e["ts"])), e))
    return memory, complete


def innermost(complete, cat: str, pid, tid, t: int):
    """The innermost event of category `cat` on the thread containing t: the latest start,
    then the shortest."""
    around = [
        (s, -(x - s), e)
        for s, x, e in complete
        if e.get("cat") == cat and e["pid"] == pid and e["tid"] == tid and s <= t <= x
    ]
    return max(around, key=lambda a: a[:2])[2] if around else None


@pytest.mark.parametrize(("run_name", "worker", "pattern"), CASES, ids=lambda c: str(c))
def test_the_peak_is_the_max_total_allocated_and_its_op_the_innermost_around_it(
    run_name, worker, pattern
):
    memory, complete = load(trace_path(pattern))
    cuda = [(t, e) for t, e in memory if e["args"]["Device Type"] == 1]
    peak_value = max(e["args"]["Total Allocated"] for _, e in cuda)
    t, e = min((t, e) for t, e in cuda if e["args"]["Total Allocated"] == peak_value)
    op = innermost(complete, "cpu_op", e["pid"], e["tid"], t)
    run = open_run(os.path.join(DEMO_RUNS, run_name))
    peaks = memory_peaks(run, [worker])
    row = peaks[peaks["device_type"] == 1].iloc[0]
    assert row["device_id"] == e["args"]["Device Id"]
    assert row["basis"] == "total_allocated"
    assert row["peak_allocated_bytes"] == peak_value
    assert row["peak_ts_ns"] == t
    assert row["op"] == op["name"]
    assert row["peak_reserved_bytes"] == max(e["args"]["Total Reserved"] for _, e in cuda)


def test_the_stack_at_a_memory_event_is_the_python_frames_around_it():
    memory, complete = load(trace_path("pytorch/gpt_1gpu_stack/worker0.*.json.gz"))
    main_tid = next(e["tid"] for _, _, e in complete if e["name"] == "ProfilerStep#5")
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    step = run.load_step("worker0", 5)
    files = [run.load_step("worker0", 4), step]
    events = memory_events(step)
    tids = {t.id: t.tid for t in step.tracks}
    pid = step.tracks[0].pid
    checked = 0
    for _, ev in events.iterrows():
        if tids[ev["track_id"]] != str(main_tid) or checked >= 25:
            continue
        frames = sorted(
            (s, -(x - s), e["name"])
            for s, x, e in complete
            if e.get("cat") == "python_function" and e["tid"] == main_tid and s <= ev["ts_ns"] <= x
        )
        got = python_stack(files, pid, str(main_tid), int(ev["ts_ns"]))
        assert got == [name for _, _, name in frames]
        assert got[0] == "train_gpt.py(107): <module>"  # started in step 4's file
        checked += 1
    assert checked == 25


@pytest.mark.parametrize(("run_name", "worker", "pattern"), CASES[:2], ids=lambda c: str(c))
def test_the_timeline_is_every_memory_event_of_the_device(run_name, worker, pattern):
    memory, _ = load(trace_path(pattern))
    want = sorted(
        (t, a["Total Allocated"], a["Total Reserved"], a["Bytes"])
        for t, e in memory
        if (a := e["args"])["Device Type"] == 1
    )
    tl = memory_timeline(open_run(os.path.join(DEMO_RUNS, run_name)), [worker])
    cuda = tl[tl["device_type"] == 1]
    got = list(zip(cuda["ts_ns"], cuda["allocated_bytes"], cuda["reserved_bytes"], cuda["bytes"]))
    assert sorted(got) == want
    assert list(cuda["ts_ns"]) == sorted(cuda["ts_ns"])


@pytest.mark.parametrize(("run_name", "worker", "pattern"), CASES, ids=lambda c: str(c))
def test_allocations_are_the_positive_bytes_freed_at_the_next_free_of_their_address(
    run_name, worker, pattern
):
    memory, _ = load(trace_path(pattern))
    by_addr = defaultdict(list)
    for t, e in memory:
        a = e["args"]
        by_addr[(a["Device Type"], a["Device Id"], a["Addr"])].append((t, a["Bytes"]))
    want = set()
    for (dtype, _, addr), seq in by_addr.items():
        seq.sort(key=lambda x: x[0])
        for i, (t, size) in enumerate(seq):
            if size > 0:
                nxt = seq[i + 1] if i + 1 < len(seq) else None
                free = nxt[0] if nxt and nxt[1] < 0 else None
                want.add((dtype, addr, size, t, free))
    table = allocation_table(open_run(os.path.join(DEMO_RUNS, run_name)), [worker])
    got = {
        (
            r.device_type,
            r.addr,
            r.size_bytes,
            r.alloc_ts_ns,
            None if pd.isna(r.free_ts_ns) else r.free_ts_ns,
        )
        for r in table.itertuples()
    }
    assert got == want
    positive = sum(e["args"]["Bytes"] for _, e in memory if e["args"]["Bytes"] > 0)
    assert table["size_bytes"].sum() == positive
    freed = table["lifetime_ns"].notna()
    assert (table.loc[freed, "lifetime_ns"] >= 0).all()
    assert freed.mean() > 0.9


def test_without_total_allocated_the_peak_is_the_net_bytes_peak(imported_runs):
    path = RESNET_2021[0]
    memory, _ = load(path)
    running, best = 0, None
    cuda = sorted(((t, e) for t, e in memory if e["args"]["Device Type"] == 1), key=lambda x: x[0])
    for _, e in cuda:
        running += e["args"]["Bytes"]
        best = running if best is None else max(best, running)
    run = open_run(imported_runs(path))
    peaks = memory_peaks(run)
    row = peaks[peaks["device_type"] == 1].iloc[0]
    assert row["basis"] == "net_bytes"
    assert pd.isna(row["peak_allocated_bytes"])
    assert row["peak_net_bytes"] == best
    table = allocation_table(run)
    assert table["lifetime_ns"].isna().all()  # the 2021 format records no Addr
    assert table["size_bytes"].sum() == sum(
        e["args"]["Bytes"] for _, e in memory if e["args"]["Bytes"] > 0
    )


def test_memory_route_of_a_scaled_step_stays_under_the_cap_and_keeps_the_peak(tmp_path):
    """The GPT trace tiled 16 times into one step (bench/scale_trace.py): ~21k [memory]
    events in one step; the route answers at most 5000 curve rows, the peak among them."""
    import sys

    from tessera_tb.backend import plugin_data
    from tessera_tb.backend.run_index import RunIndex
    from tessera_tb.importers.kineto_import import import_traces
    from tests.conftest import ROOT, SHARED_TRACES

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        from scale_trace import scale_trace
    finally:
        sys.path.pop(0)
    src_dir = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
    (src,) = [f for f in os.listdir(src_dir) if f.endswith(".json.gz")]
    raw = tmp_path / "raw"
    raw.mkdir()
    scale_trace(
        os.path.join(src_dir, src),
        str(raw / "worker0.1.pt.trace.json.gz"),
        16,
        one_step=True,
        level=1,
    )
    import_traces([str(raw)], str(tmp_path / "logdir"), "big")
    run = open_run(str(tmp_path / "logdir" / "big"))
    (step,) = run.steps
    events = run.load_step("worker0", step)
    n_memory = int((events.events["kind"] == KIND["memory"]).sum())
    peak = int(events.attr("Total Allocated").max())
    body = plugin_data.view_json(RunIndex(str(tmp_path / "logdir"), 60), "memory", {"run": "big"})
    got = json.loads(body)
    assert len(body) <= 2_000_000
    assert got["curve_rows"] == n_memory > 20_000
    curves = got["tables"]["curves"]
    assert curves["total_rows"] <= 5000
    i = curves["columns"].index("allocated_bytes")
    assert max(v for v in curves["data"][i] if v is not None) == peak
