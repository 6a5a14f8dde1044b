"""Comparing runs: the 4-rank FSDP run against the 2-rank DDP run of the same model, checked
against the step index read with protobuf alone and against the JSON traces."""

from __future__ import annotations

import glob
import gzip
import json
import os
import statistics

import numpy as np
import pytest

from tessera_tb.backend import compare
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace.reader import open_run
from tessera_tb.trace.step import KIND
from tests.conftest import DEMO_RUNS, SHARED_TRACES

DDP = os.path.join(DEMO_RUNS, "ddp_gpt_2rank")
FSDP = os.path.join(DEMO_RUNS, "fsdp_gpt_4rank")


def step_spans_ms(run_dir: str, steps=None) -> list[float]:
    """Every worker's step spans, read from its meta.pb with protobuf alone."""
    root = os.path.join(run_dir, "plugins", "tessera")
    out = []
    for worker in sorted(os.listdir(root)):
        with open(os.path.join(root, worker, "meta.pb"), "rb") as f:
            meta = pb.WorkerMeta.FromString(f.read())
        out += [
            (e.end_ns - e.start_ns) / 1e6 for e in meta.steps if steps is None or e.step in steps
        ]
    return out


def nccl_kernels_in_json(run: str) -> tuple[set[str], set[str]]:
    """(NCCL kernel names without their parameter list, Collective name args) of a run's
    traces, read with the json module."""
    names, collectives = set(), set()
    for path in glob.glob(os.path.join(SHARED_TRACES, "pytorch", run, "*.json.gz")):
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
        for e in events:
            if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel"):
                names.add(e["name"].split("(")[0])
                collectives.add(e["args"]["Collective name"])
    return names, collectives


@pytest.fixture(scope="module")
def ddp_vs_fsdp() -> compare.Comparison:
    return compare.compare_runs(open_run(DDP), open_run(FSDP))


def test_the_median_step_time_delta_is_the_step_index_hand_computation(ddp_vs_fsdp):
    a, b = statistics.median(step_spans_ms(DDP)), statistics.median(step_spans_ms(FSDP))
    row = ddp_vs_fsdp.step_medians.set_index("figure").loc["step_time_ms"]
    assert row["a"] == pytest.approx(a, abs=1e-9)
    assert row["b"] == pytest.approx(b, abs=1e-9)
    assert row["delta"] == pytest.approx(b - a, abs=1e-9)
    assert ddp_vs_fsdp.slowdown_pct == pytest.approx(100 * (b - a) / a, rel=1e-12)
    runs = ddp_vs_fsdp.runs.set_index("side")
    assert runs.loc["A", "world_size"] == 2 and runs.loc["B", "world_size"] == 4
    assert runs.loc["A", "worker_steps"] == 6 and runs.loc["B", "worker_steps"] == 12


def test_fsdp_brings_new_gather_scatter_sendrecv_broadcast_kernels_and_drops_the_all_reduce(
    ddp_vs_fsdp,
):
    ddp_names, ddp_types = nccl_kernels_in_json("ddp_gpt_2rank")
    fsdp_names, fsdp_types = nccl_kernels_in_json("fsdp_gpt_4rank")
    assert ddp_types == {"allreduce"}
    assert fsdp_types == {"_allgather_base", "_reduce_scatter_base", "all_to_allv", "broadcast"}
    changes = ddp_vs_fsdp.kernel_changes
    nccl = changes[changes["kernel"].str.startswith("ncclDevKernel")]
    assert set(nccl.loc[nccl["status"] == "new", "kernel"]) == fsdp_names - ddp_names
    assert set(nccl.loc[nccl["status"] == "vanished", "kernel"]) == ddp_names - fsdp_names
    assert {n.split("_")[1] for n in fsdp_names - ddp_names} == {
        "AllGather",
        "ReduceScatter",
        "SendRecv",
        "Broadcast",
    }
    assert [n.split("_")[1] for n in ddp_names - fsdp_names] == ["AllReduce"]
    assert set(nccl["op"]) == {"record_param_comms"}
    assert (nccl["kind"] == "collective").all()
    coll = ddp_vs_fsdp.collective_deltas
    assert set(coll.loc[coll["status"] == "vanished", "collective_type"]) == {"all_reduce"}
    assert set(coll.loc[coll["status"] == "new", "collective_type"]) == {
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
    }


def test_kernel_times_are_medians_over_worker_steps_of_the_step_files(ddp_vs_fsdp):
    """The all-gather's B time: per (worker, step), its kernels' summed durations, counted
    with numpy from the event columns; then the median over the 12 pairs."""
    run = open_run(FSDP)
    per_pair = []
    for w in sorted(run.workers):
        for s in run.steps:
            step = run.load_step(w, s)
            ev = step.events
            names = step.string_values(ev["name_id"])
            hit = (ev["kind"] == KIND["collective"]) & np.char.startswith(
                names.astype(str), "ncclDevKernel_AllGather_RING_LL("
            )
            per_pair.append(int(ev["dur_ns"][hit].sum()))
    d = ddp_vs_fsdp.kernel_deltas.set_index("kernel")
    row = d.loc["ncclDevKernel_AllGather_RING_LL"]
    assert row["b_total_dur_ns"] == pytest.approx(float(np.median(per_pair)))
    assert row["a_total_dur_ns"] == 0 and row["delta_total_dur_ns"] == row["b_total_dur_ns"]
    impacts = ddp_vs_fsdp.kernel_deltas["impact_ns"].to_numpy()
    assert (np.diff(impacts) <= 0).all()  # by impact, largest first
    assert ddp_vs_fsdp.kernel_deltas["kernel"].iloc[0] == "ncclDevKernel_AllGather_RING_LL"


def test_a_run_compared_with_itself_changes_nothing():
    run = open_run(DDP)
    c = compare.compare_runs(run, run)
    assert c.slowdown_pct == 0
    assert (c.step_medians["delta"].fillna(0) == 0).all()
    for table, col in (("op_deltas", "impact_ns"), ("kernel_deltas", "impact_ns")):
        df = getattr(c, table)
        assert (df["status"] == "both").all() and (df[col] == 0).all()
    assert c.kernel_changes.empty
    assert (c.collective_deltas["delta_busbw_median_gbps"] == 0).all()


def test_selections_compare_chosen_steps_and_workers():
    a = compare.Side(open_run(DDP), steps=[5])
    b = compare.Side(open_run(DDP), workers=["rank1"], steps=[4, 6])
    medians = compare.step_medians(a, b).set_index("figure")
    assert medians.loc["step_time_ms", "a"] == pytest.approx(
        statistics.median(step_spans_ms(DDP, steps={5}))
    )
    root = os.path.join(DDP, "plugins", "tessera", "rank1", "meta.pb")
    meta = pb.WorkerMeta.FromString(open(root, "rb").read())
    spans = [(e.end_ns - e.start_ns) / 1e6 for e in meta.steps if e.step in (4, 6)]
    assert medians.loc["step_time_ms", "b"] == pytest.approx(statistics.median(spans))
    assert compare.runs_table(a, b)["steps"].tolist() == ["5", "4,6"]


@pytest.mark.parametrize(
    ("name", "match"),
    [
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
            "at::native::vectorized_elementwise_kernel",
        ),
        (
            "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ncclDevKernel_AllGather_RING_LL",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
            "(anonymous namespace)::TensorListMetadata<4>, float>(at::native::"
            "(anonymous namespace)::TensorListMetadata<4>, float)",
            "at::native::(anonymous namespace)::multi_tensor_apply_kernel",
        ),
        (
            "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN",
            "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN",
        ),
    ],
)
def test_kernels_match_by_name_without_template_arguments(name, match):
    assert compare.kernel_match_name(name) == match
