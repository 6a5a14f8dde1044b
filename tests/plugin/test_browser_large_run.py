"""A 64-rank run (bench/synth_ranks.py, rank 37 the straggler) in headless Chromium: the
overview says which ranks it read, draws every rank's step time and names the straggler; the
collectives view says it answers from the derived index; the timeline says it is capped."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tessera_tb.importers.kineto_import import import_traces
from tests.conftest import ROOT
from tests.plugin.conftest import SCREENSHOTS, Tab, get_json, start_tensorboard, stop_tensorboard

STRAGGLER = 37


@pytest.fixture(scope="module")
def large_tb(tmp_path_factory):
    traces = tmp_path_factory.mktemp("synth") / "t"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "synth_ranks.py"), "64", str(traces)]
        + ["--stragglers", str(STRAGGLER)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    logdir = tmp_path_factory.mktemp("large_logdir")
    import_traces([str(traces)], str(logdir), "r64", jobs=2)
    errlog = tmp_path_factory.mktemp("tb_large") / "stderr.txt"
    tb, url = start_tensorboard(str(logdir), errlog)
    try:
        yield url
    finally:
        stop_tensorboard(tb)


@pytest.fixture(scope="module")
def large_tab(browser, large_tb):
    t = Tab(browser, large_tb, SCREENSHOTS)
    yield t
    t.close()


def test_a_64_rank_run_opens_capped_with_its_straggler_named(large_tab, large_tb):
    large_tab.open(run="r64", view="overview")
    f = large_tab.frame
    want = get_json(large_tb, "overview", run="r64")
    assert f.locator(".overview-capped").inner_text() == want["capped"]["note"]
    assert "4 of the 64 selected ranks" in want["capped"]["note"]
    assert f"rank{STRAGGLER}" in want["capped"]["shown"]
    heat = f.locator(".heatmap-step-time .main-svg").count()
    assert heat > 0
    titles = f.locator(".findings .finding .title").all_inner_texts()
    straggler = [t for t in titles if t.startswith(f"rank{STRAGGLER} arrives last at 100%")]
    assert len(straggler) == 1 and "ms per step for it" in straggler[0]
    large_tab.screenshot("overview_64_ranks")
    large_tab.switch("collectives")
    note = f.locator(".collectives-index").inner_text()
    assert "instances matched over all 64 ranks" in note
    first_straggler = f.locator("table.data").nth(1).locator("tbody tr td").first.inner_text()
    assert first_straggler == f"rank{STRAGGLER}"
    large_tab.switch("timeline")
    assert "first 16 of the 64 selected ranks" in f.locator(".timeline-capped").inner_text()
    large_tab.assert_clean()
