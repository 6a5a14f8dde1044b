"""The timeline in headless Chromium: ranks side by side, details, zoom, redraw speed."""

from __future__ import annotations

from tests.plugin.conftest import canvas_has_ink


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
