"""OTLP export: spans and metrics sent to a local OTLP/HTTP receiver, decoded with
`opentelemetry-proto`, checked against the run they came from."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402

from tessera import profile  # noqa: E402
from tessera_tb.exporters.otlp import DEVICE_SPAN_KINDS, HOST_SPAN_KINDS, export_otlp  # noqa: E402
from tessera_tb.trace import open_run  # noqa: E402
from tessera_tb.trace.step import KIND  # noqa: E402
from tests.conftest import DEMO_RUNS, ROOT  # noqa: E402

DDP = os.path.join(DEMO_RUNS, "ddp_gpt_2rank")


class Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1: decodes each POST with opentelemetry-proto."""

    def __init__(self):
        self.spans: list = []  # (resource attrs, span)
        self.points: list = []  # (metric name, unit, data point)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    for rs in req.resource_spans:
                        for ss in rs.scope_spans:
                            receiver.spans.extend(ss.spans)
                    reply = trace_service_pb2.ExportTraceServiceResponse()
                elif self.path == "/v1/metrics":
                    req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    for rm in req.resource_metrics:
                        for sm in rm.scope_metrics:
                            for m in sm.metrics:
                                receiver.points.extend(
                                    (m.name, m.unit, p) for p in m.gauge.data_points
                                )
                    reply = metrics_service_pb2.ExportMetricsServiceResponse()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_a_run_on_disk_as_spans_and_metrics(receiver):
    run = open_run(DDP)
    step_num = run.steps[0]
    result = export_otlp(run, endpoint=receiver.endpoint, workers=["rank0"], steps=[step_num])
    step = run.load_step("rank0", step_num)
    kinds = step.events["kind"]
    n_host = int(np.isin(kinds, [KIND[k] for k in HOST_SPAN_KINDS]).sum())
    n_dev = int(np.isin(kinds, [KIND[k] for k in DEVICE_SPAN_KINDS]).sum())
    spans = receiver.spans
    assert result.traces == 1 and result.spans == len(spans) == 1 + n_host + n_dev
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == 1 and roots[0].name == f"step {step_num}"
    ev = step.events
    assert (roots[0].start_time_unix_nano, roots[0].end_time_unix_nano) == (
        min(step.start_ns, int(ev["start_ns"].min())),
        max(step.end_ns, int((ev["start_ns"] + ev["dur_ns"]).max())),
    )
    assert _attrs(roots[0]) == {
        "tessera.step": step_num, "tessera.worker": "rank0", "tessera.rank": 0,
        "tessera.step_start_ns": step.start_ns, "tessera.step_end_ns": step.end_ns,
    }  # fmt: skip
    assert len({s.trace_id for s in spans}) == 1
    by_id = {s.span_id: s for s in spans}
    # Nesting: every child lies inside its parent, on the same thread for host spans.
    for s in spans:
        if s.parent_span_id:
            p = by_id[s.parent_span_id]
            assert p.start_time_unix_nano <= s.start_time_unix_nano
            assert s.end_time_unix_nano <= p.end_time_unix_nano
            if p.parent_span_id:
                assert _attrs(p)["tessera.thread"] == _attrs(s)["tessera.thread"]
    names = step.string_values(ev["name_id"])
    kernels = [s for s in spans if _attrs(s).get("tessera.kind") == "kernel"]
    assert len(kernels) == int((kinds == KIND["kernel"]).sum())
    linked = [k for k in kernels if k.links]
    assert len(linked) > 0.9 * len(kernels)
    for k in linked:
        launcher = by_id[k.links[0].span_id]
        assert _attrs(launcher)["tessera.kind"] in ("runtime", "driver")
        assert launcher.start_time_unix_nano <= k.start_time_unix_nano
        assert _attrs(k)["tessera.launch_call"] == launcher.name
    # Attribute values against the run: a kernel's stream and device from its track.
    row = int(np.flatnonzero(kinds == KIND["kernel"])[0])
    t = step.tracks[int(ev["track_id"][row])]
    first = min(kernels, key=lambda s: (s.start_time_unix_nano, s.name))
    same = [k for k in kernels if k.start_time_unix_nano == int(ev["start_ns"][row])
            and k.name == names[row]]  # fmt: skip
    assert same and _attrs(same[0])["tessera.stream"] == t.stream
    assert _attrs(first)["tessera.device"] == t.device
    # Metrics: one point per finite NVML sample of the step.
    expected = collections.Counter()
    for c in step.counters:
        expected[c.name] += int(np.isfinite(np.asarray(c.values, dtype=float)).sum())
    got = collections.Counter(name for name, _u, _p in receiver.points)
    assert got == +expected and result.metric_points == sum(expected.values())
    power = [c for c in step.counters if c.name == "power_w"][0]
    pts = sorted((p.time_unix_nano, p.as_double) for n, _u, p in receiver.points if n == "power_w")
    want = sorted((int(t), float(v)) for t, v in zip(power.ts_ns, power.values) if np.isfinite(v))
    assert pts == want


def test_a_session_sends_one_trace_per_step(receiver, tmp_path):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    with profile.session(
        activities=["cpu"],
        exporters=[profile.otlp(endpoint=receiver.endpoint)],
        tensorboard_dir=str(tmp_path / "run"),
    ) as sess:
        for i in range(6):
            with profile.region(f"iteration{i}"):
                model(x).square().mean().backward()
            opt.step()  # ends the step (no sess.step() calls)
            opt.zero_grad()
    assert sess.steps_written == [2, 3, 4]
    roots = [s for s in receiver.spans if not s.parent_span_id]
    assert sorted(s.name for s in roots) == ["step 2", "step 3", "step 4"]
    assert len({s.trace_id for s in receiver.spans}) == 3
    by_id = {s.span_id: s for s in receiver.spans}
    regions = [s for s in receiver.spans if _attrs(s).get("tessera.kind") == "region"]
    assert sorted(s.name for s in regions) == ["iteration2", "iteration3", "iteration4"]
    for r in regions:  # the region's ops are nested under it
        kids = [s for s in receiver.spans if s.parent_span_id == r.span_id]
        assert any(k.name == "aten::linear" for k in kids)
        # Inside torch's step marker, which is inside the step span.
        marker = by_id[r.parent_span_id]
        assert marker.name.startswith("ProfilerStep#")
        assert by_id[marker.parent_span_id].parent_span_id == b""


def test_an_unreachable_endpoint_is_one_warning_and_training_goes_on(tmp_path, tiny_model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile.session(
            activities=["cpu"],
            exporters=[profile.otlp(endpoint="http://127.0.0.1:9", timeout_s=2)],
            tensorboard_dir=str(tmp_path / "run"),
        ) as sess:
            for _ in range(6):
                tiny_model()
    ours = [w for w in caught if w.category is profile.TesseraWarning]
    assert len(ours) == 1 and "127.0.0.1:9" in str(ours[0].message)
    assert sess.steps_written == [2, 3, 4]


def test_export_cli_to_a_receiver_and_to_a_file(receiver, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "export", DDP, "--otlp", receiver.endpoint,
         "--workers", "rank1", "--steps", "5"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("exported 1 traces")
    assert {s.name for s in receiver.spans if not s.parent_span_id} == {"step 5"}
    path = tmp_path / "trace.otlp.json"
    out = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "export", DDP, "--otlp", str(path),
         "--workers", "rank1", "--steps", "5"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(path.read_text())
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == len(receiver.spans)
    assert all(len(s["traceId"]) == 32 and len(s["spanId"]) == 16 for s in spans)
    bad = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "export", DDP, "--otlp", "http://127.0.0.1:9",
         "--steps", "5", "--timeout-s", "1"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
