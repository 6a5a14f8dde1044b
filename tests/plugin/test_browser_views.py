"""Overview, operator/kernel tables and memory render real data in headless Chromium."""

from __future__ import annotations

import os

from tessera_tb.backend import topk
from tessera_tb.trace.reader import open_run
from tests.conftest import DEMO_RUNS
from tests.plugin.conftest import get_json, plot_data, rows


def test_overview_draws_the_breakdown_and_lists_findings(tab, tb_url):
    tab.open(run="ddp_gpt_2rank", view="overview")
    f = tab.frame
    want = get_json(tb_url, "overview", run="ddp_gpt_2rank")
    traces = plot_data(f, ".breakdown-chart")
    assert [t["name"] for t in traces] == want["categories"]
    table = rows(want["tables"]["breakdown"])
    compute = next(t for t in traces if t["name"] == "compute")
    assert compute["y"] == [r["compute_ns"] / 1e6 for r in table]
    assert f.locator(".breakdown-chart .bars .point path").count() > 0
    titles = f.locator(".findings .finding .title").all_inner_texts()
    assert titles == [r["title"] for r in rows(want["tables"]["findings"])]
    tab.screenshot("overview")
    tab.assert_clean()


def test_a_findings_show_link_opens_its_view_and_selection(tab, tb_url):
    """The ddp run's tiny-kernel finding links to the operators table searched for the op
    that launches most of them, on the finding's worker and steps."""
    tab.open(run="ddp_gpt_2rank", view="overview")
    found = rows(get_json(tb_url, "overview", run="ddp_gpt_2rank")["tables"]["findings"])
    i, f = next((i, f) for i, f in enumerate(found) if f["kind"] == "tiny_kernels")
    op = f["numbers"]["items"][0]["op"]
    tab.frame.locator(".findings .finding").nth(i).locator("a.finding-link").click()
    tab.wait_ready("operators")
    assert tab.frame.locator(".topk-search").input_value() == op
    names = tab.frame.locator("table.topk-operators tbody tr td:first-child").all_inner_texts()
    assert names and all(op in n or n.startswith("(other") for n in names)
    hash_ = tab.page.evaluate("window.location.hash")
    assert f"t.workers={f['worker']}" in hash_ and "t.view=operators" in hash_
    assert "t.steps=4-6" in hash_
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
    traces = plot_data(tab.frame, ".memory-chart")
    allocated = next(t for t in traces if t["name"].endswith("allocated"))
    assert max(allocated["y"]) == peak["peak_allocated_bytes"]
    assert tab.frame.locator("table.memory-allocations tbody tr").count() == min(
        500, want["tables"]["allocations"]["total_rows"]
    )
    tab.screenshot("memory")
    tab.assert_clean()
