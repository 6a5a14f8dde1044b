"""Roofline, stalls and collectives in headless Chromium, matching the routes' numbers."""

from __future__ import annotations

from tests.plugin.conftest import get_json, plot_data, rows


def test_collective_heatmap_cells_match_the_collectives_table(tab, tb_url):
    tab.open(run="fsdp_gpt_4rank", view="collectives", metric="busbw")
    f = tab.frame
    heat = plot_data(f, ".heatmap-type-size")[0]
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


def test_roofline_plots_measured_and_derived_points_under_the_roofs(tab, tb_url):
    tab.open(run="gpt_1gpu", view="roofline")
    want = rows(get_json(tb_url, "roofline", run="gpt_1gpu")["tables"]["points"])
    placed = [
        p for p in want if (p["intensity_flops_per_byte"] or 0) > 0 and (p["flops_per_s"] or 0) > 0
    ]
    traces = plot_data(tab.frame, ".roofline-chart")
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
    traces = plot_data(f, ".stall-chart")
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
    assert command.startswith("tessera-prof counters ") and "smsp__inst_issued.sum" in command
    tab.screenshot("stalls_no_counters")
    tab.assert_clean()


def test_rank_step_heatmap_colours_the_difference_from_the_median(tab, tb_url):
    """A few percent of spread stays one colour band; the range is never under ±10%."""
    tab.open(run="fsdp_gpt_4rank", view="collectives", metric="busbw")
    f = tab.frame
    answer = get_json(tb_url, "collectives", run="fsdp_gpt_4rank", metric="busbw")
    raw = [v for row in answer["heatmaps"]["rank_step"]["z"] for v in row if v is not None]
    raw.sort()
    n = len(raw)
    median = raw[n // 2] if n % 2 else (raw[n // 2 - 1] + raw[n // 2]) / 2
    trace = f.evaluate(
        "() => { const t = document.querySelector('.heatmap-rank-step').data[0]; "
        "return {z: t.z, raw: t.customdata, zmin: t.zmin, zmax: t.zmax, zmid: t.zmid}; }"
    )
    assert trace["raw"] == answer["heatmaps"]["rank_step"]["z"]
    for zrow, rrow in zip(trace["z"], trace["raw"]):
        for z, r in zip(zrow, rrow):
            if r is not None:
                assert abs(z - 100 * (r - median) / median) < 1e-9
    spread = max(abs(100 * (v - median) / median) for v in raw)
    assert trace["zmid"] == 0
    assert trace["zmax"] == -trace["zmin"] == max(10, spread)
    tab.assert_clean()
