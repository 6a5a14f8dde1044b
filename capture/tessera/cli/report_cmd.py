"""Print a run's analyses in the terminal: the same tables as the TensorBoard plugin.

RUN is a run directory or a PyTorch profiler / Chrome trace JSON. Sections: summary,
breakdown, findings, ops, kernels, roofline, stalls, collectives, memory (default: all that
have data).

Example:
  tessera-prof report demo_runs/ddp_gpt_2rank --steps 5-6 -k 10
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from tessera import analyze
from tessera_tb.backend import collectives as collectives_backend
from tessera_tb.importers.kineto_import import parse_steps
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.open_trace import open_trace

SECTIONS = (
    "summary",
    "breakdown",
    "findings",
    "ops",
    "kernels",
    "roofline",
    "stalls",
    "collectives",
    "memory",
)


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="run directory or trace JSON")
    p.add_argument(
        "--steps",
        help="steps to analyse, e.g. 5-6 (default per table: all steps, "
        "or the steady-state step for medians)",
    )
    p.add_argument("--workers", help="comma-separated workers, e.g. rank0,rank1")
    p.add_argument("-k", type=int, default=10, help="rows of the top-k tables (default 10)")
    p.add_argument("--arch", help="device for the roofline peaks, e.g. h100-sxm, h200, sm90")
    p.add_argument(
        "--section",
        action="append",
        choices=SECTIONS,
        help="print only these sections (repeatable)",
    )
    p.add_argument("--width", type=int, default=160, help="table width in characters")
    p.add_argument(
        "--dask",
        metavar="SCHEDULER",
        help="read the step files of the cross-rank analyses (collectives) on a Dask cluster, "
        "one task per rank: tcp://host:8786 or local:N (pip install 'tessera-profiler[dask]')",
    )


def _ms(ns: pd.Series) -> pd.Series:
    return (ns / 1e6).round(3)


def _print(title: str, table: pd.DataFrame, width: int, note: str = "") -> None:
    print(f"\n== {title}")
    if note:
        print(note)
    if table.empty:
        print("(no rows)")
        return
    with pd.option_context(
        "display.width", width, "display.max_columns", 30, "display.max_colwidth", 60
    ):
        print(table.to_string(index=False))


def _sections(run, args) -> dict:
    w = [x.strip() for x in args.workers.split(",")] if args.workers else None
    s = sorted(parse_steps(args.steps)) if args.steps else None
    k = args.k

    def summary():
        t = analyze.summary(run, workers=w, steps=s)
        return t[
            [
                "worker",
                "rank",
                "steps",
                "step_time_ms",
                "gpu_busy_pct",
                "tensor_core_time_pct_est",
                "est_occupancy_pct",
                "tensor_core_time_pct",
                "sm_occupancy_pct",
                "counter_coverage_pct",
            ]
        ].round(2), ""

    def breakdown():
        t = analyze.breakdown(run, workers=w, steps=s)
        cols = [c for c in t.columns if c.endswith("_pct")]
        out = t[["worker", "step"]].copy()
        out["span_ms"] = _ms(t["span_ns"])
        return pd.concat([out, t[cols].round(1)], axis=1), "(% of the step span)"

    def findings():
        t = analyze.findings(run, workers=w, steps=s)
        out = t[["worker", "severity", "win_ms_per_step", "title"]].round(2)
        out.insert(0, "n", range(1, len(out) + 1))
        # Deep links in full (a table column would cut them): the plugin's view and selection.
        links = "\n".join(f"  {i}. {link}" for i, link in enumerate(t["link"], 1))
        return out, "", f"where to look (TensorBoard tab, URL hash):\n{links}" if links else ""

    def ops():
        t = analyze.ops(run, k=k, workers=w, steps=s)
        out = t[["name", "calls"]].copy()
        for c in ("host_self_ns", "host_total_ns", "device_self_ns", "device_total_ns"):
            out[c.replace("_ns", "_ms")] = _ms(t[c])
        out["device_self_pct"] = t["device_self_pct"].round(1)
        return out, "(summed over the selected steps)"

    def kernels():
        t = analyze.kernels(run, k=k, workers=w, steps=s)
        out = t[["name", "kind", "calls"]].copy()
        out["name"] = out["name"].str.slice(0, 60)
        out["total_ms"] = _ms(t["total_dur_ns"])
        out["mean_us"] = (t["mean_dur_ns"] / 1e3).round(1)
        out["total_pct"] = t["total_pct"].round(1)
        out["top_op"] = t["top_op"]
        return out, ""

    def roofline():
        try:
            t = analyze.roofline(run, arch=args.arch, workers=w, steps=s)
        except ValueError as exc:
            if args.arch:  # a device the user named and we do not know: a usage error
                raise
            # A run without a GPU (CPU-only capture) has no device to draw roofs for; the
            # other sections still have something to say.
            return pd.DataFrame(), f"(no roofline: {exc})"
        t = t[t["flops_source"] != "none"].sort_values("headroom_ms", ascending=False).head(k)
        out = t[["kernel_name", "flops_source", "count"]].copy()
        out["kernel_name"] = out["kernel_name"].str.slice(0, 50)
        out["tflop_per_s"] = (t["flops_per_s"] / 1e12).round(1)
        out["flop_per_byte"] = t["intensity_flops_per_byte"].round(1)
        out["efficiency_pct"] = t["efficiency_pct"].round(1)
        out["headroom_ms"] = t["headroom_ms"].round(3)
        return out, f"(device {t.attrs.get('device', '?')}; dense peaks; by headroom)"

    def stalls():
        t = analyze.stalls(run, group_by="total", workers=w, steps=s)
        if not t.attrs.get("available", True):
            return t, (
                "no stall counters: "
                + t.attrs.get("note", "")
                + "\ncollect them with:\n  "
                + t.attrs.get("collect_command", "")
            )
        return t[["reason", "category", "share_pct", "cycles_per_issued_inst"]].round(2), (
            "(shares of stall warp-cycles, weighted by issued instructions)"
        )

    def collectives():
        a = collectives_backend.analyze_collectives(run, w, s, dask=args.dask)
        t = collectives_backend.collective_type_size_table(a)
        worst = collectives_backend.stragglers(None, analysis=a)
        worst = worst[worst["n_straggler"] > 0].head(3)
        out = t[["collective_type", "size_bucket", "n_instances", "busbw_median_gbps"]].copy()
        out["busbw_median_gbps"] = out["busbw_median_gbps"].round(1)
        out["wait_median_ms"] = _ms(t["wait_median_ns"])
        out["overlap_median_pct"] = t["overlap_median_pct"].round(1)
        note = "(busbw from transfer time, nccl-tests factors)"
        if len(worst):
            note += "\nstragglers: " + "; ".join(
                f"{r.worker} last in {r.n_straggler} of {r.n_instances} instances, "
                f"the others waited {r.others_wait_ns / 1e6:.1f} ms for it"
                for r in worst.itertuples()
            )
        return out, note

    def memory():
        t = analyze.memory(run, workers=w, steps=s)
        out = t[["worker", "device_id", "peak_step", "op"]].copy()
        out["peak_allocated_gb"] = (t["peak_allocated_bytes"] / 1e9).round(3)
        out["peak_reserved_gb"] = (t["peak_reserved_bytes"] / 1e9).round(3)
        return out, ""

    return {name: fn for name, fn in locals().items() if name in SECTIONS}


def run(args: argparse.Namespace) -> int:
    try:
        trace = open_trace(args.run)
        sections = _sections(trace, args)
        chosen = args.section or list(SECTIONS)
        print(f"run {trace.path}: workers {', '.join(sorted(trace.workers))}; steps {trace.steps}")
        for name in chosen:
            table, note, *footer = sections[name]()
            _print(name, table, args.width, note)
            if footer and footer[0]:
                print(footer[0])
    except (TraceFormatError, KeyError, ValueError) as exc:
        print(f"tessera-prof report: error: {exc}", file=sys.stderr)
        return 2
    return 0
