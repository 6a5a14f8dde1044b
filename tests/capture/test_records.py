"""Portable records carry the trace's own numbers, and null plus a reason for the rest."""

from __future__ import annotations

import collections
import csv
import glob
import gzip
import json
import os
from decimal import Decimal

import pytest

from tessera.profile.records import FIELDS, NCU_COUNTERS, kernel_records
from tessera_tb.trace import open_run

from ..conftest import DEMO_RUNS, SHARED_TRACES


def _source(shared: str, worker: str) -> tuple[dict, list[dict]]:
    (path,) = glob.glob(os.path.join(SHARED_TRACES, "pytorch", shared, f"{worker}.*.json.gz"))
    with gzip.open(path, "rt") as f:
        trace = json.load(f, parse_float=Decimal)  # exact µs with 3 decimals
    with open(os.path.join(SHARED_TRACES, "pytorch", shared, f"nvml_{worker}.csv")) as f:
        nvml = [r for r in csv.DictReader(f) if r.get("power_w")]
    return trace, nvml


@pytest.fixture(scope="module")
def ddp():
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    trace, nvml = _source("ddp_gpt_2rank", "rank0")
    return run, list(kernel_records(run, workers=["rank0"])), trace, nvml


def _by_start(trace: dict, cats: tuple[str, ...]) -> dict[int, dict]:
    base = int(trace["baseTimeNanoseconds"])
    return {base + int(e["ts"] * 1000): e for e in trace["traceEvents"] if e.get("cat") in cats}


def test_one_record_per_kernel_memcpy_and_memset_of_the_trace(ddp):
    _, records, trace, _ = ddp
    counts = collections.Counter(
        e["cat"]
        for e in trace["traceEvents"]
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    kinds = collections.Counter(r["kind"] for r in records)
    assert kinds["kernel"] + kinds["collective"] == counts["kernel"]
    assert kinds["memcpy"] == counts["gpu_memcpy"]
    assert kinds["memset"] == counts["gpu_memset"]
    assert all(set(FIELDS) | {"capabilities"} == set(r) for r in records)


def test_launch_shape_comes_from_the_kernel_args(ddp):
    _, records, trace, _ = ddp
    src = _by_start(trace, ("kernel",))
    kernels = [r for r in records if r["kind"] in ("kernel", "collective")]
    for r in kernels:
        e = src[r["start_ns"]]
        assert r["name"] == e["name"]
        assert r["grid"] == e["args"]["grid"] and r["block"] == e["args"]["block"]
        assert r["registers"] == e["args"]["registers per thread"]
        assert r["dur_ns"] == int(e["dur"] * 1000)


def test_without_nsight_compute_counters_are_null_and_say_no_ncu(ddp):
    _, records, trace, _ = ddp
    src = _by_start(trace, ("kernel",))
    for r in (r for r in records if r["kind"] == "kernel"):
        for name in NCU_COUNTERS:
            assert r[name] is None and r["capabilities"][name] == "unavailable:no-ncu"
        # Occupancy is Kineto's estimate, labelled as such.
        assert r["sm_occupancy"] == float(src[r["start_ns"]]["args"]["est. achieved occupancy %"])
        assert r["capabilities"]["sm_occupancy"].startswith("estimated:")


def test_memcpy_direction_and_bandwidth_match_kinetos_own(ddp):
    _, records, trace, _ = ddp
    src = _by_start(trace, ("gpu_memcpy",))
    memcpys = [r for r in records if r["kind"] == "memcpy"]
    assert memcpys
    for r in memcpys:
        e = src[r["start_ns"]]
        assert r["memcpy_dir"] in e["name"] and r["memcpy_dir"] in ("HtoD", "DtoH", "DtoD")
        kineto_gbps = float(e["args"]["memory bandwidth (GB/s)"])
        assert r["memcpy_gbps"] == pytest.approx(kineto_gbps, rel=1e-3)


def test_collectives_carry_type_and_bytes_from_the_nccl_args(ddp):
    _, records, trace, _ = ddp
    src = _by_start(trace, ("kernel",))
    colls = [r for r in records if r["kind"] == "collective"]
    assert len(colls) > 5
    size = {"Float": 4, "BFloat16": 2, "Half": 2}
    for r in colls:
        a = src[r["start_ns"]]["args"]
        assert a["Collective name"] == "allreduce" and r["collective_type"] == "all_reduce"
        expected = max(a["In msg nelems"], a["Out msg nelems"]) * size[a["dtype"]]
        assert r["collective_bytes"] == expected
        assert 0.0 <= r["collective_overlap_pct"] <= 100.0
        assert "collective_type" not in r["capabilities"]


def test_power_is_the_nvml_sample_of_the_step_nearest_to_the_kernel(ddp):
    run, records, _, nvml = ddp
    spans = {e.step: (e.start_ns, e.end_ns) for e in run.workers["rank0"].meta.steps}
    samples = sorted((int(r["t_ns"]), float(r["power_w"]), float(r["temp_c"])) for r in nvml)
    for r in records:
        lo, hi = spans[r["step"]]
        inside = [s for s in samples if lo <= s[0] < hi]
        # Nearest by |t - start|; on a tie the earlier sample (sorted first).
        nearest = min(inside, key=lambda s: abs(s[0] - r["start_ns"]))
        assert (r["power_w"], r["temp_c"]) == nearest[1:]
        assert "power_w" not in r["capabilities"]
    assert len(records) > 100


def test_matched_nsight_compute_counters_replace_the_nulls():
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    records = list(kernel_records(run))
    measured = [r for r in records if r["warp_divergence_pct"] is not None]
    if not measured:
        pytest.skip("the demo run has no Nsight Compute counters")
    for r in measured:
        # the demo run's counters were matched launch by launch (name and order)
        assert r["capabilities"]["warp_divergence_pct"] == "measured"
        assert 0.0 <= r["warp_divergence_pct"] <= 100.0
