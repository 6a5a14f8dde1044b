"""What `profile.session` wrote on real GPUs (an H200; one GPU, and 2-rank DDP under
torchrun): bench/gpu_capture_check.py's outputs, kept in tests/data/gpu_capture.

Made with (on a machine with two H200s):
    python bench/gpu_capture_check.py --out OUT --layers 2 --d 512 --seq 512 --batch 4 --steps 12
    torchrun --nproc_per_node=2 bench/gpu_capture_check.py --out OUT --layers 2 --seq 512 \
        --batch 4 --steps 12 --no-attach
Chrome exports are gzipped; the scripts' own output is in the two .log files.
"""

from __future__ import annotations

import collections
import gzip
import json
import os

import numpy as np
import pandas as pd
import pytest

from tessera_tb.backend.collectives import collective_instances
from tessera_tb.trace import open_run
from tessera_tb.trace.open_trace import open_trace
from tessera_tb.trace.step import KIND
from tests.conftest import ROOT

DATA = os.path.join(ROOT, "tests", "data", "gpu_capture")
ONE_GPU = os.path.join(DATA, "run_1gpu")
DDP = os.path.join(DATA, "run_ddp")
# schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2) over 12 steps: steps 0-1
# skipped, then (wait, warmup, active, active) twice.
ACTIVE_STEPS = [4, 5, 8, 9]
DEVICE_WORK = [KIND["kernel"], KIND["collective"], KIND["memcpy"], KIND["memset"]]


def _steps(run_dir):
    run = open_run(run_dir)
    return [(w, run.load_step(w, s)) for w in sorted(run.workers) for s in run.worker(w).steps]


@pytest.mark.parametrize("run_dir", [ONE_GPU, DDP], ids=["1gpu", "ddp"])
def test_only_the_active_steps_were_written_by_every_rank(run_dir):
    run = open_run(run_dir)
    for info in run.workers.values():
        assert info.steps == ACTIVE_STEPS
        caps = {c.name: c.status for c in info.meta.capabilities}
        assert caps["nvml"] == caps["device_activity"] == caps["torch_profiler"] == "ok"
        assert info.meta.devices and "H200" in info.meta.devices[0].name


@pytest.mark.parametrize("run_dir", [ONE_GPU, DDP], ids=["1gpu", "ddp"])
def test_kernels_copies_and_their_launch_links_are_in_every_step(run_dir):
    for _, step in _steps(run_dir):
        ev = step.events
        kinds = collections.Counter(ev["kind"].tolist())
        assert kinds[KIND["kernel"]] > 50 and kinds[KIND["memcpy"]] > 0
        assert kinds[KIND["memset"]] > 0 and kinds[KIND["region"]] >= 4
        device = np.isin(ev["kind"], DEVICE_WORK)
        assert (ev["launch"][device] >= 0).all()  # every device event found its launch call
        assert (ev["start_ns"][device] + ev["dur_ns"][device] <= step.end_ns).all()


@pytest.mark.parametrize("run_dir", [ONE_GPU, DDP], ids=["1gpu", "ddp"])
def test_nvml_counter_tracks_lie_inside_each_step(run_dir):
    for _, step in _steps(run_dir):
        counters = {c.name: c for c in step.counters}
        for name in ("power_w", "temp_c", "sm_clock_mhz", "gpu_util_pct", "throttle_reasons"):
            c = counters[name]
            # ~10 ms steps against a 10 ms sampling interval: at least one sample each
            assert c.source == "nvml" and c.ts_ns.size >= 1
            assert (c.ts_ns >= step.start_ns).all() and (c.ts_ns < step.end_ns).all()
        assert 50 < np.median(counters["power_w"].values) < 1000  # an H200 under load, in W
        loss = counters["loss"]
        assert loss.source == "user" and loss.ts_ns.size == 1


def test_ddp_all_reduces_match_across_both_ranks_with_their_nccl_args():
    run = open_run(DDP)
    instances, mismatches = collective_instances(run)
    assert mismatches.empty
    assert len(instances) > 0 and instances["complete"].all()
    assert set(instances["collective_type"]) == {"all_reduce"}
    for _, step in _steps(DDP):
        rows = np.flatnonzero(step.events["kind"] == KIND["collective"])
        assert rows.size > 0
        names = step.attr("Collective name").reindex(rows)
        assert (names == "allreduce").all()
        nelems = step.attr("In msg nelems").reindex(rows)
        assert (nelems > 0).all() and (step.attr("Group size").reindex(rows) == 2).all()


def _chrome(name: str) -> dict:
    with gzip.open(os.path.join(DATA, name), "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("name", ["run_1gpu.trace.0.json.gz", "run_ddp.trace.0.json.gz"])
def test_chrome_exports_follow_the_trace_format_rules(name):
    events = _chrome(name)["traceEvents"]
    slices = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
            slices[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in slices.values():  # strict nesting on every track
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3
            stack.append(end)
    flows = collections.Counter((e["cat"], e["id"], e["ph"]) for e in events if e["ph"] in "sf")
    starts = {(c, i) for c, i, ph in flows if ph == "s"}
    ends = {(c, i) for c, i, ph in flows if ph == "f"}
    assert starts and starts == ends


def test_a_chrome_export_reimports_with_the_same_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    exported = open_trace(os.path.join(DATA, "run_ddp.trace.0.json.gz"))

    def kernel_names(run, worker):
        c = collections.Counter()
        for s in run.worker(worker).steps:
            step = run.load_step(worker, s)
            m = np.isin(step.events["kind"], [KIND["kernel"], KIND["collective"]])
            c.update(step.string_values(step.events["name_id"][m]).tolist())
        return c

    original = open_run(DDP)
    assert exported.steps == ACTIVE_STEPS
    (worker,) = exported.workers
    assert kernel_names(exported, worker) == kernel_names(original, "rank0")


def test_the_summary_export_is_the_op_table_of_the_run():
    csv = pd.read_csv(os.path.join(DATA, "run_1gpu.summary.0.csv"), keep_default_na=False)
    assert {"name", "calls", "host_self_ns", "device_self_ns", "flops"} <= set(csv.columns)
    from tessera_tb.backend.topk import op_table

    table = op_table(open_run(ONE_GPU), by_input_dims=True, k=None)
    table["input_dims"] = table["input_dims"].fillna("")
    merged = csv.merge(table, on=["name", "input_dims"], suffixes=("", "_table"))
    assert len(merged) == len(csv)
    for col in ("calls", "host_self_ns", "device_self_ns"):
        assert (merged[col].astype(np.int64) == merged[f"{col}_table"]).all()


def test_attach_sampled_the_training_process_and_its_device():
    summary = pd.read_csv(os.path.join(DATA, "attach.csv"))
    power = summary[(summary.device == 0) & (summary.counter == "power_w")].iloc[0]
    assert power.samples > 100 and power["min"] <= power["mean"] <= power["max"]
    proc_mem = summary[(summary.device == 0) & (summary.counter == "proc_mem_used_bytes")]
    assert proc_mem.iloc[0]["max"] > 1e9  # the training process's own memory on GPU 0
    trace = _chrome("attach.trace.json.gz")["traceEvents"]
    counters = [e for e in trace if e["ph"] == "C"]
    power_events = [e for e in counters if "power" in e["name"]]
    assert len(power_events) >= power.samples
