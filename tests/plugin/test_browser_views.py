"""Every view renders real data in headless Chromium, matching the routes' numbers."""

from __future__ import annotations

import os

from tessera_tb.backend import topk
from tessera_tb.trace.reader import open_run
from tests.conftest import DEMO_RUNS
from tests.plugin.conftest import canvas_has_ink, get_json, rows


def _plot_data(frame, selector: str):
    return frame.evaluate(
        "(sel) => document.querySelector(sel).data.map(t => ({type: t.type, name: t.name, "
        "x: t.x, y: t.y, z: t.z}))",
        selector,
    )


def test_overview_draws_the_breakdown_and_lists_findings(tab, tb_url):
    tab.open(run="ddp_gpt_2rank", view="overview")
    f = tab.frame
    want = get_json(tb_url, "overview", run="ddp_gpt_2rank")
    traces = _plot_data(f, ".breakdown-chart")
    assert [t["name"] for t in traces] == want["categories"]
    table = rows(want["tables"]["breakdown"])
    compute = next(t for t in traces if t["name"] == "compute")
    assert compute["y"] == [r["compute_ns"] / 1e6 for r in table]
    assert f.locator(".breakdown-chart .bars .point path").count() > 0
    titles = f.locator(".findings .finding .title").all_inner_texts()
    assert titles == [r["title"] for r in rows(want["tables"]["findings"])]
    tab.screenshot("overview")
    tab.assert_clean()


def test_single_worker_overview_shows_summary_cards(tab, tb_url):
    tab.open(run="gpt_1gpu", view="overview", steps="4-5")
    want = rows(get_json(tb_url, "overview", run="gpt_1gpu", steps="4-5")["tables"]["summary"])[0]
    busy = tab.frame.locator(".card-busy .value").inner_text()
    assert busy.startswith(f"{want['gpu_busy_pct']:.3f}".rstrip("0").rstrip(".")[:5])
    tab.assert_clean()


def test_operator_and_kernel_tables_equal_the_analysis_top_rows(tab):
    run = open_run(os.path.join(DEMO_RUNS, "fsdp_gpt_4rank"))
    tab.open(run="fsdp_gpt_4rank", view="operators", k=10)
    names = tab.frame.locator("table.topk-operators tbody tr td:first-child").all_inner_texts()
    assert names == list(topk.op_table(run, None, None, k=10)["name"])
    tab.screenshot("operators")
    tab.switch("kernels")
    names = tab.frame.locator("table.topk-kernels tbody tr td:first-child").all_inner_texts()
    assert names == list(topk.kernel_table(run, None, None, k=10)["name"])
    tab.frame.fill(".topk-search", "nccl")
    tab.frame.press(".topk-search", "Enter")
    tab.wait_ready("kernels")
    tab.frame.wait_for_function(
        "() => [...document.querySelectorAll('table.topk-kernels tbody tr td:first-child')]"
        ".every(td => td.textContent.toLowerCase().includes('nccl'))"
    )
    names = tab.frame.locator("table.topk-kernels tbody tr td:first-child").all_inner_texts()
    assert names == list(topk.kernel_table(run, None, None, k=10, search="nccl")["name"])
    tab.screenshot("kernels")
    tab.assert_clean()


def test_clicking_a_kernel_row_finds_it_on_the_timeline(tab):
    tab.open(run="gpt_1gpu", view="kernels", steps="4")
    first = tab.frame.locator("table.topk-kernels tbody tr").first
    name = first.locator("td").first.inner_text()
    first.click()
    tab.wait_ready("timeline")
    assert tab.frame.locator(".timeline-search").input_value() == name
    info = tab.frame.locator(".timeline-info").inner_text()
    assert "matching" in info
    tab.assert_clean()


def test_memory_view_draws_curves_and_the_peak(tab, tb_url):
    tab.open(run="gpt_1gpu", view="memory")
    want = get_json(tb_url, "memory", run="gpt_1gpu")
    peak = rows(want["tables"]["peaks"])[0]
    card = tab.frame.locator(".memory-peak").first.inner_text()
    assert peak["op"] in card
    traces = _plot_data(tab.frame, ".memory-chart")
    allocated = next(t for t in traces if t["name"].endswith("allocated"))
    assert max(allocated["y"]) == peak["peak_allocated_bytes"]
    assert tab.frame.locator("table.memory-allocations tbody tr").count() == min(
        500, want["tables"]["allocations"]["total_rows"]
    )
    tab.screenshot("memory")
    tab.assert_clean()


def test_collective_heatmap_cells_match_the_collectives_table(tab, tb_url):
    tab.open(run="fsdp_gpt_4rank", view="collectives", metric="busbw")
    f = tab.frame
    heat = _plot_data(f, ".heatmap-type-size")[0]
    header = f.locator("table.collectives-type-size thead th").all_inner_texts()
    body = [
        r.locator("td").all_inner_texts()
        for r in f.locator("table.collectives-type-size tbody tr").all()
    ]
    want = rows(get_json(tb_url, "collectives", run="fsdp_gpt_4rank")["tables"]["type_size"])
    assert len(body) == len(want)
    for shown, r in zip(body, want):
        assert shown[header.index("collective_type")] == r["collective_type"]
        i, j = heat["y"].index(r["collective_type"]), heat["x"].index(r["size_bucket"])
        assert heat["z"][i][j] == r["busbw_median_gbps"]
    assert (
        f.locator(".heatmap-type-size .hm").count()
        + f.locator(".heatmap-type-size canvas, .heatmap-type-size image").count()
        > 0
    )
    tab.screenshot("collectives")
    f.select_option(".metric-select", "wait")
    tab.wait_ready("collectives")
    f.wait_for_function(
        "() => document.querySelector('.heatmap-type-size') && "
        "document.querySelector('.heatmap-type-size').data[0].hovertemplate.includes('wait')"
    )
    tab.assert_clean()


def test_timeline_draws_ranks_side_by_side_and_shows_event_details(tab):
    tab.open(run="ddp_gpt_2rank", view="timeline", steps="5")
    f = tab.frame
    assert canvas_has_ink(f, "canvas.timeline-canvas")
    state = f.evaluate("window.__tesseraTimeline")
    assert state["items"] > 3000 and state["drawn"] > 0
    view = f.evaluate("[...window.__tesseraTimelineView.answers.keys()]")
    assert view == ["rank0", "rank1"]
    # Click the middle of the first drawn kernel of rank0's first stream.
    point = f.evaluate(
        """() => {
          const v = window.__tesseraTimelineView;
          for (let i = 0; i < v.n; i++) {
            const [w, type, j] = v.ref[i];
            const a = v.answers.get(w);
            if (type === 'e' && a.kinds[a.events.kind[j]] === 'kernel' && a.events.dur_ns[j] > 0) {
              const r = v.rows[v.row[i]];
              const x = (v.xOf(v.x0[i]) + v.xOf(v.x1[i])) / 2;
              return {x, y: r.y + r.h / 2, name: a.names[a.events.name[j]]};
            }
          }
        }"""
    )
    f.locator("canvas.timeline-canvas").click(position={"x": point["x"], "y": point["y"]})
    f.wait_for_selector(".timeline-details .detail-name")
    assert f.locator(".timeline-details .detail-name").inner_text() == point["name"]
    assert "launched by" in f.locator(".timeline-details").inner_text()
    tab.screenshot("timeline")
    tab.assert_clean()


def test_zooming_the_timeline_fetches_a_finer_window(tab):
    tab.open(run="fsdp_gpt_4rank", view="timeline", steps="4-6", workers="rank0", items=500)
    f = tab.frame
    before = f.evaluate("window.__tesseraTimelineView.answers.get('rank0').resolution_ns")
    assert before > 0  # 14k events in 500 items: merged boxes
    box = f.locator("canvas.timeline-canvas").bounding_box()
    f.locator("canvas.timeline-canvas").hover(position={"x": box["width"] * 0.6, "y": 60})
    for _ in range(8):
        tab.page.mouse.wheel(0, -400)
    f.wait_for_function("() => document.body.dataset.tesseraTimelineFetched")
    after = f.evaluate("window.__tesseraTimelineView.answers.get('rank0')")
    assert after["resolution_ns"] < before
    assert after["end_ns"] - after["start_ns"] < 0.5 * f.evaluate(
        "window.__tesseraTimelineView.extentNs"
    )
    assert "t.t0=" in tab.page.url and "t.t1=" in tab.page.url
    tab.screenshot("timeline_zoomed")
    tab.assert_clean()


def test_timeline_redraws_fifty_thousand_items_in_under_100_ms(tab):
    tab.open(run="fsdp_gpt_4rank", view="timeline", steps="4-6", items=20000)
    f = tab.frame
    items = f.evaluate("window.__tesseraTimeline.items")
    assert items >= 50_000
    durations = f.evaluate(
        """() => {
          const v = window.__tesseraTimelineView;
          performance.clearMeasures('tessera-timeline-redraw');
          for (let i = 0; i < 5; i++) v.redraw();
          return performance.getEntriesByName('tessera-timeline-redraw').map(m => m.duration);
        }"""
    )
    median = sorted(durations)[len(durations) // 2]
    print(f"\ntimeline redraw of {items} items: median {median:.1f} ms over {durations}")
    assert median < 100
    tab.screenshot("timeline_4ranks_3steps", height=2600)
    tab.assert_clean()


def test_roofline_plots_measured_and_derived_points_under_the_roofs(tab, tb_url):
    tab.open(run="gpt_1gpu", view="roofline")
    want = rows(get_json(tb_url, "roofline", run="gpt_1gpu")["tables"]["points"])
    placed = [
        p for p in want if (p["intensity_flops_per_byte"] or 0) > 0 and (p["flops_per_s"] or 0) > 0
    ]
    traces = _plot_data(tab.frame, ".roofline-chart")
    measured = next(t for t in traces if t["name"].startswith("measured"))
    derived = next(t for t in traces if t["name"].startswith("derived"))
    assert len(measured["x"]) == sum(p["measured"] for p in placed) > 0
    assert len(derived["x"]) == sum(not p["measured"] for p in placed)
    assert sorted(measured["y"]) == sorted(p["flops_per_s"] for p in placed if p["measured"])
    roofs = [t for t in traces if "TFLOP/s" in t["name"] or "TB/s" in t["name"]]
    assert len(roofs) >= 5
    hover = tab.frame.evaluate(
        "document.querySelector('.roofline-chart').data.find(t => t.name.startsWith('measured'))"
        ".hovertemplate"
    )
    assert "FLOPs" in hover and "efficiency" in hover
    tab.screenshot("roofline")
    tab.assert_clean()


def test_stalls_show_categories_and_drill_down_to_reasons(tab):
    tab.open(run="gpt_1gpu", view="stalls")
    f = tab.frame
    traces = _plot_data(f, ".stall-chart")
    assert [t["name"] for t in traces] == ["memory", "dependency", "structural"]
    first = f.locator(".drill-title").inner_text()
    f.locator(".stall-chart .bars .point path").last.click(force=True)  # through plotly
    f.wait_for_function(f"() => document.querySelector('.drill-title').textContent !== {first!r}")
    assert f.locator(".stall-reasons-chart .bars .point path").count() >= 10
    tab.screenshot("stalls")
    tab.assert_clean()


def test_stalls_without_counters_show_the_collect_command(tab):
    tab.open(run="ddp_gpt_2rank", view="stalls")
    command = tab.frame.locator("pre.collect-command").inner_text()
    assert command.startswith("ncu ") and "import-ncu" in command
    tab.screenshot("stalls_no_counters")
    tab.assert_clean()
