"""`sess.report()`: the per-op table (latency, FLOPs, bandwidth, efficiency), printed.

The table is `tessera_tb.exporters.summary_csv.op_summary` (latency from the top-k analysis,
FLOPs/bandwidth/efficiency from the roofline analysis); this module only formats it.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd


def op_report(run, workers: Iterable[str] | None = None) -> pd.DataFrame:
    """The per-op table of a run (empty, with its columns, when nothing was written)."""
    from tessera_tb.exporters.summary_csv import COLUMNS, op_summary

    if run is None:
        return pd.DataFrame({c: [] for c in COLUMNS})
    return op_summary(run, workers)


def format_report(table: pd.DataFrame, rows: int = 20) -> str:
    """A fixed-width text table of the heaviest ops, units in the headers."""
    if table.empty:
        return "tessera: no profiled steps were written, so there is no op table"
    t = table.head(rows)
    shown = pd.DataFrame(
        {
            "op": [_cut(n, 44) for n in t["name"]],
            "input_dims": [_cut(d, 28) for d in t["input_dims"]],
            "calls": t["calls"],
            "latency_us": t["latency_mean_ns"] / 1e3,
            "on": t["latency_source"],
            "GFLOP": t["flops"] / 1e9,
            "TFLOP/s": t["flops_per_s"] / 1e12,
            "GB/s": t["dram_bytes_per_s"] / 1e9,
            "eff_%": t["efficiency_pct"],
        }
    )
    text = shown.to_string(index=False, float_format=lambda v: f"{v:.3g}", na_rep="-")
    notes = sorted({n for n in table["note"] if n})
    if notes:
        text += "\nwhere a column shows '-':\n" + "\n".join(f"  {n}" for n in notes)
    return text


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def print_report(table: pd.DataFrame, rows: int = 20) -> None:
    print(format_report(table, rows))
