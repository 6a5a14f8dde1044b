"""The offline HTML report of each demo run renders every section with the run's numbers in
headless Chromium with the network cut off: no request leaves the file, no console error, and
names from traces stay text. Screenshots go to tests/plugin/screenshots/report_*.png."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from tessera_tb.backend import breakdown, topk
from tessera_tb.exporters.html_report import SECTIONS, write_report
from tessera_tb.trace.reader import open_run
from tests.conftest import DEMO_RUNS
from tests.plugin.conftest import (
    HOSTILE_KERNEL,
    HOSTILE_RUN,
    SCREENSHOTS,
    _rename_heaviest_kernel,
)

_NOISE = ("GPU stall due to ReadPixels",)


@pytest.fixture(scope="module")
def shots() -> str:
    os.makedirs(SCREENSHOTS, exist_ok=True)
    return SCREENSHOTS


@pytest.fixture(scope="module")
def offline_page(browser):
    """A page of a context that is offline and aborts (and records) every request that is
    not the report file itself."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    page = context.new_page()
    record = {"errors": [], "requests": [], "dialogs": []}

    def block(route):
        if not route.request.url.startswith("file://"):
            record["requests"].append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.route("**/*", block)
    page.on(
        "console",
        lambda m: (
            m.type == "error"
            and not any(n in m.text for n in _NOISE)
            and record["errors"].append(m.text)
        ),
    )
    page.on("pageerror", lambda e: record["errors"].append(str(e)))
    page.on("dialog", lambda d: (record["dialogs"].append(d.message), d.dismiss()))
    yield page, record
    context.close()


def _open(page, path: str) -> None:
    page.goto("file://" + path)
    page.wait_for_selector('body[data-tessera-ready="report"]', state="attached", timeout=60_000)


def _screenshot(page, path: str) -> None:
    height = page.evaluate("document.body.scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(height, 16000)})
    page.wait_for_timeout(300)  # plotly's responsive charts redraw
    page.screenshot(path=path)
    page.set_viewport_size({"width": 1400, "height": 1000})


def _plot(page, selector: str) -> list[dict]:
    return page.evaluate(
        "(sel) => document.querySelector(sel).data.map(t => ({name: t.name, y: t.y, z: t.z}))",
        selector,
    )


@pytest.mark.parametrize("run_name", ["gpt_1gpu", "ddp_gpt_2rank", "fsdp_gpt_4rank"])
def test_every_section_renders_the_run_with_no_network(run_name, offline_page, shots, tmp_path):
    page, record = offline_page
    run = open_run(os.path.join(DEMO_RUNS, run_name))
    path = str(tmp_path / f"{run_name}.html")
    write_report(run, path)
    _open(page, path)
    rendered = page.evaluate(
        "[...document.querySelectorAll('.view-body')]"
        ".map(b => [b.dataset.view, b.dataset.rendered])"
    )
    assert rendered == [[sid, "ok"] for sid, *_ in SECTIONS]
    # Overview: one stacked bar trace per category, each bar the analysis' ns for a step.
    bars = breakdown.step_time_breakdown(run)
    for trace in _plot(page, "#section-overview .breakdown-chart"):
        assert trace["y"] == pytest.approx(list(bars[f"{trace['name']}_ns"] / 1e6))
    # Kernels: the table's first row is the analysis' heaviest kernel.
    first = page.locator("#section-kernels table.data tbody tr").first
    top = topk.kernel_table(run, k=1)["name"].iloc[0]
    assert first.locator("td").first.text_content() == top
    # Roofline: roofs and points drawn; collectives: both heatmaps where NCCL ran.
    roof = _plot(page, "#section-roofline .roofline-chart")
    assert any(t["name"].startswith("HBM") for t in roof) and len(roof) > 3
    if run_name != "gpt_1gpu":
        for heat in ("heatmap-type-size", "heatmap-rank-step"):
            z = _plot(page, f"#section-collectives .{heat}")[0]["z"]
            assert any(v is not None for row in z for v in row)
    else:  # the only run with Nsight Compute counters: a stall chart
        stalls = _plot(page, "#section-stalls .stall-chart")
        assert {t["name"] for t in stalls} == {"memory", "dependency", "structural"}
        assert all(len(t["y"]) > 0 for t in stalls)
    assert page.locator(".main-svg").count() >= 6
    assert page.locator(".no-webgl").count() == 0
    _screenshot(page, os.path.join(shots, f"report_{run_name}.png"))
    assert record == {"errors": [], "requests": [], "dialogs": []}


def test_html_in_names_stays_text_in_the_report(offline_page, shots, tmp_path):
    page, record = offline_page
    run_dir = tmp_path / "hostile"
    shutil.copytree(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"), run_dir)
    _rename_heaviest_kernel(str(run_dir), HOSTILE_KERNEL)
    path = str(tmp_path / "hostile.html")
    write_report(open_run(str(run_dir)), path, name=HOSTILE_RUN + "</script><script>alert(3)")
    _open(page, path)
    assert page.title() == f"Tessera Profiler report: {HOSTILE_RUN}</script><script>alert(3)"
    cells = page.locator("#section-kernels table.data tbody tr td:first-child").all_text_contents()
    assert HOSTILE_KERNEL in cells
    assert page.locator("img").count() == 0
    assert page.locator("#section-kernels b").count() == 0
    _screenshot(page, os.path.join(shots, "report_hostile.png"))
    assert record == {"errors": [], "requests": [], "dialogs": []}


def test_a_finding_links_to_the_report_section_of_its_view(offline_page, tmp_path):
    """The unaligned-GEMM run's finding points at the kernels table; a finding shown on the
    timeline (not in the report) names the view and the window to look at."""
    page, record = offline_page
    planted = os.path.join(os.path.dirname(DEMO_RUNS), "tests", "data", "planted")
    path = str(tmp_path / "gemm.html")
    write_report(open_run(os.path.join(planted, "unaligned_gemm_problem")), path)
    _open(page, path)
    links = page.locator("#section-overview .findings a.finding-link")
    assert links.count() == 1
    assert links.first.get_attribute("href") == "#section-kernels"
    assert "cutlass_75" in links.first.get_attribute("title")
    path = str(tmp_path / "sync.html")
    write_report(open_run(os.path.join(planted, "item_sync_problem")), path)
    _open(page, path)
    texts = page.locator("#section-overview .findings .finding-link").all_inner_texts()
    # The host-sync finding zooms the timeline (not in the report) to its first syncs.
    assert any(
        re.fullmatch(r" see timeline \(\d+\.\d\d-\d+\.\d\d ms\) in TensorBoard", t) for t in texts
    )
    assert record["errors"] == [] and record["requests"] == []
