"""Exporters run when a session ends: thin shells over `tessera_tb.exporters`.

Paths may hold `{rank}` and `{worker}`, so every rank of a torchrun job writes its own file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def expand_path(template: str, *, rank: int, worker: str) -> str:
    """`trace.{rank}.json` -> `trace.0.json` (only `{rank}` and `{worker}` are replaced)."""
    return os.fspath(template).replace("{rank}", str(rank)).replace("{worker}", worker)


@dataclass(frozen=True)
class ChromeExporter:
    """Writes the session's steps as one Chrome/Perfetto trace JSON file."""

    path: str

    def export(self, sess) -> str | None:
        from tessera_tb.exporters.chrome_trace import export_chrome_trace

        run = sess.run()
        if run is None or sess.worker not in run.workers:
            return None
        path = expand_path(self.path, rank=sess.rank, worker=sess.worker)
        steps = (run.load_step(sess.worker, s) for s in run.worker(sess.worker).steps)
        export_chrome_trace(steps, path, process_name=f"{sess.worker} (pid {os.getpid()})")
        return path


@dataclass(frozen=True)
class SummaryExporter:
    """Writes the per-op summary CSV of the session's steps."""

    path: str

    def export(self, sess) -> str | None:
        from tessera_tb.exporters.summary_csv import export_summary_csv

        run = sess.run()
        if run is None or sess.worker not in run.workers:
            return None
        path = expand_path(self.path, rank=sess.rank, worker=sess.worker)
        export_summary_csv(run, path, workers=[sess.worker])
        return path


@dataclass(frozen=True)
class OtlpExporter:
    """Sends the session's steps as OpenTelemetry spans and its counters as metrics to an
    OTLP/HTTP receiver, or writes them as OTLP/JSON (`tessera_tb.exporters.otlp`)."""

    endpoint: str | None = None
    path: str | None = None
    timeout_s: float = 10.0

    def export(self, sess) -> str | None:
        from tessera_tb.exporters.otlp import export_otlp

        run = sess.run()
        if run is None or sess.worker not in run.workers:
            return None
        path = None
        if self.path is not None:
            path = expand_path(self.path, rank=sess.rank, worker=sess.worker)
        result = export_otlp(
            run, endpoint=self.endpoint, path=path, workers=[sess.worker],
            timeout_s=self.timeout_s,
        )  # fmt: skip
        return result.target


def otlp(
    endpoint: str | None = None, *, path: str | None = None, timeout_s: float = 10.0
) -> OtlpExporter:
    """At session end, send steps (spans: one trace per step) and counters (metrics) to an
    OTLP/HTTP receiver (`endpoint="http://host:4318"`) or write OTLP/JSON to `path`.
    Needs `pip install 'tessera-profiler[otlp]'`. An unreachable receiver: one warning."""
    if (endpoint is None) == (path is None):
        raise ValueError("give one of endpoint= (http://host:4318) or path= (trace.otlp.json)")
    return OtlpExporter(endpoint, os.fspath(path) if path is not None else None, timeout_s)


def chrome(path: str) -> ChromeExporter:
    """Export the captured steps as Chrome/Perfetto trace JSON to `path` at session end."""
    return ChromeExporter(os.fspath(path))


def summary(path: str) -> SummaryExporter:
    """Export the per-op summary CSV (top-k analysis) to `path` at session end."""
    return SummaryExporter(os.fspath(path))
