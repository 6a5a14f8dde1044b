"""Write a run's analyses as one self-contained HTML file, for people without TensorBoard:
overview (step time breakdown, GPU busy, findings), top-k operators and kernels, roofline,
stall breakdown, collective heatmaps and memory, drawn with the plugin's own views. The file
embeds plotly.js and needs no network.

RUN is a run directory, a bundle (*.tessera.zip), a run URL (s3://...) or a PyTorch profiler
/ Chrome trace JSON. By default the report shows every worker and the run's default step range
(every step of a run with at most 8, else 8 around the steady-state step).

Example:
  tessera-prof html demo_runs/ddp_gpt_2rank -o ddp_report.html --steps 5-6
"""

from __future__ import annotations

import argparse
import os
import sys

from tessera_tb.importers.kineto_import import parse_steps
from tessera_tb.trace import layout
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.open_trace import open_trace
from tessera_tb.trace.reader import Run, open_run


def open_run_argument(path: str) -> Run:
    """A run from a command-line argument: a bundle or a run URL (read in place), else what
    `open_trace` opens (a run directory or a trace JSON)."""
    if layout.is_url(path) or (path.endswith(".zip") and os.path.isfile(path)):
        return open_run(path)
    return open_trace(path)


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="run directory, bundle, run URL or trace JSON")
    p.add_argument("-o", "--output", required=True, help="HTML file to write")
    p.add_argument("--workers", help="comma-separated workers (default: all)")
    p.add_argument("--steps", help="steps, e.g. 5-6 (default: the run's default range)")
    p.add_argument("--title", help="run name shown in the report (default: the run's)")


def run(args: argparse.Namespace) -> int:
    try:
        trace = open_run_argument(args.run)
        workers = (
            [w.strip() for w in args.workers.split(",") if w.strip()] if args.workers else None
        )
        steps = sorted(parse_steps(args.steps)) if args.steps else None
        for w in workers or []:
            trace.worker(w)
        # plotly (inlined into the file) is loaded here, not by `diff`, which shares this
        # module's open_run_argument.
        try:
            from tessera_tb.exporters.html_report import write_report
        except ModuleNotFoundError as exc:
            raise ValueError(f"the HTML report needs {exc.name} (pip install plotly)") from None

        size = write_report(trace, args.output, workers, steps, name=args.title)
    except (TraceFormatError, KeyError, ValueError, OSError) as exc:
        print(f"tessera-prof html: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} ({size / 1e6:.1f} MB, self-contained)")
    return 0
