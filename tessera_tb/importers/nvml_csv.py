"""NVML sample CSVs (`nvml_<worker>.csv`) -> counter tracks aligned on epoch time.

Columns as the sampler writes them: t_ns (epoch ns, wall clock), power_w, temp_c, sm_mhz,
mem_mhz, gpu_util, mem_util, throttle (NVML clock-throttle-reason bitmask), mem_used (bytes).
Unknown extra columns become counters too, with no unit.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass

import numpy as np

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


def _number(text: str) -> float:
    """A cell as a number; NaN for an empty or non-numeric cell (a sample NVML missed)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def read_nvml_csv(path: str) -> NvmlSamples:
    """Read with the csv module rather than pandas: the importer loads no pandas at all."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceFormatError(path, f"not a readable NVML sample CSV ({exc})") from None
    if not rows:
        raise TraceFormatError(path, "not a readable NVML sample CSV (the file is empty)")
    header, body = rows[0], [r for r in rows[1:] if r]
    if "t_ns" not in header:
        raise TraceFormatError(path, "NVML sample CSV has no 't_ns' column (epoch ns)")
    for line, row in enumerate(body, start=2):
        if len(row) > len(header):
            raise TraceFormatError(
                path,
                f"not a readable NVML sample CSV (row {line} has {len(row)} fields, "
                f"the header {len(header)})",
            )
    width = len(header)
    cells = [row + [""] * (width - len(row)) for row in body]
    t_col = header.index("t_ns")
    ts_ns = np.zeros(len(cells), dtype=np.int64)
    for i, row in enumerate(cells):
        try:
            ts_ns[i] = int(row[t_col])
        except ValueError:
            t = _number(row[t_col])
            if not math.isfinite(t):
                raise TraceFormatError(path, f"'t_ns' is not numeric in row {i + 2}") from None
            ts_ns[i] = int(t)
    order = np.argsort(ts_ns, kind="stable")
    series = {}
    for j, col in enumerate(header):
        if j == t_col:
            continue
        values = np.array([_number(row[j]) for row in cells], dtype=np.float64)[order]
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
