"""Per-step summary: step time, GPU busy %, tensor-core kernel time %, occupancy.

Definitions: METRICS.md, "Time" (GPU busy %) and "Derived kernel figures" (tensor-core kernel
time %), "Kernel counters" (sm_occupancy). GPU busy % comes from `backend.utilization`; this
module does not define it again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

from tessera_tb.backend.counter_join import linked_kernels, worker_profiles
from tessera_tb.backend.selection import (
    iter_selected,
    resolve_workers,
    steady_state_step,
    step_times_ms,
)
from tessera_tb.backend.utilization import gpu_busy_pct
from tessera_tb.importers.ncu_csv import TENSOR_SRC_PATHS
from tessera_tb.trace.kernel_counters import MATCH_INSTANCE, CounterProfile
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import KIND, StepData

# Op families that run on tensor cores when their inputs are low precision (METRICS.md,
# "Derived kernel figures"). Matched against cpu op names, never kernel names.
TENSOR_CORE_OP_PATTERN = re.compile(
    r"^aten::("
    r"mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_addmm_activation|_scaled_mm|_int_mm"
    r"|_grouped_mm|_scaled_grouped_mm"
    r"|_?convolution\w*|conv\dd|conv_transpose\dd|cudnn_convolution\w*|miopen_\w*convolution\w*"
    r"|\w*attention\w*"
    r")$"
)
# "Input type" entries of fp16/bf16/fp8 tensors (c10::Half, c10::BFloat16, c10::Float8_*).
LOW_PRECISION_TYPE_PATTERN = re.compile(r"BFloat16|Half|Float8", re.IGNORECASE)

TENSOR_CORE_BASIS = (
    "estimated: kernels launched by matmul/conv/attention ops with fp16/bf16/fp8 inputs"
)
NO_INPUT_TYPES = "unknown: the trace has no 'Input type' args (record_shapes was off)"
SM_OCCUPANCY_MISSING = (
    "needs Nsight Compute counters (sm__warps_active.avg.pct_of_peak_sustained_active); "
    "this run has none"
)


def _clipped_dur_ns(step: StepData, rows: np.ndarray) -> np.ndarray:
    start = step.events["start_ns"][rows]
    end = start + step.events["dur_ns"][rows]
    return np.maximum(np.minimum(end, step.end_ns) - np.maximum(start, step.start_ns), 0)


def tensor_core_eligible_kernels(
    step: StepData,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(kernel rows, in_family, eligible) for the step's compute kernels; None when the trace
    has no input types.

    `in_family`: the kernel's launching call lies inside an op of the matmul/conv/attention
    family (TENSOR_CORE_OP_PATTERN, matched on op names, never kernel names). A kernel is
    tensor-core eligible when the innermost family op among the host-tree ancestors of its
    launching call has a fp16/bf16/fp8 tensor among its "Input type" entries (the path without
    counters of METRICS.md, "Derived kernel figures"). Innermost, because autocast records
    `aten::linear` with fp32 inputs and the `aten::addmm` inside it with bf16 ones.
    fp32 GEMMs that ran in TF32 cannot be told apart in the trace (TF32 is a backend flag, not
    a dtype), so they count as not eligible: the estimate is a lower bound for fp32 models
    with TF32 enabled.
    """
    found = tensor_core_family_op(step)
    if found is None:
        return None
    kernels, decided, low_precision_row = found
    eligible = np.zeros(kernels.size, dtype=bool)
    in_family = decided >= 0
    eligible[in_family] = low_precision_row[decided[in_family]]
    return kernels, in_family, eligible


def tensor_core_family_op(step: StepData) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(compute kernel rows, the innermost matmul/conv/attention op row of each (-1 outside
    the family), per event row: has a fp16/bf16/fp8 input) as `tensor_core_eligible_kernels`
    decides them; None when the trace has no input types."""
    ev = step.events
    kernels = np.flatnonzero(ev["kind"] == KIND["kernel"])
    input_type = step.attrs_by_key.get("Input type")
    if input_type is None:
        return None
    # Flags per string id (a loop over distinct strings, not events).
    n_strings = len(step.strings)
    family_of_string = np.zeros(n_strings, dtype=bool)
    for sid in np.unique(ev["name_id"][ev["kind"] == KIND["cpu_op"]]):
        family_of_string[sid] = bool(TENSOR_CORE_OP_PATTERN.match(step.strings[sid]))
    low_of_string = np.zeros(n_strings, dtype=bool)
    for sid in np.unique(input_type.values):
        low_of_string[sid] = bool(LOW_PRECISION_TYPE_PATTERN.search(step.strings[sid]))
    low_precision_row = np.zeros(ev["kind"].size, dtype=bool)
    low_precision_row[input_type.rows] = low_of_string[input_type.values]
    is_family_row = family_of_string[ev["name_id"]] & (ev["kind"] == KIND["cpu_op"])

    # Climb from each launching call, one tree level per pass, until a family op is found.
    node = ev["launch"][kernels].astype(np.int64)
    decided = np.full(kernels.size, -1, dtype=np.int64)
    active = np.flatnonzero(node >= 0)
    parent = ev["parent"]
    while active.size:
        hit = is_family_row[node[active]]
        decided[active[hit]] = node[active[hit]]
        active = active[~hit]
        node[active] = parent[node[active]]
        active = active[node[active] >= 0]
    return kernels, decided, low_precision_row


def tensor_core_time_pct_est(step: StepData) -> float:
    """Tensor-core kernel time %, estimated (METRICS.md, "Derived kernel figures", the path
    without counters): eligible kernel time / compute kernel time x 100.

    Kernel time is the summed duration of `kernel` events (NCCL kernels excluded), clipped to
    the step span. NaN when the step has no kernels or the trace has no input types.
    """
    found = tensor_core_eligible_kernels(step)
    if found is None:
        return float("nan")
    kernels, _, eligible = found
    dur = _clipped_dur_ns(step, kernels)
    total = int(dur.sum())
    if total == 0:
        return float("nan")
    return 100.0 * int(dur[eligible].sum()) / total


def est_occupancy(step: StepData) -> tuple[float, float]:
    """(est_occupancy_pct, coverage_pct): Kineto's `est. achieved occupancy %`, time-weighted
    over the step's compute kernels (durations clipped to the step span); labelled estimated
    (METRICS.md, "Kernel counters": sm_occupancy).

    Kineto computes the estimate with the occupancy calculator assuming no opt-in dynamic
    shared memory, so a kernel using more than 48 KB of it gets 0 although it ran. A running
    kernel has at least one warp active; a 0 on a kernel with `warps per SM` >= 1 (so at least
    one warp per SM, >= 1.5% on any GPU) is therefore a failed estimate and is left out.
    `coverage_pct` is the share of kernel time that has a usable estimate. (NaN, 0) when no
    kernel has one.
    """
    ev = step.events
    kernels = np.flatnonzero(ev["kind"] == KIND["kernel"])
    dur = _clipped_dur_ns(step, kernels).astype(np.float64)
    total = dur.sum()
    occ = _attr_on_rows(step, "est. achieved occupancy %", kernels)
    warps = _attr_on_rows(step, "warps per SM", kernels)
    usable = ~np.isnan(occ) & ~((occ == 0) & (warps >= 1))
    weight = dur[usable].sum()
    if total == 0 or weight == 0:
        return float("nan"), 0.0
    return float((occ[usable] * dur[usable]).sum() / weight), float(100.0 * weight / total)


def _attr_on_rows(step: StepData, key: str, rows: np.ndarray) -> np.ndarray:
    """A numeric attribute on the given rows as float64, NaN where absent."""
    out = np.full(rows.size, np.nan)
    a = step.attrs_by_key.get(key)
    if a is None or a.type not in ("int64", "float64") or a.rows.size == 0:
        return out
    pos = np.minimum(np.searchsorted(a.rows, rows), a.rows.size - 1)
    match = a.rows[pos] == rows
    out[match] = a.values[pos[match]].astype(np.float64)
    return out


SUMMARY_COLUMNS = [
    "worker",
    "rank",
    "step",
    "step_time_ms",
    "gpu_busy_pct",
    "tensor_core_time_pct_est",
    "tensor_core_basis",
    "est_occupancy_pct",
    "est_occupancy_coverage_pct",
    "sm_occupancy_pct",
    "sm_occupancy_note",
    "tensor_core_time_pct",
    "counter_coverage_pct",
]

TENSOR_FLOP_COUNTERS = tuple(TENSOR_SRC_PATHS)


def measured_kernel_figures(
    profile: CounterProfile | None, step: StepData
) -> tuple[float, float, float, str]:
    """(sm_occupancy_pct, tensor_core_time_pct, counter_coverage_pct, note) of a step from the
    Nsight Compute counters matched to its kernels (METRICS.md, "Kernel counters" and
    "Derived kernel figures").

    - sm_occupancy_pct: `sm__warps_active.avg.pct_of_peak_sustained_active` (portable name
      sm_occupancy), weighted by each kernel's own duration in the run;
    - tensor_core_time_pct: 100 x time of kernels with measured tensor FLOPs > 0 / time of the
      kernels with counters;
    - counter_coverage_pct: the share of the step's kernel time (kernels and NCCL kernels)
      that has counters: both figures describe that share only, never the rest.
    NaN, with the reason in `note`, when the step has no matched counters.
    """
    if profile is None:
        return np.nan, np.nan, np.nan, SM_OCCUPANCY_MISSING
    idx, rows = linked_kernels(profile, step)
    ev = step.events
    kernels = np.isin(ev["kind"], [KIND["kernel"], KIND["collective"]])
    total_ns = float(ev["dur_ns"][kernels].sum())
    if idx.size == 0 or total_ns == 0:
        return np.nan, np.nan, 0.0, "no kernel of this step has matched Nsight Compute counters"
    dur = ev["dur_ns"][rows].astype(np.float64)
    coverage = 100.0 * dur.sum() / total_ns
    occ = profile.values("sm_occupancy")[idx] if profile.has("sm_occupancy") else None
    if occ is not None and np.isfinite(occ).any():
        ok = np.isfinite(occ)
        occupancy = float(np.average(occ[ok], weights=dur[ok])) if dur[ok].sum() else np.nan
    else:
        occupancy = np.nan
    tensor = np.zeros(idx.size)
    for name in TENSOR_FLOP_COUNTERS:
        if profile.has(name):
            tensor += np.nan_to_num(profile.values(name)[idx])
    tensor_pct = 100.0 * dur[tensor > 0].sum() / dur.sum() if dur.sum() else np.nan
    note = f"measured on {idx.size} kernel(s), {coverage:.1f}% of the step's kernel time"
    same = int((profile.match[idx] == MATCH_INSTANCE).sum())
    if same:
        note += (
            f"; {same} of them with the counters of another launch of the same kernel "
            "(measured:same-kernel-instance)"
        )
    return occupancy, tensor_pct, coverage, note


def step_summary(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> pd.DataFrame:
    """One row per selected (worker, step); `steps=None` means every step.

    Columns:
    - step_time_ms: the step span (METRICS.md, "Steps and nesting").
    - gpu_busy_pct: the busiest device's GPU busy % (`utilization.gpu_busy_pct`); NaN when the
      step has no device work.
    - tensor_core_time_pct_est, tensor_core_basis: `tensor_core_time_pct_est`; the basis says it
      is estimated, or why it is unknown.
    - est_occupancy_pct, est_occupancy_coverage_pct: `est_occupancy` (estimated).
    - sm_occupancy_pct, tensor_core_time_pct, counter_coverage_pct: measured from Nsight
      Compute counters where the run has them (`measured_kernel_figures`); the note says on
      which share of the kernel time, or why they are null.
    """
    rows = []
    profiles = worker_profiles(run, workers)
    for worker, step in iter_selected(run, workers, steps):
        sm_occ, tc_measured, counter_coverage, occ_note = measured_kernel_figures(
            profiles.get(worker), step
        )
        busy = gpu_busy_pct(step)
        tc = tensor_core_time_pct_est(step)
        has_types = "Input type" in step.attrs_by_key
        occ, coverage = est_occupancy(step)
        rows.append(
            {
                "worker": worker,
                "rank": int(run.worker(worker).meta.rank),
                "step": step.step,
                "step_time_ms": step.span_ns / 1e6,
                "gpu_busy_pct": np.nan if busy is None else busy,
                "tensor_core_time_pct_est": tc,
                "tensor_core_basis": TENSOR_CORE_BASIS if has_types else NO_INPUT_TYPES,
                "est_occupancy_pct": occ,
                "est_occupancy_coverage_pct": coverage,
                "sm_occupancy_pct": sm_occ,
                "sm_occupancy_note": occ_note,
                "tensor_core_time_pct": tc_measured,
                "counter_coverage_pct": counter_coverage,
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def step_time_distribution(run: Run, workers: Iterable[str] | None = None) -> pd.DataFrame:
    """Step times over every step of each worker, from the step index (no step file is read).

    Columns: worker, rank, num_steps, min_ms, median_ms, p90_ms, max_ms. p90 is numpy's
    default (linear interpolation between the two nearest ranks).
    """
    names = resolve_workers(run, workers)
    # One grouped pass over every worker's steps (a run of a thousand ranks is one request).
    owner, times = [], []
    for i, worker in enumerate(names):
        t = step_times_ms(run, worker).values()
        owner.extend([i] * len(t))
        times.extend(t)
    g = pd.Series(np.asarray(times, dtype=np.float64)).groupby(np.asarray(owner, dtype=np.int64))
    stats = pd.DataFrame(
        {
            "num_steps": g.size(),
            "min_ms": g.min(),
            "median_ms": g.median(),
            "p90_ms": g.quantile(0.9),  # linear interpolation, as numpy's percentile
            "max_ms": g.max(),
        }
    ).reindex(range(len(names)))
    out = pd.DataFrame(
        {
            "worker": names,
            "rank": [int(run.worker(w).meta.rank) for w in names],
        }
    )
    out["num_steps"] = stats["num_steps"].fillna(0).astype("int64").to_numpy()
    for c in ("min_ms", "median_ms", "p90_ms", "max_ms"):
        out[c] = stats[c].to_numpy(dtype=np.float64)
    return out


def summary(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> pd.DataFrame:
    """The summary over a step range, one row per worker: the median of each numeric column
    of `step_summary` over the chosen steps.

    `steps=None` means the default single step, `selection.steady_state_step` of the first
    selected worker (the same step for every worker). Columns: worker, rank, steps (tuple of
    step numbers), then the numeric columns of `step_summary`, the basis and the note.
    """
    names = resolve_workers(run, workers)
    if steps is None:
        steps = [steady_state_step(run, names[0])]
    per_step = step_summary(run, names, steps)
    numeric = [
        "step_time_ms",
        "gpu_busy_pct",
        "tensor_core_time_pct_est",
        "est_occupancy_pct",
        "est_occupancy_coverage_pct",
        "sm_occupancy_pct",
        "tensor_core_time_pct",
        "counter_coverage_pct",
    ]
    grouped = per_step.groupby(["worker", "rank"], sort=True)
    out = grouped[numeric].median().reset_index()
    out.insert(2, "steps", grouped["step"].agg(tuple).to_numpy())
    out["tensor_core_basis"] = grouped["tensor_core_basis"].first().to_numpy()
    # One step: its own note; a range: the median is over the steps that had counters.
    out["sm_occupancy_note"] = (
        grouped["sm_occupancy_note"]
        .agg(
            lambda notes: (
                notes.iloc[0]
                if len(notes) == 1
                else "median over the steps; per step: " + " | ".join(notes)
            )
        )
        .to_numpy()
    )
    return out
