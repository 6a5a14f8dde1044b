"""The per-op summary: latency from the top-k analysis, FLOPs, bandwidth and efficiency from
the roofline analysis, as one table (`op_summary`) and as a CSV file (`export_summary_csv`).

Nothing is computed here that an analysis already defines: `backend.topk.op_table` gives
calls and host/device self and total times (METRICS.md, "Time"); `backend.roofline.roofline`
(group_by "op") gives FLOPs, DRAM bytes and the time at the roof (METRICS.md, "Roofline").
This module joins them per (op name, input dims) and sums over roofline rows.

Columns (one row per op name and input dims):

- name, input_dims (the "Input Dims" JSON text, "" when shapes were not recorded), calls;
- latency_mean_ns: mean time per call, device_total_mean_ns when the op launched device work,
  else host_total_mean_ns; latency_source says which ("device" / "host");
- host_self_ns, host_total_ns, device_self_ns, device_total_ns: sums over the selection;
- flops, dram_bytes: summed over the op's roofline rows that have them; flops_source and
  bytes_source as the roofline names them (measured / derived / ...), "; "-joined when mixed;
- kernel_ns: the device time the roofline used (the op's kernels);
- flops_per_s = flops / kernel time; dram_bytes_per_s = dram_bytes / kernel time;
- efficiency_pct = 100 x sum(time at roof) / sum(kernel time) over the rows with a roof
  (the roofline's efficiency, weighted by time);
- note: why FLOPs/bandwidth/efficiency are null (no roofline analysis, no device work, work
  launched by nested ops, no shapes, no counters).

Rows: the ops that own device work first (device_self_ns, descending), then host_self_ns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import pandas as pd

from tessera_tb.backend.topk import op_table
from tessera_tb.trace.atomic import write_bytes_atomic
from tessera_tb.trace.reader import Run

NO_DEVICE_WORK = (
    "no device work: FLOPs, bandwidth and efficiency are measured against GPU kernel time"
)
COLUMNS = [
    "name",
    "input_dims",
    "calls",
    "latency_mean_ns",
    "latency_source",
    "host_self_ns",
    "host_total_ns",
    "device_self_ns",
    "device_total_ns",
    "flops",
    "flops_source",
    "dram_bytes",
    "bytes_source",
    "kernel_ns",
    "flops_per_s",
    "dram_bytes_per_s",
    "efficiency_pct",
    "note",
]


def _roofline_by_op(
    run: Run, workers: Iterable[str] | None, steps: Iterable[int] | None
) -> tuple[pd.DataFrame | None, str]:
    """Roofline sums per (name, input_dims), or None and the reason."""
    try:
        from tessera_tb.backend.roofline import roofline
    except ImportError as exc:
        return None, f"no roofline analysis in this installation ({exc})"
    try:
        points = roofline(run, workers=workers, steps=steps, group_by="op")
    except Exception as exc:  # an analysis failure must not lose the latency table
        return None, f"roofline analysis failed ({type(exc).__name__}: {exc})"
    if points.empty:
        return None, NO_DEVICE_WORK
    p = points.rename(columns={"op_name": "name", "op_input_dims": "input_dims"})
    p["input_dims"] = p["input_dims"].fillna("").astype(str)
    known = p["flops"].notna() | p["dram_bytes"].notna()
    p["roof_ns"] = p["time_at_roof_ns"].where(p["time_at_roof_ns"].notna(), 0.0)
    p["roof_dur_ns"] = p["dur_ns"].where(p["time_at_roof_ns"].notna(), 0.0)
    p["flops_known"] = p["flops"].where(known)
    p["bytes_known"] = p["dram_bytes"].where(known)
    p["dur_known_ns"] = p["dur_ns"].where(known, 0.0)
    g = p.groupby(["name", "input_dims"], sort=False)
    out = pd.DataFrame(
        {
            "flops": g["flops_known"].sum(min_count=1),
            "dram_bytes": g["bytes_known"].sum(min_count=1),
            "kernel_ns": g["dur_ns"].sum(),
            "dur_known_ns": g["dur_known_ns"].sum(),
            "roof_ns": g["roof_ns"].sum(),
            "roof_dur_ns": g["roof_dur_ns"].sum(),
            "flops_source": g["flops_source"].agg(lambda s: "; ".join(sorted(set(s)))),
            "bytes_source": g["bytes_source"].agg(
                lambda s: "; ".join(sorted({v for v in s if isinstance(v, str) and v}))
            ),
        }
    ).reset_index()
    return out, ""


def op_summary(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> pd.DataFrame:
    """The per-op table described in the module docstring."""
    workers = list(workers) if workers is not None else None
    steps = list(steps) if steps is not None else None
    ops = op_table(run, workers, steps, by_input_dims=True, k=None)
    ops = ops[~ops["is_other"]].copy()
    device = ops["device_total_ns"] > 0
    ops["latency_mean_ns"] = np.where(
        device, ops["device_total_mean_ns"], ops["host_total_mean_ns"]
    )
    ops["latency_source"] = np.where(device, "device", "host")
    if ops["device_total_ns"].sum() == 0:
        roof, why = None, NO_DEVICE_WORK
    else:
        roof, why = _roofline_by_op(run, workers, steps)
    if roof is None:
        table = ops.assign(
            flops=np.nan, dram_bytes=np.nan, kernel_ns=np.nan, flops_per_s=np.nan,
            dram_bytes_per_s=np.nan, efficiency_pct=np.nan, flops_source="", bytes_source="",
            note=why,
        )  # fmt: skip
    else:
        table = ops.merge(roof, on=["name", "input_dims"], how="left")
        with np.errstate(divide="ignore", invalid="ignore"):
            sec = table["dur_known_ns"] / 1e9
            table["flops_per_s"] = (table["flops"] / sec).where(sec > 0)
            table["dram_bytes_per_s"] = (table["dram_bytes"] / sec).where(sec > 0)
            table["efficiency_pct"] = (100.0 * table["roof_ns"] / table["roof_dur_ns"]).where(
                table["roof_dur_ns"] > 0
            )
        table["flops_source"] = table["flops_source"].fillna("")
        table["bytes_source"] = table["bytes_source"].fillna("")
        no_kernels = table["kernel_ns"].isna()
        table["note"] = np.select(
            [
                no_kernels & (table["device_total_ns"] == 0),
                no_kernels,
                table["flops"].isna() & table["dram_bytes"].isna(),
            ],
            [
                "host-only op: no device work",
                "its device work is launched by nested ops; FLOPs are on their rows",
                "no FLOPs: no counters and no shape formula for this op "
                "(record_shapes=True, or tessera-prof import-ncu)",
            ],
            "",
        )
    # The ops that own device work first (where GPU time goes), then by host self time.
    table = table.sort_values(
        by=["device_self_ns", "host_self_ns"], ascending=False, ignore_index=True
    )
    return table[COLUMNS]


def export_summary_csv(
    run: Run,
    path: str,
    *,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
) -> str:
    """Write `op_summary` of the selection to `path` as CSV (atomically); returns the path."""
    table = op_summary(run, workers, steps)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_bytes_atomic(path, table.to_csv(index=False).encode())
    return path
