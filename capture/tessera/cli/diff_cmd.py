"""Compare run B against a baseline run A: per-step medians of step time and its breakdown,
operators and kernels by the change of their self time, new and vanished kernels, and
collective bus bandwidth. Runs with different step counts or world sizes compare by medians
over their (worker, step) pairs (tessera_tb/backend/compare.py).

A and B are run directories, bundles, run URLs or trace JSONs. With --fail-if-slower PCT the
exit status is 1 when B's median step is more than PCT % slower than A's (a CI gate).

Example:
  tessera-prof diff runs/baseline runs/candidate --fail-if-slower 5
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from tessera.cli.html_cmd import open_run_argument
from tessera_tb.backend import compare
from tessera_tb.importers.kineto_import import parse_steps
from tessera_tb.trace.errors import TraceFormatError


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="baseline run")
    p.add_argument("b", metavar="B", help="run to compare against the baseline")
    p.add_argument(
        "--fail-if-slower",
        type=float,
        metavar="PCT",
        help="exit with status 1 when B's median step is more than PCT %% slower than A's",
    )
    for side in ("a", "b"):
        p.add_argument(f"--workers-{side}", help=f"comma-separated workers of {side.upper()}")
        p.add_argument(f"--steps-{side}", help=f"steps of {side.upper()}, e.g. 5-6")
    p.add_argument("-k", type=int, default=15, help="rows of the by-change tables (default 15)")
    p.add_argument("--width", type=int, default=160, help="table width in characters")


def _print(title: str, table: pd.DataFrame, width: int) -> None:
    print(f"\n== {title}")
    if table.empty:
        print("(none)")
        return
    with pd.option_context(
        "display.width", width, "display.max_columns", 30, "display.max_colwidth", 60
    ):
        print(table.to_string(index=False))


def _ms(ns: pd.Series) -> pd.Series:
    return (ns / 1e6).round(3)


def _side(path: str, workers: str | None, steps: str | None) -> compare.Side:
    run = open_run_argument(path)
    names = [w.strip() for w in workers.split(",") if w.strip()] if workers else None
    return compare.Side(run, names, sorted(parse_steps(steps)) if steps else None, label=path)


def run(args: argparse.Namespace) -> int:
    try:
        a = _side(args.a, args.workers_a, args.steps_a)
        b = _side(args.b, args.workers_b, args.steps_b)
        result = compare.compare_runs(a, b)
    except (TraceFormatError, KeyError, ValueError, OSError) as exc:
        print(f"tessera-prof diff: error: {exc}", file=sys.stderr)
        return 2
    k, width = args.k, args.width
    _print("runs (A = baseline)", result.runs, width)
    _print("per-step medians over (worker, step) pairs", result.step_medians.round(3), width)
    ops = result.op_deltas.head(k)
    out = ops[["name", "status"]].copy()
    for c in ("device_self_ns", "host_self_ns"):
        for side in ("a", "b", "delta"):
            out[f"{side}_{c[:-3]}_ms"] = _ms(ops[f"{side}_{c}"])
    _print(f"operators by change of self time per worker-step (top {k})", out, width)
    for title, table in (
        (f"kernels by change of time per worker-step (top {k})", result.kernel_deltas.head(k)),
        ("new and vanished kernels", result.kernel_changes),
    ):
        out = table[["status", "kernel", "op", "kind"]].copy()
        out["kernel"] = out["kernel"].str.slice(0, 60)
        for side in ("a", "b", "delta"):
            out[f"{side}_ms"] = _ms(table[f"{side}_total_dur_ns"])
        _print(title, out, width)
    col = result.collective_deltas.drop(columns="size_bucket_lo_bytes").round(1)
    _print("collectives: median bus bandwidth (GB/s) by type and size", col, width)
    slower = result.slowdown_pct
    medians = result.step_medians.set_index("figure")
    verdict = f"{abs(slower):.2f}% {'slower' if slower > 0 else 'faster'}" if slower else "as fast"
    print(
        f"\nmedian step: A {medians.loc['step_time_ms', 'a']:.3f} ms, B "
        f"{medians.loc['step_time_ms', 'b']:.3f} ms: B is {verdict}"
    )
    if args.fail_if_slower is not None and slower > args.fail_if_slower:
        print(
            f"tessera-prof diff: B is {slower:.2f}% slower than A, over the "
            f"{args.fail_if_slower:g}% allowed",
            file=sys.stderr,
        )
        return 1
    return 0
