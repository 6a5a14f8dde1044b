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


def chrome(path: str) -> ChromeExporter:
    """Export the captured steps as Chrome/Perfetto trace JSON to `path` at session end."""
    return ChromeExporter(os.fspath(path))


def summary(path: str) -> SummaryExporter:
    """Export the per-op summary CSV (top-k analysis) to `path` at session end."""
    return SummaryExporter(os.fspath(path))
