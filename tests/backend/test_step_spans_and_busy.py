"""Step spans and GPU busy % against a plain-Python computation from the JSON itself."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal

import pytest

from tessera_tb.backend.utilization import gpu_busy_pct_by_device
from tessera_tb.trace import open_run
from tests.conftest import shared_trace_files, trace_id

PYTORCH = [p for p in shared_trace_files() if "/pytorch/" in p]
DEVICE_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}


def _ns(us) -> int:
    return int((Decimal(us) * 1000).to_integral_value())


def _hand_spans_and_busy(path: str):
    """Steps by METRICS.md: tile; end = max(host end, end of device work launched in step)."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f, parse_float=Decimal)
    base = int(trace["baseTimeNanoseconds"])
    events = trace["traceEvents"]
    marks = sorted(
        (base + _ns(e["ts"]), base + _ns(e["ts"]) + _ns(e["dur"]), int(e["name"].split("#")[1]))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    launch_ts = {
        e["args"]["correlation"]: base + _ns(e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }

    def step_index(ts):
        idx = 0
        for i, (s, _, _) in enumerate(marks):
            if s <= ts:
                idx = i
        return idx

    work = []  # (step index, start, end)
    for e in events:
        if e.get("cat") in DEVICE_WORK:
            start = base + _ns(e["ts"])
            corr = e["args"].get("correlation")
            idx = step_index(launch_ts[corr] if corr in launch_ts else start)
            work.append((idx, start, start + _ns(e["dur"])))
    spans = []
    prev_end = None
    for i, (hs, he, num) in enumerate(marks):
        end = max([he] + [we for wi, _, we in work if wi == i])
        start = hs if prev_end is None else max(hs, prev_end)
        end = max(end, start)
        spans.append((num, start, end))
        prev_end = end
    busy = {}
    for num, start, end in spans:
        clipped = sorted(
            (max(s, start), min(e, end)) for _, s, e in work if min(e, end) > max(s, start)
        )
        total, cur_s, cur_e = 0, None, None
        for s, e in clipped:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            total += cur_e - cur_s
        busy[num] = 100.0 * total / (end - start)
    return spans, busy


@pytest.mark.parametrize("path", PYTORCH, ids=trace_id)
def test_step_spans_and_gpu_busy_match_a_hand_computation(path, imported_runs):
    spans, busy = _hand_spans_and_busy(path)
    run = open_run(imported_runs(path))
    got = [(s.step, s.start_ns, s.end_ns) for _, s in run.iter_steps()]
    assert got == spans
    for _, step in run.iter_steps():
        (pct,) = gpu_busy_pct_by_device(step).values()
        assert pct == pytest.approx(busy[step.step], abs=1e-9)
        assert 0 < pct <= 100
