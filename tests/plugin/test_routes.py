"""The plugin's HTTP routes, through a real TensorBoard on a copy of the demo runs."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import shutil
import statistics

import pandas as pd
import pytest

from tessera_tb.backend import plugin_data, topk
from tessera_tb.backend.run_index import RunIndex
from tessera_tb.backend.selection import steady_state_step
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace.reader import open_run
from tests.conftest import DEMO_RUNS, SHARED_TRACES
from tests.plugin.conftest import (
    HOSTILE_RUN,
    get_json,
    http_get,
    route_url,
    rows,
    start_tensorboard,
    stop_tensorboard,
)

DEMO = ("gpt_1gpu", "ddp_gpt_2rank", "fsdp_gpt_4rank")


def _meta(run: str, worker: str) -> pb.WorkerMeta:
    path = os.path.join(DEMO_RUNS, run, "plugins", "tessera", worker, "meta.pb")
    with open(path, "rb") as f:
        return pb.WorkerMeta.FromString(f.read())


def test_runs_lists_every_run_with_its_workers_and_step_index(tb_url):
    listing = {r["name"]: r for r in get_json(tb_url, "runs")["runs"]}
    assert set(listing) == {*DEMO, HOSTILE_RUN, "broken_run", "corrupt_step"}
    for run in DEMO:
        workers = sorted(os.listdir(os.path.join(DEMO_RUNS, run, "plugins", "tessera")))
        assert [w["name"] for w in listing[run]["workers"]] == workers
        for w in listing[run]["workers"]:
            meta = _meta(run, w["name"])
            assert w["rank"] == meta.rank
            assert [(s["step"], s["event_count"]) for s in w["steps"]] == [
                (e.step, e.event_count) for e in meta.steps
            ]
        assert listing[run]["error"] is None


def test_an_unreadable_run_is_listed_with_its_error_and_others_still_work(tb_url):
    broken = next(r for r in get_json(tb_url, "runs")["runs"] if r["name"] == "broken_run")
    assert "rank0" in broken["error"] and "corrupt worker metadata" in broken["error"]
    status, body, _ = http_get(route_url(tb_url, "header", run="broken_run"))
    assert status == 404 and b"cannot be read" in body
    assert get_json(tb_url, "header", run="gpt_1gpu")["num_workers"] == 1


def test_header_shows_gpu_model_clocks_versions_and_missing_data(tb_url):
    header = get_json(tb_url, "header", run="ddp_gpt_2rank")
    meta = _meta("ddp_gpt_2rank", "rank0")
    assert header["devices"] == [
        {
            "name": "NVIDIA H200",
            "count": len(meta.devices),  # both ranks list the same two GPUs of one host
            "num_sms": 132,
            "memory_bytes": meta.devices[0].total_global_mem_bytes,
            "compute_capability": "9.0",
        }
    ]
    assert header["versions"]["nccl"] == "2.28.9"
    # Clocks: NVML samples of the sampler's CSV inside the steady-state step's span.
    step = steady_state_step(open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank")), "rank0")
    entry = next(e for e in meta.steps if e.step == step)
    with open(os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank", "nvml_rank0.csv")) as f:
        samples = [r for r in csv.DictReader(f) if entry.start_ns <= int(r["t_ns"]) < entry.end_ns]
    assert header["clocks"]["sm_clock_mhz"] == statistics.median(
        float(r["sm_mhz"]) for r in samples
    )
    assert header["clocks"]["mem_clock_mhz"] == statistics.median(
        float(r["mem_mhz"]) for r in samples
    )
    missing = {m["name"]: m for m in header["missing"]}
    assert missing["stacks"]["reason"] == "recorded without with_stack=True"
    assert missing["stacks"]["workers"] == ["rank0", "rank1"]
    assert "ncu_counters" in missing
    assert "shapes" not in missing


@pytest.mark.parametrize(
    ("run", "gpus"), [("gpt_1gpu", 1), ("ddp_gpt_2rank", 2), ("fsdp_gpt_4rank", 4)]
)
def test_header_counts_the_gpus_the_workers_ran_on_not_every_listed_one(tb_url, run, gpus):
    header = get_json(tb_url, "header", run=run)
    trace = open_run(os.path.join(DEMO_RUNS, run))
    # Independent count: the distinct (host, device) of GPU streams in every step of every worker.
    used = set()
    for w, step in trace.iter_steps():
        host = trace.workers[w].meta.host
        used |= {(host, t.device) for t in step.tracks if t.kind == "device_stream"}
    assert len(used) == gpus
    assert [d["count"] for d in header["devices"]] == [gpus]
    if run == "gpt_1gpu":  # its trace lists both GPUs of the machine, one of which it used
        assert len(_meta(run, "worker0").devices) == 2


@pytest.mark.parametrize(
    ("route", "params", "status"),
    [
        ("header", {"run": "no_such_run"}, 404),
        ("header", {"run": "../gpt_1gpu"}, 404),
        ("header", {"run": "/etc"}, 404),
        ("header", {}, 400),
        ("topk", {"run": "gpt_1gpu", "workers": "rank9"}, 404),
        ("topk", {"run": "gpt_1gpu", "workers": "../../etc"}, 404),
        ("topk", {"run": "gpt_1gpu", "steps": "abc"}, 400),
        ("topk", {"run": "gpt_1gpu", "steps": "99"}, 404),
        ("topk", {"run": "gpt_1gpu", "k": "0"}, 400),
        ("topk", {"run": "gpt_1gpu", "sort": "no_such_column"}, 400),
        ("topk", {"run": "gpt_1gpu", "table": "gpus"}, 400),
        ("csv", {"run": "gpt_1gpu", "view": "topk", "table": "nope"}, 400),
        ("csv", {"run": "gpt_1gpu", "view": "nope", "table": "x"}, 404),
        ("static/..%2fplugin.py", {}, 404),
        ("static/%2e%2e/plugin.py", {}, 404),
        ("static/index.js", {}, 404),
    ],
)
def test_bad_parameters_get_a_one_line_error_not_a_traceback(tb_url, route, params, status):
    got, body, headers = http_get(route_url(tb_url, route, **params))
    assert got == status
    assert headers["Content-Type"].startswith("text/plain")
    assert b"Traceback" not in body and body.count(b"\n") <= 1


def test_plotly_is_served_from_the_plotly_package_precompressed_and_cacheable(tb_url):
    import plotly

    status, body, headers = http_get(route_url(tb_url, "static/plotly.min.js"))
    assert status == 200
    assert "max-age=3600" in headers["Cache-Control"]
    with open(
        os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js"), "rb"
    ) as f:
        shipped = f.read()
    assert (gzip.decompress(body) if headers.get("Content-Encoding") == "gzip" else body) == shipped


@pytest.mark.parametrize("table", ["operators", "kernels"])
def test_topk_rows_equal_the_analysis_function(tb_url, table):
    got = get_json(tb_url, "topk", run="ddp_gpt_2rank", table=table, k=7, steps="5-6")
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    fn = topk.op_table if table == "operators" else topk.kernel_table
    want = fn(run, None, [5, 6], k=7)
    got_rows = rows(got["tables"][table])
    assert [r["name"] for r in got_rows] == list(want["name"])
    key = "device_self_ns" if table == "operators" else "total_dur_ns"
    assert [r[key] for r in got_rows] == [int(v) for v in want[key]]
    assert got["selection"] == {"workers": ["rank0", "rank1"], "steps": [5, 6]}


def test_nan_becomes_null_in_json(tb_url):
    got = get_json(tb_url, "topk", run="gpt_1gpu", table="kernels", k=3)
    other = rows(got["tables"]["kernels"])[-1]
    assert other["name"] == "(other)" and other["min_dur_ns"] is None


def test_csv_download_holds_the_same_rows_as_the_table(tb_url):
    params = dict(run="fsdp_gpt_4rank", table="kernels", k=5, workers="ranks:1-2")
    shown = rows(get_json(tb_url, "topk", **params)["tables"]["kernels"])
    status, body, headers = http_get(route_url(tb_url, "csv", view="topk", **params))
    assert status == 200
    assert 'filename="fsdp_gpt_4rank_topk_kernels.csv"' in headers["Content-Disposition"]
    got = list(csv.DictReader(io.StringIO(body.decode())))
    assert [r["name"] for r in got] == [r["name"] for r in shown]
    assert [int(r["total_dur_ns"]) for r in got] == [r["total_dur_ns"] for r in shown]


def test_csv_cells_that_would_run_as_formulas_are_quoted(tmp_path):
    df = pd.DataFrame({"name": ["=cmd()", "ok", None], "n": [1, 2, 3]})
    plugin_data.VIEWS["_csv_probe"] = plugin_data.View(lambda run, sel: {"tables": {"t": df}})
    shutil.copytree(os.path.join(DEMO_RUNS, "gpt_1gpu"), tmp_path / "r")
    index = RunIndex(str(tmp_path), refresh_s=60)
    try:
        body, _ = plugin_data.table_csv(index, {"run": "r", "view": "_csv_probe", "table": "t"})
    finally:
        del plugin_data.VIEWS["_csv_probe"]
    got = list(csv.reader(io.StringIO(body.decode())))
    assert got[1:] == [["'=cmd()", "1"], ["ok", "2"], ["", "3"]]


def test_a_corrupt_step_is_reported_and_the_other_steps_are_still_analysed(tb_url):
    got = get_json(tb_url, "topk", run="corrupt_step", table="kernels", steps="4-5")
    assert [(e["worker"], e["step"]) for e in got["errors"]] == [("worker0", 5)]
    assert "corrupt step file" in got["errors"][0]["error"]
    assert got["selection"]["steps"] == [4]
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    want = topk.kernel_table(run, None, [4], k=20)
    assert [r["name"] for r in rows(got["tables"]["kernels"])] == list(want["name"])
    status, body, _ = http_get(route_url(tb_url, "topk", run="corrupt_step", steps="5"))
    assert status == 404 and b"corrupt step file" in body
    listing = next(r for r in get_json(tb_url, "runs")["runs"] if r["name"] == "corrupt_step")
    steps = {s["step"]: s["error"] for s in listing["workers"][0]["steps"]}
    assert steps[4] is None and "corrupt step file" in steps[5]


@pytest.fixture(scope="module")
def tb_slow_loader_with_prefix(plugin_logdir, tmp_path_factory):
    errlog = tmp_path_factory.mktemp("tb_slow") / "stderr.txt"
    proc, url = start_tensorboard(
        plugin_logdir, errlog, "--load_fast=false", "--path_prefix=/some/prefix"
    )
    try:
        yield url
    finally:
        stop_tensorboard(proc)


def test_routes_work_with_the_multiplexer_loader_and_a_path_prefix(tb_slow_loader_with_prefix):
    url = tb_slow_loader_with_prefix
    assert url.endswith("/some/prefix")
    names = {r["name"] for r in get_json(url, "runs")["runs"]}
    assert {*DEMO, HOSTILE_RUN} <= names
    status, body, _ = http_get(url + "/data/plugins_listing")
    assert json.loads(body)["tessera"]["enabled"] is True
    assert get_json(url, "topk", run="gpt_1gpu", k=1)["k"] == 1


def test_a_long_run_opens_on_eight_steps_from_its_steady_state_step():
    from tessera_tb.trace.reader import Run, WorkerInfo

    meta = pb.WorkerMeta(worker="rank0")
    for s in range(20):  # step 0 is slow (warm-up); steps 13 and 14 are the median-like ones
        dur = 90 if s == 0 else 50 + (s % 7)
        meta.steps.add(step=s, start_ns=s * 100, end_ns=s * 100 + dur)
    run = Run("/nonexistent", {"rank0": WorkerInfo("rank0", "/nonexistent", meta)})
    start = steady_state_step(run, "rank0")
    assert plugin_data.default_steps(run, "rank0") == f"{min(start, 12)}-{min(start, 12) + 7}"
    short = pb.WorkerMeta(worker="w")
    for s in (4, 5, 6):
        short.steps.add(step=s, start_ns=s, end_ns=s + 1)
    run = Run("/nonexistent", {"w": WorkerInfo("w", "/nonexistent", short)})
    assert plugin_data.default_steps(run, "w") == "4-6"
