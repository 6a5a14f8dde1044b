"""Warp stall breakdown from Nsight Compute counters (METRICS.md, "Stalls").

Source: `smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`, the warps stalled
on a reason per cycle that issued an instruction (cycles per issued instruction). Per kernel,
share_r = ratio_r / (sum of the 17 stall ratios); `selected` (issuing) and `not_selected`
(eligible, not picked) are reported apart and are not stalls. Across kernels, ops or steps a
reason's weight is its stall warp-cycles, ratio_r x issued instructions of the kernel, summed:
kernels are weighted by issued instructions, not by duration. Kernels smaller than one wave
(grid blocks < SMs x blocks per SM) are flagged low confidence.

Without the counters there is no breakdown: `stall_breakdown` says which counters are missing
and prints the Nsight Compute command that collects them; it never estimates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tessera_tb.backend.counter_join import counter_instances, worker_profiles
from tessera_tb.importers.ncu_csv import ISSUE_STATES, STALL_REASONS, stall_metric
from tessera_tb.trace.kernel_counters import MEASURED_SAME_INSTANCE, CounterProfile
from tessera_tb.trace.reader import Run

CATEGORIES = {
    "memory": ("long_scoreboard", "short_scoreboard", "lg_throttle", "mio_throttle",
               "tex_throttle", "drain", "membar", "imc_miss"),
    "dependency": ("wait", "barrier", "gmma", "branch_resolving", "sleeping"),
    "structural": ("math_pipe_throttle", "dispatch_stall", "no_instruction", "misc"),
}  # fmt: skip
CATEGORY_OF = {r: c for c, reasons in CATEGORIES.items() for r in reasons}
NOT_A_STALL = "not a stall"

ISSUED = "smsp__inst_issued.sum"
ISSUED_FALLBACKS = (
    ("smsp__issue_active.sum.per_cycle_active", "smsp__cycles_active.avg"),
    # The same count at SM level (an SM's issued instructions are its SMSPs' sum).
    ("sm__inst_issued.sum.per_cycle_active", "sm__cycles_active.avg"),
)
WAVE_METRICS = (
    "launch__grid_size",
    "launch__sm_count",
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_barriers",
    "launch__waves_per_multiprocessor",
)
RATIO_METRICS = [stall_metric(r) for r in STALL_REASONS + ISSUE_STATES]
NEEDED = [*RATIO_METRICS, ISSUED, *(m for pair in ISSUED_FALLBACKS for m in pair), *WAVE_METRICS]


def collect_command(run_path: str = "RUN") -> str:
    """The command that collects what this analysis needs (`tessera-prof counters`, which runs
    the program under ncu with the sections and metrics of `ncu_selection`), and on a second
    line the ncu options it uses."""
    from tessera_tb.importers.ncu_selection import collect_args

    return (
        f"tessera-prof counters {run_path} -- <your training command>\n"
        f"# runs it under ncu {' '.join(collect_args())}"
    )


@dataclass
class StallBreakdown:
    """The result of `stall_breakdown`: a table, or why there is none and how to collect it."""

    table: pd.DataFrame
    available: bool
    missing_counters: list[str] = field(default_factory=list)
    collect_command: str = ""
    note: str = ""


def issued_instructions(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(issued instructions, source) per row: `smsp__inst_issued.sum`, else
    `smsp__issue_active.sum.per_cycle_active` x `smsp__cycles_active.avg`, else
    `sm__inst_issued.sum.per_cycle_active` x `sm__cycles_active.avg`."""
    n = len(frame)
    values = _col(frame, ISSUED)
    source = np.where(np.isfinite(values), ISSUED, "").astype(object)
    for rate, cycles in ISSUED_FALLBACKS:
        alt = _col(frame, rate) * _col(frame, cycles)
        use = ~np.isfinite(values) & np.isfinite(alt)
        values = np.where(use, alt, values)
        source = np.where(use, f"{rate} x {cycles}", source)
    return values if n else np.zeros(0), source


def below_one_wave(frame: pd.DataFrame) -> np.ndarray:
    """True where grid blocks < SMs x blocks per SM (the smallest occupancy limit); falls back
    to ncu's waves per multiprocessor < 1. Unknown launch data gives False."""
    blocks_per_sm = np.nanmin(
        np.array([_col(frame, m) for m in WAVE_METRICS[2:7]]), axis=0, initial=np.inf
    )
    capacity = _col(frame, "launch__sm_count") * blocks_per_sm
    grid = _col(frame, "launch__grid_size")
    known = np.isfinite(grid) & np.isfinite(capacity)
    waves = _col(frame, "launch__waves_per_multiprocessor")
    return np.where(known, grid < capacity, np.nan_to_num(waves, nan=np.inf) < 1.0)


def _col(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name in frame:
        return frame[name].to_numpy(np.float64)
    return np.full(len(frame), np.nan)


def _long(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per-row ratios -> one row per (keys, reason) with stall warp-cycles."""
    issued, source = issued_instructions(frame)
    low = below_one_wave(frame)
    parts = []
    for reason in STALL_REASONS + ISSUE_STATES:
        ratio = _col(frame, stall_metric(reason))
        part = frame[keys].copy()
        part["reason"] = reason
        part["category"] = CATEGORY_OF.get(reason, NOT_A_STALL)
        part["cycles_per_issued_inst"] = ratio
        part["issued_inst"] = issued
        part["issued_source"] = source
        part["stall_warp_cycles"] = ratio * issued
        part["low_confidence"] = low
        part["same_instance"] = (
            frame["counters"].to_numpy(object) == MEASURED_SAME_INSTANCE
            if "counters" in frame
            else False
        )
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def _shares(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    stall = table["category"] != NOT_A_STALL
    total = table[stall].groupby(keys, dropna=False)["stall_warp_cycles"].transform("sum")
    share = pd.Series(np.nan, index=table.index)
    share[stall] = 100.0 * table.loc[stall, "stall_warp_cycles"] / total
    table["share_pct"] = share
    return table


def kernel_stalls(profile: CounterProfile) -> pd.DataFrame:
    """One row per (profiled kernel, reason): profiled_id, kernel_name, reason, category,
    cycles_per_issued_inst (the ratio), share_pct (of the 17 stall reasons; NaN for selected
    and not_selected), issued_inst, issued_source, stall_warp_cycles, low_confidence."""
    frame = profile.frame(NEEDED)
    table = _long(frame, ["profiled_id", "kernel_name"])
    return _shares(table, ["profiled_id"])


def missing_stall_counters(frame: pd.DataFrame) -> list[str]:
    """Counters the breakdown reads that have no value in any row (a reason that does not
    exist on the architecture, such as gmma before sm_90, is listed too)."""
    missing = [m for m in RATIO_METRICS if not np.isfinite(_col(frame, m)).any()]
    issued, _ = issued_instructions(frame)
    if not np.isfinite(issued).any():
        missing.append(ISSUED)
    return missing


def stall_breakdown(
    source: Run | CounterProfile,
    *,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    group_by: str = "kernel",
) -> StallBreakdown:
    """Stall breakdown of a run's matched kernels (selected steps) or of a counter profile.

    group_by: "instance" (one group per kernel instance), "kernel" (per kernel name), "op"
    (per owning op name; runs only), "step" (per worker and step; runs only), "total".
    Table columns: the group keys, reason, category (memory, dependency, structural, or
    "not a stall" for selected / not_selected), stall_warp_cycles (sum of ratio x issued
    instructions), issued_inst (summed), cycles_per_issued_inst (stall_warp_cycles /
    issued_inst), share_pct (of the group's 17 stall reasons, sums to 100), kernels,
    low_confidence_kernels (kernels below one wave), same_instance_kernels (kernels whose
    counters are another launch's of the same name, grid and block:
    `measured:same-kernel-instance`). Rows by group, then share, largest first.
    """
    keys_of = {
        "instance": ["worker", "step", "row", "kernel_name"],
        "kernel": ["kernel_name"],
        "op": ["op_name"],
        "step": ["worker", "step"],
        "total": [],
    }
    if group_by not in keys_of:
        raise ValueError(f"group_by must be one of {', '.join(keys_of)}, not {group_by!r}")
    if isinstance(source, CounterProfile):
        if group_by in ("op", "step"):
            raise ValueError("group_by 'op' and 'step' need a run, not a counter profile")
        frame = source.frame(NEEDED).rename(columns={"profiled_id": "row"})
        frame["worker"], frame["step"] = source.worker, -1
        run_path = "RUN"
    else:
        profiles = worker_profiles(source, workers)
        frame = counter_instances(source, NEEDED, workers=workers, steps=steps, profiles=profiles)
        run_path = source.path
    missing = missing_stall_counters(frame) if len(frame) else [ISSUED, *RATIO_METRICS]
    stall_present = any(stall_metric(r) not in missing for r in STALL_REASONS)
    if not len(frame) or ISSUED in missing or not stall_present:
        note = (
            "no kernel counters for the selection"
            if not len(frame)
            else "the Nsight Compute report lacks the counters of the stall breakdown"
        )
        return StallBreakdown(
            table=pd.DataFrame(),
            available=False,
            missing_counters=missing,
            collect_command=collect_command(run_path),
            note=note + " (add --launch-skip/--launch-count to choose the kernels)",
        )
    id_keys = ["worker", "step", "row", "kernel_name"] + (["op_name"] if "op_name" in frame else [])
    long = _long(frame, id_keys)
    keys = keys_of[group_by]
    group = keys or ["_all"]
    if not keys:
        long["_all"] = "all"
    g = long.groupby(group + ["reason", "category"], sort=False, dropna=False)
    table = pd.DataFrame(
        {
            "stall_warp_cycles": g["stall_warp_cycles"].sum(min_count=1),
            "issued_inst": g["issued_inst"].sum(min_count=1),
            "kernels": g.size(),
            "same_instance_kernels": g["same_instance"].sum(),
            "low_confidence_kernels": g["low_confidence"].sum(),
        }
    ).reset_index()
    table["cycles_per_issued_inst"] = table["stall_warp_cycles"] / table["issued_inst"]
    table = _shares(table, group)
    if not keys:
        table = table.drop(columns="_all")
    table = table.sort_values(
        keys + ["share_pct"], ascending=[True] * len(keys) + [False], na_position="last"
    )
    return StallBreakdown(
        table=table.reset_index(drop=True),
        available=True,
        missing_counters=missing,
        note=f"{len(frame)} kernels, weighted by issued instructions",
    )
