"""Collective analysis against a plain-Python reading of the NCCL kernel args in the JSON."""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
from collections import defaultdict
from decimal import Decimal
from functools import cache

import numpy as np
import pandas as pd
import pytest

from tessera_tb.backend.collectives import (
    analyze_collectives,
    collective_heatmap,
    collective_instances,
    collective_kernels,
    collective_rank_step_table,
    collective_type_size_table,
    size_bucket_label,
    stragglers,
)
from tessera_tb.importers.kineto_import import import_traces
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, SHARED_TRACES

RUNS = ["ddp_gpt_2rank", "fsdp_gpt_4rank"]
DTYPE_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8}
# nccl-tests' busbw factors for the Collective name spellings in these traces.
FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "_allgather_base": lambda n: (n - 1) / n,
    "_reduce_scatter_base": lambda n: (n - 1) / n,
    "all_to_allv": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def _ns(us) -> int:
    return int((Decimal(str(us)) * 1000).to_integral_value())


def _trace_files(run: str) -> list[str]:
    return sorted(glob.glob(os.path.join(SHARED_TRACES, "pytorch", run, "*.pt.trace.json.gz")))


def _load(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


@cache
def _hand_kernels_of_file(path: str) -> tuple[dict, ...]:
    """NCCL kernels of one rank file, with step and ordinal assigned by hand.

    Step: the last ProfilerStep whose host start is at or before the launching runtime call
    (the first step for calls before it); ordinal: position among the step's kernels of the
    same process group by launch time.
    """
    trace = _load(path)
    base = int(trace["baseTimeNanoseconds"])
    rank = trace["distributedInfo"]["rank"]
    events = trace["traceEvents"]
    marks = sorted(
        (base + _ns(e["ts"]), int(e["name"].split("#")[1]))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    launch_ts = {
        e["args"]["correlation"]: base + _ns(e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    out = []
    for e in events:
        a = e.get("args", {})
        if e.get("cat") != "kernel" or "Collective name" not in a:
            continue
        start = base + _ns(e["ts"])
        launch = launch_ts.get(a["correlation"], start)
        step = marks[0][1]
        for mark_start, number in marks:
            if mark_start <= launch:
                step = number
        out.append(
            {
                "rank": rank,
                "step": step,
                "pg": a["Process Group Name"],
                "name": a["Collective name"],
                "in": a["In msg nelems"],
                "out": a["Out msg nelems"],
                "dtype": a["dtype"],
                "n": a["Group size"],
                "size": max(a["In msg nelems"], a["Out msg nelems"]) * DTYPE_BYTES[a["dtype"]],
                "start": start,
                "dur": _ns(e["dur"]),
                "launch": launch,
                "device": a["device"],
                "stream": a["stream"],
            }
        )
    out.sort(key=lambda k: (k["step"], k["pg"], k["launch"], k["start"]))
    seen: dict = defaultdict(int)
    for k in out:
        k["ordinal"] = seen[(k["step"], k["pg"])]
        seen[(k["step"], k["pg"])] += 1
    return tuple(out)


def _hand_kernels(run: str) -> list[dict]:
    return [k for path in _trace_files(run) for k in _hand_kernels_of_file(path)]


def _hand_instances(run: str) -> dict[tuple, list[dict]]:
    inst = defaultdict(list)
    for k in _hand_kernels(run):
        inst[(k["pg"], k["step"], k["ordinal"])].append(k)
    return inst


@cache
def _analysis(run: str):
    return analyze_collectives(open_run(os.path.join(DEMO_RUNS, run)))


@pytest.mark.parametrize("run", RUNS)
def test_counts_and_bytes_per_collective_equal_the_nccl_kernel_args(run):
    hand = defaultdict(lambda: [0, 0])
    for k in _hand_kernels(run):
        hand[k["name"]][0] += 1
        hand[k["name"]][1] += k["size"]
    kernels = _analysis(run).kernels
    got = kernels.groupby("collective_name")["size_bytes"].agg(["size", "sum"])
    assert {name: [int(r["size"]), int(r["sum"])] for name, r in got.iterrows()} == dict(hand)
    assert kernels["size_note"].isna().all()


def test_all_to_allv_sendrecv_kernels_are_typed_all_to_all_from_the_collective_name():
    kernels = _analysis("fsdp_gpt_4rank").kernels
    a2a = kernels[kernels["collective_name"] == "all_to_allv"]
    assert len(a2a) == sum(k["name"] == "all_to_allv" for k in _hand_kernels("fsdp_gpt_4rank"))
    assert len(a2a) > 0
    assert a2a["kernel_name"].str.startswith("ncclDevKernel_SendRecv").all()
    assert (a2a["collective_type"] == "all_to_all").all()
    types = kernels.groupby("collective_name")["collective_type"].unique()
    assert {n: list(t) for n, t in types.items()} == {
        "_allgather_base": ["all_gather"],
        "_reduce_scatter_base": ["reduce_scatter"],
        "all_to_allv": ["all_to_all"],
        "broadcast": ["broadcast"],
    }


@pytest.mark.parametrize("run", RUNS)
def test_instances_have_one_member_per_rank_that_agree_on_the_args(run):
    a = _analysis(run)
    hand = _hand_instances(run)
    assert a.mismatches.empty
    assert len(a.instances) == len(hand)
    assert a.instances["complete"].all()
    group_ranks = sorted(_load(_trace_files(run)[0])["distributedInfo"]["pg_config"][0]["ranks"])
    members = a.members.groupby(["process_group", "step", "ordinal"])
    assert all(sorted(r) == group_ranks for r in members["rank"].agg(list))
    for field in ("collective_name", "in_nelems", "out_nelems", "dtype", "group_size"):
        assert (members[field].nunique() == 1).all(), field
    # The key picks the same collective on every rank as the hand ordering by launch time.
    for key, row in a.instances.set_index(["process_group", "step", "ordinal"]).iterrows():
        hk = hand[key]
        assert {(k["name"], k["in"], k["out"]) for k in hk} == {
            (row["collective_name"], row["in_nelems"], row["out_nelems"])
        }


@pytest.mark.parametrize("run", RUNS)
def test_instance_busbw_is_size_over_transfer_time_times_the_nccl_tests_factor(run):
    inst = _analysis(run).instances.set_index(["process_group", "step", "ordinal"])
    for key, members in _hand_instances(run).items():
        first = members[0]
        transfer = min(k["dur"] for k in members)
        busbw = first["size"] / transfer * FACTOR[first["name"]](first["n"])
        row = inst.loc[key]
        assert row["size_bytes"] == first["size"]
        assert row["transfer_ns"] == transfer
        assert row["busbw_gbps"] == pytest.approx(busbw, rel=1e-12)
        assert row["algbw_gbps"] == pytest.approx(first["size"] / transfer, rel=1e-12)


def test_busbw_factors_are_nccl_tests():
    factors = _analysis("fsdp_gpt_4rank").instances.groupby("collective_type")["busbw_factor"]
    assert factors.unique().map(list).to_dict() == {
        "all_gather": [0.75],
        "all_to_all": [0.75],
        "broadcast": [1.0],
        "reduce_scatter": [0.75],
    }
    ddp = _analysis("ddp_gpt_2rank").instances["busbw_factor"]
    assert (ddp == 2 * (2 - 1) / 2).all()


@pytest.mark.parametrize("run", RUNS)
def test_wait_is_duration_minus_the_shortest_member_and_the_straggler_waits_zero(run):
    a = _analysis(run)
    m = a.members
    assert (m["wait_ns"] >= 0).all()
    assert (m["wait_ns"] == m["dur_ns"] - m["transfer_ns"]).all()
    assert (m.loc[m["is_straggler"], "wait_ns"] == 0).all()
    assert m.groupby(["process_group", "step", "ordinal"])["is_straggler"].sum().eq(1).all()
    inst = a.instances.set_index(["process_group", "step", "ordinal"])
    for key, members in _hand_instances(run).items():
        shortest = min(members, key=lambda k: (k["dur"], k["rank"]))
        longest = max(k["dur"] for k in members)
        assert inst.loc[key, "straggler_rank"] == shortest["rank"]
        assert inst.loc[key, "max_wait_ns"] == longest - shortest["dur"]


@pytest.mark.parametrize("run", RUNS)
def test_stragglers_count_each_instance_once_and_sum_the_waits(run):
    a = _analysis(run)
    table = stragglers(None, analysis=a)
    hand_count = defaultdict(int)
    hand_wait = defaultdict(int)
    for members in _hand_instances(run).values():
        shortest = min(members, key=lambda k: (k["dur"], k["rank"]))
        hand_count[shortest["rank"]] += 1
        for k in members:
            hand_wait[k["rank"]] += k["dur"] - shortest["dur"]
    got = table.set_index("rank")
    assert {r: int(got.loc[r, "n_straggler"]) for r in got.index} == {
        r: hand_count.get(r, 0) for r in got.index
    }
    assert {r: int(got.loc[r, "wait_ns"]) for r in got.index} == dict(hand_wait)
    assert got["others_wait_ns"].sum() == sum(hand_wait.values())


def _hand_overlap_pct(trace: dict, kernel: dict) -> float:
    """Plain-Python union of compute kernels on other streams of the kernel's device."""
    base = int(trace["baseTimeNanoseconds"])
    lo, hi = kernel["start"], kernel["start"] + kernel["dur"]
    pieces = []
    for e in trace["traceEvents"]:
        a = e.get("args", {})
        if e.get("cat") != "kernel" or "Collective name" in a or e["name"].startswith("nccl"):
            continue
        if a["device"] != kernel["device"] or a["stream"] == kernel["stream"]:
            continue
        s = base + _ns(e["ts"])
        s, t = max(s, lo), min(s + _ns(e["dur"]), hi)
        if t > s:
            pieces.append((s, t))
    covered, reach = 0, lo
    for s, t in sorted(pieces):
        if t > reach:
            covered += t - max(s, reach)
            reach = t
    return 100.0 * covered / kernel["dur"]


@pytest.mark.parametrize("run", RUNS)
def test_overlap_pct_is_in_range_and_equals_a_hand_interval_computation(run):
    kernels = _analysis(run).kernels
    assert kernels["overlap_pct"].between(0, 100).all()
    assert (kernels["overlap_pct"] > 0).any()
    by_key = kernels.set_index(["rank", "step", "process_group", "ordinal"])
    path = _trace_files(run)[-1]
    trace = _load(path)
    for k in _hand_kernels_of_file(path)[::5]:
        got = by_key.loc[(k["rank"], k["step"], k["pg"], k["ordinal"]), "overlap_pct"]
        assert got == pytest.approx(_hand_overlap_pct(trace, k), abs=1e-9)


@pytest.mark.parametrize("run", RUNS)
def test_min_bytes_keeps_only_collectives_at_least_that_large(run):
    threshold = 40 * 2**20
    a = analyze_collectives(open_run(os.path.join(DEMO_RUNS, run)), min_bytes=threshold)
    hand = [k for k in _hand_kernels(run) if k["size"] >= threshold]
    assert 0 < len(hand) < len(_hand_kernels(run))
    assert len(a.kernels) == len(hand)
    assert (a.kernels["size_bytes"] >= threshold).all()
    assert len(a.instances) == len({(k["pg"], k["step"], k["ordinal"]) for k in hand})
    assert (a.instances["size_bytes"] >= threshold).all()
    # Filtering happens after matching: surviving instances keep their ordinals.
    full = _analysis(run).instances.set_index(["process_group", "step", "ordinal"])
    kept = a.instances.set_index(["process_group", "step", "ordinal"])
    assert (full.loc[kept.index, "transfer_ns"] == kept["transfer_ns"]).all()


def test_size_buckets_are_powers_of_two_with_binary_unit_labels():
    assert size_bucket_label(64 * 2**20) == "64 MiB-128 MiB"
    assert size_bucket_label(512 * 2**10) == "512 KiB-1 MiB"
    assert size_bucket_label(1) == "1 B-2 B"
    assert size_bucket_label(0) == "0 B"
    a = _analysis("fsdp_gpt_4rank")
    table = collective_type_size_table(a)
    assert table["n_kernels"].sum() == len(_hand_kernels("fsdp_gpt_4rank"))
    hand = defaultdict(int)
    for k in _hand_kernels("fsdp_gpt_4rank"):
        lo = 1 << (k["size"].bit_length() - 1)
        hand[(k["name"], lo)] += 1
    names = {
        "_allgather_base": "all_gather",
        "_reduce_scatter_base": "reduce_scatter",
        "all_to_allv": "all_to_all",
        "broadcast": "broadcast",
    }
    got = {
        (t, int(lo)): int(n)
        for t, lo, n in table[["collective_type", "size_bucket_lo_bytes", "n_kernels"]].values
    }
    assert got == {(names[n], lo): c for (n, lo), c in hand.items()}
    heat = collective_heatmap(None, by="type_size", value="busbw", analysis=a)
    lo_of_label = dict(zip(table["size_bucket"], table["size_bucket_lo_bytes"]))
    assert [lo_of_label[c] for c in heat.columns] == sorted(set(lo_of_label.values()))
    assert heat.attrs["value_column"] == "busbw_median_gbps"


@pytest.mark.parametrize("run", RUNS)
def test_rank_step_table_sums_each_ranks_collective_time_and_wait(run):
    a = _analysis(run)
    table = collective_rank_step_table(a)
    hand_time = defaultdict(int)
    hand_wait = defaultdict(int)
    for members in _hand_instances(run).values():
        transfer = min(k["dur"] for k in members)
        for k in members:
            hand_time[(k["rank"], k["step"])] += k["dur"]
            hand_wait[(k["rank"], k["step"])] += k["dur"] - transfer
    got = table.set_index(["rank", "step"])
    assert got["collective_ns"].to_dict() == dict(hand_time)
    assert got["wait_ns"].to_dict() == dict(hand_wait)
    heat = collective_heatmap(None, by="rank_step", value="wait", analysis=a)
    assert heat.loc[0].to_dict() == {s: w for (r, s), w in hand_wait.items() if r == 0}


def _write_trace(trace: dict, path: str) -> None:
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)


def _nccl_by_launch(trace: dict) -> list[dict]:
    """The NCCL kernel events of a trace, ordered by their launching call's ts."""
    launch = {
        e["args"]["correlation"]: e["ts"]
        for e in trace["traceEvents"]
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    nccl = [
        e
        for e in trace["traceEvents"]
        if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})
    ]
    return sorted(nccl, key=lambda e: launch[e["args"]["correlation"]])


@pytest.fixture(scope="module")
def altered_ddp(tmp_path_factory):
    """The DDP traces with edited NCCL kernel args, imported as one run.

    Kernels are numbered by launch order (8 per step, steps 4, 5, 6):
    1 on both ranks: "allreduce_coalesced"; 2 on both ranks: non-empty In split size;
    9 on rank1: In msg nelems + 1; 12 on rank1: dtype "Quux";
    17 and 18 on rank1: kernel timestamps swapped (launch order unchanged);
    on rank0, the compute kernel that overlaps kernel 5 most moves onto kernel 5's stream.
    Returns the analysis and the edited rank0 trace.
    """
    src = tmp_path_factory.mktemp("altered_src")
    for path in _trace_files("ddp_gpt_2rank"):
        with gzip.open(path, "rt") as f:
            trace = json.load(f)  # floats: the same doubles the importer reads
        rank = trace["distributedInfo"]["rank"]
        k = _nccl_by_launch(trace)
        k[1]["args"]["Collective name"] = "allreduce_coalesced"
        k[2]["args"]["In split size"] = "[16777216, 16783360]"
        if rank == 1:
            k[9]["args"]["In msg nelems"] += 1
            k[12]["args"]["dtype"] = "Quux"
            k[17]["ts"], k[18]["ts"] = k[18]["ts"], k[17]["ts"]
        else:
            _move_onto_stream_of(trace, k[5])
            rank0 = trace
        _write_trace(trace, str(src / os.path.basename(path)))
    logdir = tmp_path_factory.mktemp("altered_logdir")
    run_dir = import_traces([str(src)], str(logdir), "ddp_altered").run_dir
    return analyze_collectives(open_run(run_dir)), rank0


def _move_onto_stream_of(trace: dict, collective: dict) -> None:
    """Move the compute kernel overlapping `collective` most onto the collective's stream."""
    lo, hi = collective["ts"], collective["ts"] + collective["dur"]
    compute = [
        e
        for e in trace["traceEvents"]
        if e.get("cat") == "kernel"
        and "Collective name" not in e["args"]
        and e["args"]["device"] == collective["args"]["device"]
    ]
    best = max(compute, key=lambda e: min(e["ts"] + e["dur"], hi) - max(e["ts"], lo))
    assert min(best["ts"] + best["dur"], hi) - max(best["ts"], lo) > 0
    best["tid"] = collective["tid"]
    best["args"]["stream"] = collective["args"]["stream"]


def test_members_that_disagree_are_reported_as_a_mismatch_not_matched(altered_ddp):
    a, _ = altered_ddp
    keys = a.mismatches.groupby(["process_group", "step", "ordinal"])["mismatch_fields"]
    assert keys.unique().map(list).to_dict() == {
        ("0", 5, 1): ["in_nelems"],
        ("0", 5, 4): ["dtype"],
    }
    assert sorted(a.mismatches["rank"]) == [0, 0, 1, 1]
    matched = set(a.instances[["process_group", "step", "ordinal"]].itertuples(index=False))
    assert ("0", 5, 1) not in matched and ("0", 5, 4) not in matched
    assert len(a.instances) == len(_hand_instances("ddp_gpt_2rank")) - 2
    assert a.instances["complete"].all()
    quux = a.kernels[a.kernels["dtype"] == "Quux"]
    assert quux["size_bytes"].isna().all()
    assert (quux["size_note"] == "unknown dtype 'Quux'").all()


def test_ordinals_follow_launch_order_not_kernel_start(altered_ddp):
    a, _ = altered_ddp
    inst = a.instances.set_index(["process_group", "step", "ordinal"])
    hand = _hand_instances("ddp_gpt_2rank")
    for ordinal in (1, 2):
        assert inst.loc[("0", 6, ordinal), "in_nelems"] == hand[("0", 6, ordinal)][0]["in"]
    assert not (a.mismatches["step"] == 6).any()


def test_coalesced_and_uneven_collectives_get_algbw_only(altered_ddp):
    a, _ = altered_ddp
    inst = a.instances.set_index(["process_group", "step", "ordinal"])
    coalesced, uneven = inst.loc[("0", 4, 1)], inst.loc[("0", 4, 2)]
    assert coalesced["coalesced"] and coalesced["collective_type"] == "all_reduce"
    assert uneven["uneven"] and not uneven["coalesced"]
    for row in (coalesced, uneven):
        assert pd.isna(row["busbw_gbps"])
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / row["transfer_ns"])
    assert coalesced["busbw_note"] == "coalesced launch: algbw only"
    assert uneven["busbw_note"] == "uneven all_to_allv: algbw only"
    k = a.kernels
    flagged = k[k["coalesced"] | k["uneven"]]
    assert len(flagged) == 4
    assert flagged["busbw_incl_wait_gbps"].isna().all()
    assert flagged["algbw_incl_wait_gbps"].notna().all()


def test_overlap_counts_compute_on_other_streams_only(altered_ddp):
    a, rank0 = altered_ddp
    collective = _nccl_by_launch(rank0)[5]
    base = int(rank0["baseTimeNanoseconds"])
    kernel = {
        "start": base + _ns(collective["ts"]),
        "dur": _ns(collective["dur"]),
        "device": collective["args"]["device"],
        "stream": collective["args"]["stream"],
    }
    k = a.kernels.set_index(["rank", "step", "ordinal"])
    got = k.loc[(0, 4, 5), "overlap_pct"]
    before = _analysis("ddp_gpt_2rank").kernels.set_index(["rank", "step", "ordinal"])
    assert got == pytest.approx(_hand_overlap_pct(rank0, kernel), abs=1e-9)
    assert got < before.loc[(0, 4, 5), "overlap_pct"]


def test_clocks_of_different_hosts_are_aligned_by_instance_end_times(tmp_path):
    shift_ns = 5_000_000_000
    src = tmp_path / "src"
    src.mkdir()
    for path in _trace_files("ddp_gpt_2rank"):
        if "rank1." in os.path.basename(path):
            with gzip.open(path, "rt") as f:
                trace = json.load(f)
            trace["baseTimeNanoseconds"] += shift_ns
            _write_trace(trace, str(src / os.path.basename(path)))
        else:
            shutil.copy(path, src)
    run = open_run(import_traces([str(src)], str(tmp_path / "logdir"), "shifted").run_dir)
    one_host = analyze_collectives(run).members
    assert (one_host["clock_offset_ns"] == 0).all()
    run.workers["rank0"].meta.host = "node-a"
    run.workers["rank1"].meta.host = "node-b"
    a = analyze_collectives(run)
    offsets = a.members.groupby("rank")["clock_offset_ns"].unique().map(list).to_dict()
    assert offsets[0] == [0]
    assert abs(offsets[1][0] - shift_ns) < 50_000
    assert (a.instances["end_spread_ns"] < 100_000).all()
    same = _analysis("ddp_gpt_2rank").members
    assert a.members["wait_ns"].tolist() == same["wait_ns"].tolist()


def test_functions_agree_with_the_one_pass_analysis():
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    a = _analysis("ddp_gpt_2rank")
    pd.testing.assert_frame_equal(collective_kernels(run), a.kernels)
    inst, mism = collective_instances(run, steps=[5])
    assert set(inst["step"]) == {5}
    assert len(inst) == int(np.sum(a.instances["step"] == 5))
    assert mism.empty
    one = collective_kernels(run, workers=["rank0"])
    assert set(one["worker"]) == {"rank0"}
    partial, _ = collective_instances(run, workers=["rank0"])
    assert not partial["complete"].any()
    assert partial["transfer_ns"].isna().all()
