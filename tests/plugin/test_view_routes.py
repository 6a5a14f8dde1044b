"""The view routes answer what the analyses compute, checked against the step files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tessera_tb.backend import breakdown, findings
from tessera_tb.trace.reader import open_run
from tessera_tb.trace.step import KIND
from tests.conftest import DEMO_RUNS
from tests.plugin.conftest import get_json, http_get, route_url, rows


def _run(name: str):
    return open_run(os.path.join(DEMO_RUNS, name))


def test_overview_breakdown_is_the_analysis_and_sums_to_each_step_span(tb_url):
    got = get_json(tb_url, "overview", run="ddp_gpt_2rank")
    table = rows(got["tables"]["breakdown"])
    want = breakdown.step_time_breakdown(_run("ddp_gpt_2rank"))
    assert [(r["worker"], r["step"]) for r in table] == list(zip(want["worker"], want["step"]))
    run = _run("ddp_gpt_2rank")
    for r in table:
        entry = next(e for e in run.worker(r["worker"]).meta.steps if e.step == r["step"])
        assert r["span_ns"] == entry.end_ns - entry.start_ns
        assert sum(r[f"{c}_ns"] for c in got["categories"]) == r["span_ns"]
        assert r["compute_ns"] == int(
            want.loc[
                want["step"].eq(r["step"]) & want["worker"].eq(r["worker"]), "compute_ns"
            ].iloc[0]
        )


def test_overview_findings_and_summary_come_from_their_analyses(tb_url):
    got = get_json(tb_url, "overview", run="fsdp_gpt_4rank", steps="5")
    want = findings.findings(_run("fsdp_gpt_4rank"), None, [5])
    assert [(f["worker"], f["kind"], f["title"]) for f in rows(got["tables"]["findings"])] == list(
        zip(want["worker"], want["kind"], want["title"])
    )
    summary = rows(got["tables"]["step_summary"])
    assert [s["worker"] for s in summary] == ["rank0", "rank1", "rank2", "rank3"]


def _overlapping(step, lo: int, hi: int) -> int:
    """Events of a step file overlapping [lo, hi): counted with numpy from the columns."""
    s, d = step.events["start_ns"], step.events["dur_ns"]
    return int(np.count_nonzero(((s < hi) & (s + d > lo)) | ((d == 0) & (s >= lo) & (s < hi))))


def test_timeline_window_holds_every_event_of_the_window_at_its_time(tb_url):
    run = _run("ddp_gpt_2rank")
    step = run.load_step("rank1", 5)
    origin = min(
        next(e.start_ns for e in w.meta.steps if e.step == 5) for w in run.workers.values()
    )
    t0, t1 = step.start_ns - origin + 5_000_000, step.start_ns - origin + 9_000_000
    got = get_json(
        tb_url,
        "timeline",
        run="ddp_gpt_2rank",
        steps="5",
        worker="rank1",
        t0=t0,
        t1=t1,
        max_items=20000,
    )
    assert int(got["origin_ns"]) == origin
    assert got["events_in_window"] == _overlapping(step, origin + t0, origin + t1)
    ev = got["events"]
    assert got["resolution_ns"] == 0 and len(ev["row"]) == got["events_in_window"]
    starts = step.events["start_ns"][np.array(ev["row"])] - origin
    assert list(starts) == ev["start_ns"]
    names = [got["names"][i] for i in ev["name"]]
    assert names == list(step.string_values(step.events["name_id"][np.array(ev["row"])]))


def test_timeline_merges_small_events_into_boxes_to_stay_within_max_items(tb_url):
    got = get_json(
        tb_url, "timeline", run="fsdp_gpt_4rank", steps="4-6", worker="rank2", max_items=300
    )
    drawn = len(got["events"]["row"]) + len(got["summaries"]["track"])
    assert 0 < drawn <= 300 and got["resolution_ns"] > 0
    assert len(got["summaries"]["track"]) > 0
    merged = sum(got["summaries"]["count"]) + len(got["events"]["row"])
    assert merged == got["events_in_window"]
    assert [s["step"] for s in got["steps"]] == [4, 5, 6]


def test_timeline_answers_stay_under_two_megabytes(tb_url):
    for run, worker in (("fsdp_gpt_4rank", "rank0"), ("gpt_1gpu", "worker0")):
        status, body, _ = http_get(
            route_url(
                tb_url,
                "timeline",
                run=run,
                steps="4-6" if "fsdp" in run else "4-5",
                worker=worker,
                max_items=20000,
            )
        )
        assert status == 200 and len(body) <= 2_000_000


def test_timeline_search_keeps_only_matching_names(tb_url):
    got = get_json(tb_url, "timeline", run="gpt_1gpu", steps="4", q="nvjet", max_items=20000)
    names = {got["names"][i] for i in got["events"]["name"]}
    assert names and all("nvjet" in n.lower() for n in names)
    step = _run("gpt_1gpu").load_step("worker0", 4)
    all_names = step.string_values(step.events["name_id"])
    assert len(got["events"]["row"]) == sum("nvjet" in n.lower() for n in all_names)


def test_event_detail_names_the_event_and_its_launch(tb_url):
    run = _run("ddp_gpt_2rank")
    step = run.load_step("rank0", 5)
    kernel = int(
        np.flatnonzero((step.events["kind"] == KIND["kernel"]) & (step.events["launch"] >= 0))[0]
    )
    got = get_json(
        tb_url, "event", run="ddp_gpt_2rank", worker="rank0", step=5, steps=5, row=kernel
    )
    assert got["name"] == step.strings[step.events["name_id"][kernel]]
    assert got["kind"] == "kernel" and got["dur_ns"] == int(step.events["dur_ns"][kernel])
    launch = int(step.events["launch"][kernel])
    assert got["launched_by"]["row"] == launch
    assert got["launched_by"]["name"] == step.strings[step.events["name_id"][launch]]
    assert int(got["start_epoch_ns"]) == int(step.events["start_ns"][kernel])
    status, _, _ = http_get(
        route_url(tb_url, "event", run="ddp_gpt_2rank", worker="rank0", step=5, steps=5, row=10**7)
    )
    assert status == 404


@pytest.mark.parametrize("metric", ["busbw", "wait", "overlap", "count"])
def test_collective_heatmap_cells_are_the_table_values(tb_url, metric):
    got = get_json(tb_url, "collectives", run="fsdp_gpt_4rank", metric=metric)
    column = {
        "busbw": "busbw_median_gbps",
        "wait": "wait_median_ns",
        "overlap": "overlap_median_pct",
        "count": "n_kernels",
    }[metric]
    heat = got["heatmaps"]["type_size"]
    assert heat["value_column"] == column
    for r in rows(got["tables"]["type_size"]):
        i, j = heat["rows"].index(r["collective_type"]), heat["columns"].index(r["size_bucket"])
        assert (
            heat["z"][i][j] == pytest.approx(r[column])
            if r[column] is not None
            else heat["z"][i][j] is None
        )
    rank_step = got["heatmaps"]["rank_step"]
    rs_column = {
        "busbw": "busbw_gbps",
        "wait": "wait_ns",
        "overlap": "overlap_pct",
        "count": "n_kernels",
    }[metric]
    for r in rows(got["tables"]["rank_step"]):
        cell = rank_step["z"][rank_step["rows"].index(r["rank"])][
            rank_step["columns"].index(r["step"])
        ]
        assert cell == pytest.approx(r[rs_column])


def test_collectives_count_every_nccl_kernel_of_the_selection(tb_url):
    got = get_json(tb_url, "collectives", run="ddp_gpt_2rank", steps="4-6")
    run = _run("ddp_gpt_2rank")
    n = sum(int((s.events["kind"] == KIND["collective"]).sum()) for _, s in run.iter_steps())
    assert got["num_kernels"] == n
    assert sum(r["n_kernels"] for r in rows(got["tables"]["rank_step"])) == n


def test_memory_peak_is_the_highest_total_allocated_of_the_step_files(tb_url):
    got = get_json(tb_url, "memory", run="gpt_1gpu")
    peak = rows(got["tables"]["peaks"])[0]
    run = _run("gpt_1gpu")
    best = 0
    for _, step in run.iter_steps():
        total = step.attr("Total Allocated")
        dev_type = step.attr("Device Type").reindex(total.index)
        best = max(best, int(total[dev_type == 1].max()))
    assert peak["peak_allocated_bytes"] == best
    curves = got["tables"]["curves"]
    assert curves["total_rows"] == len(curves["data"][0])  # curves are never cut
    n_memory = sum(int((s.events["kind"] == KIND["memory"]).sum()) for _, s in run.iter_steps())
    assert curves["total_rows"] == n_memory


def test_memory_curves_have_level_of_detail_under_the_timelines_cap(tb_url):
    run = _run("fsdp_gpt_4rank")
    # Independent truth from the step files: the [memory] events and each worker's peak.
    n_memory, peaks = 0, {}
    for w, step in run.iter_steps():
        n_memory += int((step.events["kind"] == KIND["memory"]).sum())
        total = step.attr("Total Allocated")
        if len(total):
            peaks[w] = max(peaks.get(w, 0), int(total.max()))
    for max_items in (None, 200):
        params = {} if max_items is None else {"max_items": max_items}
        status, body, _ = http_get(route_url(tb_url, "memory", run="fsdp_gpt_4rank", **params))
        assert status == 200 and len(body) <= 2_000_000
        got = json.loads(body)
        curves = rows(got["tables"]["curves"])
        assert got["curve_rows"] == n_memory > len(curves)
        assert len(curves) <= (max_items or 5000)
        assert got["resolution_ns"] > 0
        for w, peak in peaks.items():  # every peak is drawn at its height
            assert max(r["allocated_bytes"] for r in curves if r["worker"] == w) == peak
    status, _, _ = http_get(route_url(tb_url, "memory", run="fsdp_gpt_4rank", max_items=2))
    assert status == 400


def _counter_kernel_names(run_name: str, worker: str) -> set[str]:
    """Names of the run's kernels that Nsight Compute counters were matched to, read from
    kernel_counters.pb and the step files (not through the analyses)."""
    from tessera_tb.trace.kernel_counters import load_kernel_counters

    run = _run(run_name)
    profile = load_kernel_counters(run.path, worker)
    names: set[str] = set()
    for s in run.steps:
        step = run.load_step(worker, s)
        rows_ = profile.row[(profile.row >= 0) & (profile.step == s)]
        names |= set(step.string_values(step.events["name_id"][rows_]))
    return names


def test_roofline_has_one_measured_point_per_kernel_with_counters(tb_url):
    got = get_json(tb_url, "roofline", run="gpt_1gpu")
    points = rows(got["tables"]["points"])
    measured = [p for p in points if p["measured"]]
    want = _counter_kernel_names("gpt_1gpu", "worker0")
    assert want and sorted(p["kernel_name"] for p in measured) == sorted(want)
    roofs = rows(got["tables"]["roofs"])
    assert {r["path"] for r in roofs if r["kind"] == "compute"} >= {"fp32", "tf32", "bf16", "fp8"}
    hbm = next(r for r in roofs if r["kind"] == "memory")
    assert hbm["bw_bytes_per_s"] == 4.8e12 and hbm["device"] == "H200 SXM"  # METRICS.md table


def test_roofline_derived_gemm_flops_are_two_m_n_k_of_its_shapes(tb_url):
    import json as jsonlib

    got = get_json(tb_url, "roofline", run="gpt_1gpu", group="op", steps="4")
    mm = [
        p
        for p in rows(got["tables"]["points"])
        if p["op_name"] == "aten::mm" and p["flops_source"] == "derived"
    ]
    assert mm
    for p in mm:
        (m, k), (k2, n) = jsonlib.loads(p["op_input_dims"])[:2]
        assert k == k2 and p["flops"] == 2 * m * n * k * p["count"]


def test_stalls_without_counters_say_how_to_collect_them(tb_url):
    got = get_json(tb_url, "stalls", run="ddp_gpt_2rank")
    assert got["available"] is False
    assert (
        got["collect_command"].startswith("tessera-prof counters ")
        and "smsp__inst_issued.sum" in got["collect_command"]
    )
    assert got["tables"]["reasons"]["total_rows"] == 0


def test_stall_category_shares_sum_their_reasons_and_to_100(tb_url):
    got = get_json(tb_url, "stalls", run="gpt_1gpu", group="kernel")
    assert got["available"] is True
    reasons = rows(got["tables"]["reasons"])
    cats = rows(got["tables"]["categories"])
    for c in cats[:12]:
        mine = [
            r
            for r in reasons
            if r["kernel_name"] == c["kernel_name"] and r["category"] == c["category"]
        ]
        assert c["share_pct"] == pytest.approx(sum(r["share_pct"] for r in mine))
    by_kernel: dict[str, float] = {}
    for c in cats:
        by_kernel[c["kernel_name"]] = by_kernel.get(c["kernel_name"], 0.0) + c["share_pct"]
    assert all(v == pytest.approx(100.0) for v in by_kernel.values())
    assert {r["kernel_name"] for r in reasons} <= _counter_kernel_names("gpt_1gpu", "worker0")


def test_chrome_trace_download_holds_exactly_the_events_of_the_window(tb_url):
    import json as jsonlib

    run = _run("ddp_gpt_2rank")
    step = run.load_step("rank0", 5)
    origin = min(
        next(e.start_ns for e in w.meta.steps if e.step == 5) for w in run.workers.values()
    )
    t0, t1 = 30_000_000, 34_000_000
    status, body, headers = http_get(
        route_url(tb_url, "trace", run="ddp_gpt_2rank", workers="rank0", steps=5, t0=t0, t1=t1)
    )
    assert status == 200
    assert headers["Content-Disposition"] == 'attachment; filename="ddp_gpt_2rank_step5.trace.json"'
    trace = jsonlib.loads(body)
    events = [e for e in trace["traceEvents"] if e["ph"] in ("X", "i") and e.get("cat") != "step"]
    assert len(events) == _overlapping(step, origin + t0, origin + t1) > 100
    base = trace["otherData"]["base_time_ns"]
    first = min(events, key=lambda e: e["ts"])
    s = step.events["start_ns"]
    assert round(first["ts"] * 1000) + base == int(
        s[(s + step.events["dur_ns"] > origin + t0)].min()
    )
