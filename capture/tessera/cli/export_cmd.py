"""Export a run on disk: OpenTelemetry spans and metrics (--otlp).

--otlp TARGET: an OTLP/HTTP receiver (http://host:4318; /v1/traces and /v1/metrics are
appended) or a file path (OTLP/JSON). Each step of each worker is one trace: the step span,
host events nested as in the timeline, device work linked to the call that launched it;
counters are gauge metrics. Needs pip install 'tessera-profiler[otlp]'.

Examples:
  tessera-prof export runs/exp1 --otlp http://localhost:4318
  tessera-prof export runs/exp1 --otlp trace.otlp.json --steps 3-4
"""

from __future__ import annotations

import argparse
import sys


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="run directory, bundle, URL or trace")
    p.add_argument(
        "--otlp", required=True, metavar="TARGET", help="http(s)://host:4318 or an OTLP/JSON file"
    )
    p.add_argument("--workers", help="comma-separated workers (default: all)")
    p.add_argument("--steps", help="steps, e.g. 3-4,9 (default: all)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="per request (default 10)")


def run(args: argparse.Namespace) -> int:
    from tessera_tb.importers.kineto_import import parse_steps
    from tessera_tb.trace.errors import TraceFormatError
    from tessera_tb.trace.open_trace import open_trace

    try:
        from tessera_tb.exporters.otlp import OtlpExportError, export_otlp

        trace = open_trace(args.run)
        workers = args.workers.split(",") if args.workers else None
        steps = sorted(parse_steps(args.steps)) if args.steps else None
        target = args.otlp
        is_url = target.startswith(("http://", "https://"))
        result = export_otlp(
            trace,
            endpoint=target if is_url else None,
            path=None if is_url else target,
            workers=workers,
            steps=steps,
            timeout_s=args.timeout_s,
        )
    except (TraceFormatError, OtlpExportError, ImportError, KeyError, ValueError) as exc:
        print(f"tessera-prof export: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"exported {result.traces} traces ({result.spans} spans) and {result.metric_points} "
        f"metric points of {trace.path} -> {result.target}"
    )
    return 0
