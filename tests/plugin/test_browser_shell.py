"""The tab in headless Chromium: selectors, run header, state in the URL, hostile names."""

from __future__ import annotations

import urllib.parse

from tests.plugin.conftest import HOSTILE_KERNEL, HOSTILE_RUN


def test_the_tab_opens_on_a_run_with_its_header_and_selectors(tab):
    tab.open(run="ddp_gpt_2rank", view="kernels")
    f = tab.frame
    assert f.locator(".run-select").input_value() == "ddp_gpt_2rank"
    assert f.locator(".worker-select option").all_inner_texts()[:3] == [
        "all workers (2)",
        "rank0 (rank 0)",
        "rank1 (rank 1)",
    ]
    assert f.locator(".step-from").input_value() == "4"
    assert f.locator(".step-to").input_value() == "6"
    header = f.locator(".run-header").inner_text()
    assert "2 × NVIDIA H200 (132 SMs" in header
    assert "SM 1980 MHz" in header
    assert "nccl 2.28.9" in header
    f.locator(".run-header details.missing summary").click()
    assert "recorded without with_stack=True" in f.locator(".run-header .missing").inner_text()
    tab.screenshot("shell_kernels")
    tab.assert_clean()


def test_selection_is_kept_in_the_page_url_so_a_link_reopens_it(tab):
    tab.open(run="fsdp_gpt_4rank", view="operators")
    tab.frame.select_option(".worker-select", "rank2")
    tab.wait_ready("operators")
    tab.frame.select_option(".step-from", "5")
    tab.wait_ready("operators")
    fragment = urllib.parse.unquote(tab.page.url.split("#", 1)[1])
    assert fragment.startswith("tessera&")
    assert "t.run=fsdp_gpt_4rank" in fragment and "t.workers=rank2" in fragment
    assert "t.steps=5-6" in fragment and "t.view=operators" in fragment
    url = tab.page.url
    tab.page.goto("about:blank")
    tab.page.goto(url)
    tab.frame = tab.page.wait_for_selector('iframe[src*="name=tessera"]').content_frame()
    tab.wait_ready("operators")
    assert tab.frame.locator(".worker-select").input_value() == "rank2"
    assert tab.frame.locator(".step-from").input_value() == "5"
    tab.assert_clean()


def test_html_in_run_and_kernel_names_is_shown_as_text_and_never_runs(tab):
    tab.open(run=HOSTILE_RUN, view="kernels")
    f = tab.frame
    options = f.locator(".run-select option").all_inner_texts()
    assert HOSTILE_RUN in options
    assert f.locator(".run-select").input_value() == HOSTILE_RUN
    names = f.locator("table.topk-kernels tbody tr td:first-child").all_inner_texts()
    assert HOSTILE_KERNEL in names
    assert f.locator("img").count() == 0 and f.locator("table b").count() == 0
    tab.screenshot("hostile_kernels")
    tab.assert_clean()  # no alert() dialog, no console error


def test_an_unreadable_run_is_shown_but_cannot_be_chosen(tab):
    tab.open(run="ddp_gpt_2rank", view="operators")
    option = tab.frame.locator('.run-select option[value="broken_run"]')
    assert option.inner_text() == "broken_run (unreadable)"
    assert option.is_disabled()
    tab.assert_clean()


def test_a_corrupt_step_is_named_above_the_view(tab):
    tab.open(run="corrupt_step", view="kernels")
    errors = tab.frame.locator(".errors .step-error").all_inner_texts()
    assert len(errors) == 1 and errors[0].startswith("worker0 step 5: corrupt step file")
    assert tab.frame.locator("table.topk-kernels tbody tr").count() > 1
    tab.screenshot("corrupt_step_kernels")
    tab.assert_clean()


PERFETTO_STUB = """<!doctype html><title>stub</title><script>
window.got = null;
window.addEventListener('message', e => {
  if (e.data === 'PING') { e.source.postMessage('PONG', '*'); return; }
  if (e.data && e.data.perfetto) {
    const text = new TextDecoder().decode(e.data.perfetto.buffer);
    document.title = 'got ' + JSON.parse(text).traceEvents.length;
  }
});
</script>"""


def test_open_in_perfetto_opens_a_new_tab_and_hands_it_the_window(tab):
    tab.context.route(
        "https://ui.perfetto.dev/**",
        lambda route: route.fulfill(status=200, content_type="text/html", body=PERFETTO_STUB),
    )
    tab.open(run="gpt_1gpu", view="timeline", steps="4")
    with tab.context.expect_page() as popup:
        tab.frame.click("button.open-perfetto")
    perfetto = popup.value
    assert perfetto.url.startswith("https://ui.perfetto.dev/")
    perfetto.wait_for_function("document.title.startsWith('got ')", timeout=30_000)
    assert int(perfetto.title().split()[1]) > 1000
    assert tab.page.url.startswith(tab.base_url)  # the TensorBoard page stays where it was
    perfetto.close()
    tab.assert_clean()


def test_the_tab_works_under_a_path_prefix_with_the_multiplexer_loader(
    browser, plugin_logdir, tmp_path
):
    from tests.plugin.conftest import SCREENSHOTS, Tab, start_tensorboard, stop_tensorboard

    proc, url = start_tensorboard(
        plugin_logdir, tmp_path / "tb.txt", "--load_fast=false", "--path_prefix=/pfx"
    )
    t = Tab(browser, url, SCREENSHOTS)
    try:
        assert url.endswith("/pfx")
        t.open(run="ddp_gpt_2rank", view="kernels")
        assert t.frame.locator("table.topk-kernels tbody tr").count() > 1
        t.assert_clean()
    finally:
        t.close()
        stop_tensorboard(proc)


def test_html_in_a_kernel_name_is_escaped_in_plotly_hover_text(tab):
    tab.open(run=HOSTILE_RUN, view="roofline")
    f = tab.frame
    hover = f.evaluate(
        "[].concat(...document.querySelector('.roofline-chart').data"
        ".filter(t => t.customdata).map(t => t.customdata.map(c => c[0])))"
    )
    assert "&lt;img src=x onerror=alert(2)&gt;&lt;b&gt;kernel&lt;/b&gt;" in hover
    # Hover the hostile point: plotly renders the escaped text, no element from the name.
    point = f.evaluate(
        """() => {
          const gd = document.querySelector('.roofline-chart');
          for (const [ti, t] of gd.data.entries()) {
            if (!t.customdata) continue;
            const i = t.customdata.findIndex(c => c[0].startsWith('&lt;img'));
            if (i >= 0) return {curve: ti, point: i};
          }
        }"""
    )
    f.evaluate(
        "(p) => Plotly.Fx.hover(document.querySelector('.roofline-chart'), "
        "[{curveNumber: p.curve, pointNumber: p.point}])",
        point,
    )
    f.wait_for_selector(".roofline-chart .hoverlayer .hovertext")
    text = f.locator(".roofline-chart .hoverlayer .hovertext").text_content()
    assert "<img src=x onerror=alert(2)><b>kernel</b>" in text
    assert f.locator("img").count() == 0
    tab.assert_clean()


def test_a_link_entered_into_the_open_tab_switches_view_and_run_without_a_reload(tab):
    tab.open(run="gpt_1gpu", view="overview")
    f = tab.frame
    f.evaluate("window.__sameDocument = true")  # gone if the frame reloads
    base = tab.page.url.split("#", 1)[0]
    # A teammate's link: same page, the hash names another view (a same-document navigation).
    tab.page.goto(f"{base}#tessera&t.run=gpt_1gpu&t.view=timeline")
    tab.wait_ready("timeline")
    assert f.locator("nav.views button.active").inner_text() == "Timeline"
    assert f.evaluate("window.__sameDocument") is True
    # Another run and view: the selectors and the header follow.
    tab.page.goto(f"{base}#tessera&t.run=ddp_gpt_2rank&t.view=kernels")
    tab.wait_ready("kernels")
    assert f.locator(".run-select").input_value() == "ddp_gpt_2rank"
    assert f.locator("nav.views button.active").inner_text() == "Kernels"
    f.wait_for_function(
        "document.querySelector('.run-header').innerText.includes('2 × NVIDIA H200')"
    )
    assert f.evaluate("window.__sameDocument") is True
    tab.assert_clean()
