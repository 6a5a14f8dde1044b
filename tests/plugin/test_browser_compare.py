"""The plugin's Compare view in a real TensorBoard and headless Chromium: a bundle is a run of
the run selector, compared against a baseline directory run."""

from __future__ import annotations

import os
import shutil
import statistics

import pytest

from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import bundle
from tests.conftest import DEMO_RUNS
from tests.plugin.conftest import (
    SCREENSHOTS,
    Tab,
    plot_data,
    start_tensorboard,
    stop_tensorboard,
)


def _median_step_ms(run_dir: str) -> float:
    root = os.path.join(run_dir, "plugins", "tessera")
    spans = []
    for w in os.listdir(root):
        meta = pb.WorkerMeta.FromString(open(os.path.join(root, w, "meta.pb"), "rb").read())
        spans += [(e.end_ns - e.start_ns) / 1e6 for e in meta.steps]
    return statistics.median(spans)


@pytest.fixture(scope="module")
def tb_sharing(tmp_path_factory):
    """TensorBoard on a logdir with the DDP run, the FSDP run as a bundle only, and a bundle
    whose member escapes it."""
    root = tmp_path_factory.mktemp("compare_logdir")
    logdir = root / "logdir"
    os.makedirs(logdir)
    shutil.copytree(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"), logdir / "ddp_gpt_2rank")
    bundle.pack_run(os.path.join(DEMO_RUNS, "fsdp_gpt_4rank"), str(logdir / "fsdp.tessera.zip"))
    with open(logdir / "escape.tessera.zip", "wb") as f:
        f.write(b"PK\x05\x06" + bytes(18))  # an empty zip: no manifest
    proc, url = start_tensorboard(str(logdir), root / "tb.txt")
    try:
        yield url
    finally:
        stop_tensorboard(proc)


@pytest.fixture(scope="module")
def shots() -> str:
    os.makedirs(SCREENSHOTS, exist_ok=True)
    return SCREENSHOTS


def test_the_compare_view_shows_a_bundle_against_its_baseline(browser, tb_sharing, shots):
    tab = Tab(browser, tb_sharing, shots)
    try:
        tab.open(run="fsdp.tessera.zip", view="compare", baseline="ddp_gpt_2rank")
        f = tab.frame
        options = f.locator(".run-select option")
        texts = options.all_text_contents()
        assert "fsdp.tessera.zip" in texts and "escape.tessera.zip (unreadable)" in texts
        bad = options.nth(texts.index("escape.tessera.zip (unreadable)"))
        assert bad.is_disabled() and "has no tessera-bundle.json" in bad.get_attribute("title")
        a = _median_step_ms(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
        b = _median_step_ms(os.path.join(DEMO_RUNS, "fsdp_gpt_4rank"))
        assert f.locator(".card-a .value").text_content() == f"{a:.3f} ms"
        assert f.locator(".card-b .value").text_content() == f"{b:.3f} ms"
        delta = f.locator(".card-delta .value").text_content()
        assert delta.startswith(f"+{b - a:.3f} ms (+")
        assert f.locator(".card-delta .label").text_content() == "B is slower"
        changes = f.locator(".kernel_changes table.data tbody tr")
        rows = [r.split("\n")[0] for r in changes.all_inner_texts()]
        new = {r.split("\t")[1] for r in rows if r.startswith("new")}
        assert {
            "ncclDevKernel_AllGather_RING_LL",
            "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL",
            "ncclDevKernel_SendRecv",
            "ncclDevKernel_Broadcast_RING_LL",
        } <= new
        vanished = {r.split("\t")[1] for r in rows if r.startswith("vanished")}
        assert "ncclDevKernel_AllReduce_Sum_f32_RING_LL" in vanished
        bars = plot_data(f, ".compare-chart")
        assert [t["name"] for t in bars] == ["A: ddp_gpt_2rank", "B: fsdp.tessera.zip"]
        assert bars[0]["x"][0] == "step_time" and bars[0]["y"][0] == pytest.approx(a)
        tab.screenshot("compare_fsdp_bundle_vs_ddp")
        # The baseline selector: the bundle against itself changes nothing.
        f.select_option(".baseline-select", "fsdp.tessera.zip")
        tab.wait_ready("compare")
        assert f.locator(".card-delta .label").text_content() == "B is as fast"
        assert f.locator(".kernel_changes h3").text_content().endswith("(0)")
        tab.assert_clean()
    finally:
        tab.close()
