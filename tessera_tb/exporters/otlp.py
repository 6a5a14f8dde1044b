"""Export a run as OpenTelemetry: spans over OTLP/HTTP, or an OTLP/JSON file.

Needs the OpenTelemetry SDK and its OTLP/HTTP exporter (`pip install
'tessera-profiler[otlp]'`: opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http).

What becomes what:

- each step of each worker is one trace: a root span `step N` (`tessera.step`,
  `tessera.worker`, `tessera.rank`, and the step's own span in `tessera.step_start_ns` /
  `tessera.step_end_ns`) from the step's start, or its first event's if earlier, to its end,
  or its last event's if later;
- host events (regions, CPU ops, annotations, runtime and driver calls, marks as zero-length
  spans) are spans nested as they nest in the timeline: per thread track, an event's parent
  is the innermost event that contains it (else the step span);
- device work (kernels, NCCL kernels, memcpys, memsets) are spans under the step span, with a
  link to the span of the runtime call that launched them (the `launch` column) and the
  attributes `tessera.stream`, `tessera.device`, `tessera.launch_op` (the launching call's
  parent op, when there is one);
- counters (NVML power, temperature, clocks, utilization; user counters) are gauge metrics
  with one data point per sample at its own time (`tessera.worker`, `tessera.device`
  attributes).

Every span carries `tessera.kind` (the event kind) and `tessera.category`. Times are the
events' epoch nanoseconds, unchanged.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tessera_tb.trace.step import KIND, KIND_NAMES, StepData

HOST_SPAN_KINDS = ("region", "cpu_op", "annotation", "runtime", "driver", "sync", "mark")
DEVICE_SPAN_KINDS = ("kernel", "collective", "memcpy", "memset")
BATCH = 2048  # spans per OTLP request


class OtlpExportError(RuntimeError):
    """The OTLP receiver could not be reached or refused the data (one line)."""


@dataclass
class OtlpResult:
    traces: int
    spans: int
    metric_points: int
    target: str


def _sdk():
    try:
        from opentelemetry import trace as otel_trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    except ImportError as exc:
        raise ImportError(
            f"OTLP export needs the OpenTelemetry SDK ({exc}); pip install 'tessera-profiler[otlp]'"
        ) from None
    return otel_trace, Resource, SpanProcessor, TracerProvider


def _host_parents(step: StepData, rows: np.ndarray) -> np.ndarray:
    """For each host row, the innermost host row on the same track that contains it (-1)."""
    ev = step.events
    start = ev["start_ns"][rows]
    end = start + ev["dur_ns"][rows]
    track = ev["track_id"][rows]
    order = np.lexsort((-end, start, track))
    parent = np.full(rows.size, -1, dtype=np.int64)
    stack: list[int] = []
    current_track = None
    for i in order.tolist():
        if track[i] != current_track:
            stack, current_track = [], track[i]
        while stack and not (start[i] >= start[stack[-1]] and end[i] <= end[stack[-1]]):
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def step_spans(tracer, otel_trace, step: StepData, *, worker: str, rank: int) -> int:
    """Emit one step's spans through `tracer`; returns how many."""
    ev = step.events
    kinds = ev["kind"]
    names = step.string_values(ev["name_id"]).tolist() if step.num_events else []
    cats = step.string_values(ev["cat_id"]).tolist() if step.num_events else []
    tracks = step.tracks
    # The root covers the step and every event in it (the first step of a trace also holds
    # what came before it): children lie inside their parent.
    root_start, root_end = int(step.start_ns), int(step.end_ns)
    if step.num_events:
        root_start = min(root_start, int(ev["start_ns"].min()))
        root_end = max(root_end, int((ev["start_ns"] + ev["dur_ns"]).max()))
    root = tracer.start_span(
        f"step {step.step}",
        context=otel_trace.set_span_in_context(otel_trace.INVALID_SPAN),
        start_time=root_start,
        attributes={
            "tessera.step": int(step.step), "tessera.worker": worker, "tessera.rank": rank,
            "tessera.step_start_ns": int(step.start_ns), "tessera.step_end_ns": int(step.end_ns),
        },
    )  # fmt: skip
    root_ctx = otel_trace.set_span_in_context(root)
    n = 1
    host_codes = [KIND[k] for k in HOST_SPAN_KINDS]
    host_rows = np.flatnonzero(np.isin(kinds, host_codes))
    parents = _host_parents(step, host_rows)
    spans: dict[int, object] = {}
    start = ev["start_ns"]
    dur = ev["dur_ns"]
    # Parents start no later than their children: opening in start order keeps that true.
    for i in np.lexsort((-(start[host_rows] + dur[host_rows]), start[host_rows])).tolist():
        row = int(host_rows[i])
        p = parents[i]
        ctx = root_ctx if p < 0 else otel_trace.set_span_in_context(spans[int(host_rows[p])])
        t = tracks[int(ev["track_id"][row])]
        span = tracer.start_span(
            names[row],
            context=ctx,
            start_time=int(start[row]),
            attributes={
                "tessera.kind": str(KIND_NAMES[kinds[row]]),
                "tessera.category": cats[row],
                "tessera.thread": str(t.tid),
                "tessera.pid": str(t.pid),
            },
        )
        spans[row] = span
    dev_codes = [KIND[k] for k in DEVICE_SPAN_KINDS]
    dev_rows = np.flatnonzero(np.isin(kinds, dev_codes))
    launch = ev["launch"]
    parent_col = ev["parent"]
    from opentelemetry.trace import Link

    device_spans = []
    for row in dev_rows.tolist():
        t = tracks[int(ev["track_id"][row])]
        attrs = {
            "tessera.kind": str(KIND_NAMES[kinds[row]]),
            "tessera.category": cats[row],
            "tessera.device": int(t.device),
            "tessera.stream": int(t.stream),
        }
        links = []
        lr = int(launch[row])
        if 0 <= lr < step.num_events and lr in spans:
            links.append(Link(spans[lr].get_span_context(), {"tessera.link": "launched_by"}))
            attrs["tessera.launch_call"] = names[lr]
            op = int(parent_col[lr])
            if op >= 0:
                attrs["tessera.launch_op"] = names[op]
        span = tracer.start_span(
            names[row], context=root_ctx, start_time=int(start[row]), links=links,
            attributes=attrs,
        )  # fmt: skip
        device_spans.append((row, span))
    for row, span in device_spans:
        span.end(end_time=int(start[row] + dur[row]))
    # End children before parents (reverse start order), the root last.
    for row in sorted(spans, key=lambda r: (int(start[r]), -int(dur[r])), reverse=True):
        spans[row].end(end_time=int(start[row] + dur[row]))
    n += len(spans) + len(device_spans)
    root.end(end_time=root_end)
    return n


def _metrics_data(resource, series: list[tuple[str, int, object]]):
    """SDK MetricsData: one gauge per counter name, a data point per sample."""
    from opentelemetry.sdk.metrics.export import (
        Gauge,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    by_name: dict[tuple[str, str], list] = {}
    for worker, _rank, c in series:
        ts = np.asarray(c.ts_ns, dtype=np.int64)
        values = np.asarray(c.values, dtype=np.float64)
        attrs = {"tessera.worker": worker, "tessera.device": int(c.device),
                 "tessera.source": c.source}  # fmt: skip
        points = by_name.setdefault((c.name, c.unit), [])
        for t, v in zip(ts.tolist(), values.tolist()):
            if np.isfinite(v):  # NaN: not measured, no point
                points.append(
                    NumberDataPoint(attributes=attrs, start_time_unix_nano=t, time_unix_nano=t,
                                    value=float(v))
                )  # fmt: skip
    metrics = [
        Metric(name=name, description="", unit=unit, data=Gauge(data_points=points))
        for (name, unit), points in by_name.items()
        if points
    ]
    scope = ScopeMetrics(scope=InstrumentationScope("tessera"), metrics=metrics, schema_url="")
    data = MetricsData(
        resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")]
    )
    return data, sum(len(m.data.data_points) for m in metrics)


def _hex_ids(obj):
    """OTLP/JSON writes trace and span ids as hex, not protobuf JSON's base64."""
    import base64

    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                out[k] = base64.b64decode(v).hex()
            else:
                out[k] = _hex_ids(v)
        return out
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj


def export_otlp(
    run,
    *,
    endpoint: str | None = None,
    path: str | None = None,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    timeout_s: float = 10.0,
) -> OtlpResult:
    """Send the run's steps (spans) and counters (metrics) to an OTLP/HTTP receiver at
    `endpoint` (`http://host:4318`; `/v1/traces` and `/v1/metrics` are appended), or write
    them as OTLP/JSON to `path` (`{"resourceSpans": ..., "resourceMetrics": ...}`).
    Raises OtlpExportError (one line) when the receiver cannot be reached or refuses."""
    if (endpoint is None) == (path is None):
        raise ValueError("give one of endpoint= (http://host:4318) or path= (trace.otlp.json)")
    otel_trace, Resource, SpanProcessor, TracerProvider = _sdk()
    from tessera_tb.backend.selection import resolve_steps, resolve_workers

    finished: list = []

    class Collect(SpanProcessor):
        def on_end(self, span) -> None:
            finished.append(span)

    resource = Resource.create({"service.name": "tessera", "tessera.run": os.fspath(run.path)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(Collect())
    tracer = provider.get_tracer("tessera")
    chosen = set(resolve_steps(run, steps))
    n_traces = n_spans = 0
    series = []
    for worker in resolve_workers(run, workers):
        info = run.worker(worker)
        rank = int(info.meta.rank)
        for s in (s for s in info.steps if s in chosen):
            step = run.load_step(worker, s)
            n_spans += step_spans(tracer, otel_trace, step, worker=worker, rank=rank)
            n_traces += 1
            series.extend((worker, rank, c) for c in step.counters)
    metrics, n_points = _metrics_data(resource, series)
    if path is not None:
        _write_json(path, finished, metrics)
        target = path
    else:
        _send(endpoint.rstrip("/"), finished, metrics, n_points, timeout_s)
        target = endpoint
    return OtlpResult(n_traces, n_spans, n_points, target)


def _write_json(path: str, spans: list, metrics) -> None:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from tessera_tb.trace.atomic import write_bytes_atomic

    doc = _hex_ids(MessageToDict(encode_spans(spans)))
    doc.update(_hex_ids(MessageToDict(encode_metrics(metrics))))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_bytes_atomic(path, json.dumps(doc).encode())


def _send(endpoint: str, spans: list, metrics, n_points: int, timeout_s: float) -> None:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult
    from opentelemetry.sdk.trace.export import SpanExportResult

    # The exporters log each failed attempt; the caller reports one line instead.
    quiet = [logging.getLogger(f"opentelemetry.exporter.otlp.proto.http{sub}")
             for sub in ("", ".trace_exporter", ".metric_exporter")]  # fmt: skip
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.CRITICAL + 1)
    try:
        exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=timeout_s)
        for i in range(0, len(spans), BATCH):
            if exporter.export(spans[i : i + BATCH]) != SpanExportResult.SUCCESS:
                raise OtlpExportError(f"{endpoint}: the OTLP receiver did not accept the spans")
        exporter.shutdown()
        if n_points:
            mexp = OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics", timeout=timeout_s)
            if mexp.export(metrics) != MetricExportResult.SUCCESS:
                raise OtlpExportError(f"{endpoint}: the OTLP receiver did not accept the metrics")
            mexp.shutdown()
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
