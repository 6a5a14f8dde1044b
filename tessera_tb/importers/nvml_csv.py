"""NVML sample CSVs (`nvml_<worker>.csv`) -> counter tracks aligned on epoch time.

Columns as the sampler writes them: t_ns (epoch ns, wall clock), power_w, temp_c, sm_mhz,
mem_mhz, gpu_util, mem_util, throttle (NVML clock-throttle-reason bitmask), mem_used (bytes).
Unknown extra columns become counters too, with no unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.step import CounterSeries

# column -> (counter name, unit)
NVML_COLUMNS = {
    "power_w": ("power_w", "W"),
    "temp_c": ("temp_c", "C"),
    "sm_mhz": ("sm_clock_mhz", "MHz"),
    "mem_mhz": ("mem_clock_mhz", "MHz"),
    "gpu_util": ("gpu_util_pct", "%"),
    "mem_util": ("mem_util_pct", "%"),
    "throttle": ("throttle_reasons", "bitmask"),
    "mem_used": ("mem_used_bytes", "bytes"),
}


@dataclass
class NvmlSamples:
    path: str
    ts_ns: np.ndarray
    series: dict[str, tuple[str, np.ndarray]]  # counter name -> (unit, values)


def read_nvml_csv(path: str) -> NvmlSamples:
    try:
        df = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, f"not a readable NVML sample CSV ({exc})") from None
    if "t_ns" not in df.columns:
        raise TraceFormatError(path, "NVML sample CSV has no 't_ns' column (epoch ns)")
    ts = pd.to_numeric(df["t_ns"], errors="coerce")
    if ts.isna().any():
        raise TraceFormatError(path, f"'t_ns' is not numeric in row {int(ts.isna().idxmax()) + 2}")
    ts_ns = ts.to_numpy(dtype=np.int64)
    order = np.argsort(ts_ns, kind="stable")
    series = {}
    for col in df.columns:
        if col == "t_ns":
            continue
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)[order]
        name, unit = NVML_COLUMNS.get(col, (col, ""))
        series[name] = (unit, values)
    return NvmlSamples(path=path, ts_ns=ts_ns[order], series=series)


def counters_between(
    samples: NvmlSamples, lo_ns: int, hi_ns: int, device: int
) -> list[CounterSeries]:
    """The samples in [lo_ns, hi_ns) as counter tracks of `device`."""
    lo, hi = np.searchsorted(samples.ts_ns, [lo_ns, hi_ns])
    if hi <= lo:
        return []
    ts = samples.ts_ns[lo:hi]
    return [
        CounterSeries(name, unit, "nvml", device, ts, values[lo:hi])
        for name, (unit, values) in samples.series.items()
    ]
