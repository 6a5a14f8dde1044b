"""Read Nsight Compute raw-page CSVs and turn them into kernel counter profiles.

Input: `ncu --import REPORT.ncu-rep --csv --page raw` (or `ncu --csv --page raw ...`): row 1
holds the metric names, row 2 their units, then one row per profiled kernel launch. Numbers may
have thousands separators ("65,536"); units differ per column ("us", "Mbyte", "Tbyte/s", "Ghz").

Units (METRICS.md, "Roofline"): values are scaled by the unit row only for byte, second, Hz and
byte/s units, with decimal SI prefixes (Mbyte = 1e6 bytes), to `byte`, `s`, `Hz` and `byte/s`;
every other unit string ("%", "inst", "cycle", "Kbyte/block", "sector/ns", ...) is a label and
the value stays as written. "n/a", "no data" and empty cells are null (NaN), never 0.

`counter_profile(table)` maps the table onto the portable kernel counters of METRICS.md
("Kernel counters") plus the raw metrics the roofline, stall and divergence analyses read;
a metric the CSV lacks is all-NaN with a capability `unavailable:<why>`.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.kernel_counters import (
    METHOD_COUNTER_ONLY,
    CounterMetric,
    CounterProfile,
    MatchReport,
)

SOURCE_FORMAT = "ncu-csv-raw"
KERNEL_NAME = "Kernel Name"
_NULL_CELLS = frozenset({"", "n/a", "no data", "nan"})

# Decimal SI prefixes and time units of the unit row.
_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_SECONDS = {
    "ns": 1e-9,
    "nsecond": 1e-9,
    "us": 1e-6,
    "usecond": 1e-6,
    "ms": 1e-3,
    "msecond": 1e-3,
    "s": 1.0,
    "second": 1.0,
}
_BYTE = re.compile(r"^([KkMGTP]?)bytes?$")
_BYTE_RATE = re.compile(r"^([KkMGTP]?)bytes?/(\w+)$")
_HERTZ = re.compile(r"^([KkMGTP]?)hz$", re.IGNORECASE)


def normalise_unit(unit: str, metric: str = "") -> tuple[float, str]:
    """(scale, unit): value x scale is in the returned unit (`byte`, `s`, `Hz`, `byte/s`).

    Any other unit is a label: scale 1, unit unchanged. ncu labels some `.per_second` byte
    metrics with a plain byte unit ("Tbyte"); those are scaled by the same prefix and named
    `byte/s`, so the value is the rate the metric name says it is.
    """
    u = unit.strip()
    m = _BYTE.match(u)
    if m:
        return _PREFIX[m.group(1)], "byte/s" if metric.endswith(".per_second") else "byte"
    m = _BYTE_RATE.match(u)
    if m and m.group(2) in _SECONDS:
        return _PREFIX[m.group(1)] / _SECONDS[m.group(2)], "byte/s"
    if u in _SECONDS:
        return _SECONDS[u], "s"
    m = _HERTZ.match(u)
    if m:
        return _PREFIX[m.group(1)], "Hz"
    return 1.0, u


@dataclass
class NcuTable:
    """A raw-page CSV: numeric columns in normalised units, text columns verbatim."""

    path: str
    kernel_names: np.ndarray  # object, one per profiled kernel
    ids: np.ndarray  # int64: the "ID" column (launch order in the profiled process)
    values: dict[str, np.ndarray]  # metric -> float64 (NaN = null), normalised units
    units: dict[str, str]  # metric -> normalised unit
    source_units: dict[str, str]  # metric -> unit row text
    text: dict[str, np.ndarray]  # non-numeric column -> object array (None = null)
    notes: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return int(self.ids.size)

    def get(self, metric: str) -> np.ndarray | None:
        return self.values.get(metric)


def read_ncu_csv(path: str) -> NcuTable:
    """Parse a raw-page CSV. Raises TraceFormatError naming the file on anything else."""
    rows = _read_rows(path)
    header, unit_row, data = rows[0], rows[1], rows[2:]
    ncols = len(header)
    if len(set(header)) != ncols:
        dupes = sorted({h for h in header if header.count(h) > 1})
        raise TraceFormatError(path, f"repeated column names {dupes[:3]}: not a raw-page CSV")
    if not data:
        raise TraceFormatError(path, "no kernel rows after the unit row")
    cells = np.empty((len(data), ncols), dtype=object)
    cells[:] = data
    flat = pd.Series(cells.ravel(), dtype=object).str.strip()
    cleaned = flat.str.replace(",", "", regex=False)
    null = cleaned.str.lower().isin(_NULL_CELLS).to_numpy().reshape(cells.shape)
    nums = pd.to_numeric(cleaned, errors="coerce").to_numpy(np.float64).reshape(cells.shape)
    is_text = ~null & np.isnan(nums)
    text_columns = is_text.any(axis=0)

    values, units, source_units, text, notes = {}, {}, {}, {}, []
    for j, name in enumerate(header):
        if text_columns[j]:
            col = cells[:, j].copy()
            col[null[:, j]] = None
            text[name] = col
            continue
        scale, unit = normalise_unit(unit_row[j], name)
        values[name] = nums[:, j] * scale
        units[name] = unit
        source_units[name] = unit_row[j]
        if unit == "byte/s" and _BYTE.match(unit_row[j].strip()):
            notes.append(f"{name}: unit row says {unit_row[j]!r} for a rate; read as byte/s")
    if "ID" in values:
        ids = values["ID"]
        if np.isnan(ids).any():
            raise TraceFormatError(path, "the ID column has empty cells")
        ids = ids.astype(np.int64)
    else:
        ids = np.arange(len(data), dtype=np.int64)
    names = text.get(KERNEL_NAME)
    if names is None:  # every kernel name parsed as a number: keep the cells as written
        names = cells[:, header.index(KERNEL_NAME)].copy()
        values.pop(KERNEL_NAME, None)
    if any(n is None for n in names):
        raise TraceFormatError(path, "a row has no kernel name")
    return NcuTable(
        path=path,
        kernel_names=names,
        ids=ids,
        values=values,
        units=units,
        source_units=source_units,
        text=text,
        notes=notes,
    )


def _read_rows(path: str) -> list[list[str]]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read ({exc.strerror or exc})") from None
    if raw[:2] == b"\x1f\x8b":  # a gzipped CSV (REPORT.csv.gz)
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(path, f"corrupt gzip ({exc})") from None
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceFormatError(path, "not a text file (not UTF-8): expected a CSV") from None
    if not content.strip():
        raise TraceFormatError(path, "empty file")
    try:
        rows = list(csv.reader(io.StringIO(content), strict=True))
    except csv.Error as exc:
        if "end of data" in str(exc):
            raise TraceFormatError(path, "truncated: the file ends inside a quoted cell") from None
        raise TraceFormatError(path, f"not a CSV ({exc})") from None
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    header = rows[0]
    if "Metric Name" in header and "Metric Value" in header:
        raise TraceFormatError(
            path, "a details-page CSV (one row per metric): export it with --csv --page raw"
        )
    if KERNEL_NAME not in header:
        raise TraceFormatError(
            path, f'no "{KERNEL_NAME}" column: not a Nsight Compute raw-page CSV'
        )
    if not any("__" in h for h in header):
        raise TraceFormatError(path, "no metric columns (unit__counter names): not a raw-page CSV")
    if len(rows) < 2:
        raise TraceFormatError(path, "no unit row after the header: not a raw-page CSV")
    ncols = len(header)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    bad = np.flatnonzero(lengths != ncols)
    if bad.size:
        i = int(bad[0])
        if i == len(rows) - 1 and not content.endswith(("\n", "\r")):
            raise TraceFormatError(
                path, f"truncated: the last row has {lengths[i]} of {ncols} cells"
            )
        raise TraceFormatError(
            path, f"ragged rows: row {i + 1} has {lengths[i]} cells, the header has {ncols}"
        )
    if _looks_numeric(rows[1][header.index(KERNEL_NAME)]) or rows[1][0].strip().isdigit():
        raise TraceFormatError(path, "row 2 is not a unit row: not a raw-page CSV")
    return rows


def _looks_numeric(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
    except ValueError:
        return False
    return True


# --- Metrics stored in a profile --------------------------------------------------------

SASS_OPS = ("dadd", "dmul", "dfma", "fadd", "fmul", "ffma", "hadd", "hmul", "hfma")
VECTOR_FMA = ("dfma", "ffma", "hfma")  # per-cycle peaks give the vector counter ceilings
TENSOR_SRC_PATHS = {
    # tensor FLOPs counter (METRICS.md, "Roofline") -> precision path
    "sm__ops_path_tensor_src_fp16.sum": "fp16",
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum": "bf16",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum": "tf32",
    "sm__ops_path_tensor_src_fp8_sparsity_off.sum": "fp8",
    "sm__ops_path_tensor_src_fp8_sparsity_on.sum": "fp8",
    "sm__ops_path_tensor_src_fp64.sum": "fp64_tensor",
}
# Dense (sparsity off) per-cycle ceilings per path; the best one times the SM clock is the
# dense counter ceiling at the observed clock.
DENSE_CEILINGS = {
    "fp16": (
        "sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum.peak_sustained",
        "sm__ops_path_tensor_op_hmma_src_fp16_dst_fp16_sparsity_off.sum.peak_sustained",
        "sm__ops_path_tensor_op_hmma_src_fp16_dst_fp32_sparsity_off.sum.peak_sustained",
    ),
    "bf16": (
        "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum.peak_sustained",
        "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32_sparsity_off.sum.peak_sustained",
    ),
    "tf32": (
        "sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32_sparsity_off.sum.peak_sustained",
        "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32_sparsity_off.sum.peak_sustained",
    ),
    "fp8": ("sm__ops_path_tensor_src_fp8_sparsity_off.sum.peak_sustained",),
    "fp64_tensor": ("sm__ops_path_tensor_src_fp64.sum.peak_sustained",),
}
STALL_REASONS = (
    "long_scoreboard",
    "short_scoreboard",
    "lg_throttle",
    "mio_throttle",
    "tex_throttle",
    "drain",
    "membar",
    "imc_miss",
    "wait",
    "barrier",
    "gmma",
    "branch_resolving",
    "sleeping",
    "math_pipe_throttle",
    "dispatch_stall",
    "no_instruction",
    "misc",
)
ISSUE_STATES = ("selected", "not_selected")


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


RAW_METRICS = (
    "gpu__time_duration.sum",
    "smsp__cycles_elapsed.avg",
    "smsp__cycles_elapsed.avg.per_second",
    "sm__cycles_elapsed.avg.per_second",
    *(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum" for op in SASS_OPS),
    *(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed" for op in SASS_OPS),
    *TENSOR_SRC_PATHS,
    *(name for names in DENSE_CEILINGS.values() for name in names),
    *(f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum.peak_sustained" for op in VECTOR_FMA),
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__bytes.sum.per_second",
    "dram__bytes_read.sum.per_second",
    "dram__bytes_write.sum.per_second",
    *(stall_metric(r) for r in STALL_REASONS + ISSUE_STATES),
    "smsp__average_warp_latency_per_inst_issued.ratio",
    "smsp__inst_issued.sum",
    "smsp__issue_active.sum.per_cycle_active",
    "smsp__cycles_active.avg",
    "sm__inst_issued.sum.per_cycle_active",
    "sm__cycles_active.avg",
    "smsp__thread_inst_executed_per_inst_executed.ratio",
    "smsp__sass_average_branch_targets_threads_uniform.pct",
    "launch__grid_size",
    "launch__block_size",
    "launch__grid_dim_x",
    "launch__grid_dim_y",
    "launch__grid_dim_z",
    "launch__block_dim_x",
    "launch__block_dim_y",
    "launch__block_dim_z",
    "launch__sm_count",
    "launch__registers_per_thread",
    "launch__waves_per_multiprocessor",
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_barriers",
    "Stream",
    "Process ID",
)

# Portable counter -> (unit, candidates). A candidate is (source metrics, description,
# function of their values); the first candidate whose sources are all present is used.
_Formula = Callable[..., np.ndarray]
PORTABLE_COUNTERS: dict[str, tuple[str, list[tuple[tuple[str, ...], str, _Formula]]]] = {
    "sm_occupancy": (
        "%",
        [
            (
                ("sm__warps_active.avg.pct_of_peak_sustained_active",),
                "sm__warps_active.avg.pct_of_peak_sustained_active (measured)",
                lambda v: v,
            )
        ],
    ),
    "warp_divergence_pct": (
        "%",
        [
            (
                ("smsp__thread_inst_executed_per_inst_executed.ratio",),
                "100 x (1 - smsp__thread_inst_executed_per_inst_executed.ratio / 32)",
                lambda r: 100.0 * (1.0 - r / 32.0),
            )
        ],
    ),
    "inst_issue_eff_pct": (
        "%",
        [
            (
                ("smsp__issue_active.avg.pct_of_peak_sustained_active",),
                "smsp__issue_active.avg.pct_of_peak_sustained_active",
                lambda v: v,
            ),
            (
                ("smsp__issue_active.avg.per_cycle_active",),
                "100 x smsp__issue_active.avg.per_cycle_active",
                lambda v: 100.0 * v,
            ),
        ],
    ),
    "dram_read_gbps": (
        "GB/s",
        [
            (
                ("dram__bytes_read.sum.per_second",),
                "dram__bytes_read.sum.per_second / 1e9",
                lambda v: v / 1e9,
            )
        ],
    ),
    "dram_write_gbps": (
        "GB/s",
        [
            (
                ("dram__bytes_write.sum.per_second",),
                "dram__bytes_write.sum.per_second / 1e9",
                lambda v: v / 1e9,
            )
        ],
    ),
    "l2_hit_rate": (
        "%",
        [(("lts__t_sector_hit_rate.pct",), "lts__t_sector_hit_rate.pct", lambda v: v)],
    ),
    "smem_bank_conflicts": (
        "",
        [
            (
                ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",),
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
                lambda v: v,
            )
        ],
    ),
    "tc_util_pct": (
        "%",
        [
            (
                ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",),
                "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                lambda v: v,
            )
        ],
    ),
    "alu_util_pct": (
        "%",
        [
            (
                ("sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",),
                "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
                lambda v: v,
            )
        ],
    ),
    "cp_async_inflight": ("", []),
}
_NO_SOURCE = {
    "cp_async_inflight": "unavailable:no Nsight Compute metric counts cp.async copies in flight",
}


def _capability(values: np.ndarray) -> str:
    missing = int(np.isnan(values).sum())
    if missing == values.size and values.size:
        return "unavailable:no value in any row (n/a)"
    if missing:
        return f"partial:{missing} of {values.size} kernels have no value (n/a)"
    return "ok"


def counter_profile(table: NcuTable, worker: str = "ncu") -> CounterProfile:
    """A counter-only profile of every kernel in the table (no run kernels attached)."""
    n, base = table.count, os.path.basename(table.path)
    metrics: dict[str, CounterMetric] = {}
    for name, (unit, candidates) in PORTABLE_COUNTERS.items():
        for sources, description, formula in candidates:
            if all(s in table.values for s in sources):
                values = formula(*(table.values[s] for s in sources)).astype(np.float64)
                metrics[name] = CounterMetric(
                    name, unit, values, description, "", _capability(values)
                )
                break
        else:
            wanted = " or ".join(" and ".join(c[0]) for c in candidates)
            why = _NO_SOURCE.get(name) or f"unavailable:{wanted} not in {base}"
            metrics[name] = CounterMetric(name, unit, np.full(n, np.nan), "", "", why)
    for name in RAW_METRICS:
        if name in table.values:
            values = table.values[name]
            metrics[name] = CounterMetric(
                name,
                table.units[name],
                values,
                name,
                table.source_units[name],
                _capability(values),
            )
        else:
            metrics[name] = CounterMetric(
                name, "", np.full(n, np.nan), name, "", f"unavailable:not in {base}"
            )
    cc = table.text.get("CC")
    if cc is not None:
        compute_capability = str(cc[0])
    elif "CC" in table.values and n:
        compute_capability = f"{table.values['CC'][0]:.1f}"
    else:
        compute_capability = ""
    device = table.text.get("device__attribute_display_name")
    device_name = str(device[0]) if device is not None and device[0] is not None else ""
    return CounterProfile(
        worker=worker,
        source=base,
        source_format=SOURCE_FORMAT,
        match_method=METHOD_COUNTER_ONLY,
        match_note="counter-only: not attached to a run's kernels",
        compute_capability=compute_capability,
        device_name=device_name,
        profiled_id=table.ids.copy(),
        kernel_names=table.kernel_names.copy(),
        step=np.zeros(n, dtype=np.int64),
        row=np.full(n, -1, dtype=np.int32),
        match=np.zeros(n, dtype=np.uint8),
        metrics=metrics,
        report=MatchReport(profiled_kernels=n),
    )
