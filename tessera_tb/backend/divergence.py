"""Warp divergence per kernel from Nsight Compute counters (METRICS.md, "Derived kernel
figures").

warp_divergence_pct = 100 x (1 - `smsp__thread_inst_executed_per_inst_executed.ratio` / 32):
the share of thread slots of executed warp instructions that were inactive. Branch uniformity
is `smsp__sass_average_branch_targets_threads_uniform.pct` where the report has it. Across the
instances of a kernel name the ratio is averaged weighted by issued instructions (so the
result is the ratio of the summed thread instructions to the summed warp instructions).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from tessera_tb.backend.counter_join import counter_instances, worker_profiles
from tessera_tb.backend.stalls import ISSUED, ISSUED_FALLBACKS, issued_instructions
from tessera_tb.trace.kernel_counters import CounterProfile
from tessera_tb.trace.reader import Run

THREADS_PER_INST = "smsp__thread_inst_executed_per_inst_executed.ratio"
BRANCH_UNIFORM = "smsp__sass_average_branch_targets_threads_uniform.pct"
WARP_SIZE = 32
_METRICS = [
    THREADS_PER_INST,
    BRANCH_UNIFORM,
    "gpu__time_duration.sum",
    ISSUED,
    *(m for pair in ISSUED_FALLBACKS for m in pair),
]


def warp_divergence_pct(threads_per_inst: np.ndarray) -> np.ndarray:
    """100 x (1 - threads per executed warp instruction / 32); NaN stays NaN."""
    return 100.0 * (1.0 - np.asarray(threads_per_inst, dtype=np.float64) / WARP_SIZE)


def _frame(
    source: Run | CounterProfile,
    workers: Iterable[str] | None,
    steps: Iterable[int] | None,
) -> pd.DataFrame:
    if isinstance(source, CounterProfile):
        frame = source.frame(_METRICS)
        frame["dur_ns"] = frame["gpu__time_duration.sum"] * 1e9  # Nsight Compute's time
        return frame
    profiles = worker_profiles(source, workers)
    return counter_instances(source, _METRICS, workers=workers, steps=steps, profiles=profiles)


def divergence(
    source: Run | CounterProfile,
    *,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    threshold: float = 0.2,
) -> pd.DataFrame:
    """Kernels whose warp divergence exceeds `threshold` (a fraction: 0.2 = 20 %), heaviest
    total time first.

    Source: a run (its matched kernels in the selected steps, times from the run) or a counter
    profile (its kernels, Nsight Compute's times). One row per kernel name: kernel_name, count,
    dur_ns (summed), warp_divergence_pct, threads_per_inst, branch_uniformity_pct (both
    issued-instruction weighted; NaN where the counters are missing). Kernels without the
    counter are left out.
    """
    frame = _frame(source, workers, steps)
    cols = ["kernel_name", "count", "dur_ns", "warp_divergence_pct", "threads_per_inst",
            "branch_uniformity_pct"]  # fmt: skip
    if not len(frame):
        return pd.DataFrame(columns=cols)
    issued, _ = issued_instructions(frame)
    weight = np.where(np.isfinite(issued), issued, 1.0)
    threads = frame[THREADS_PER_INST].to_numpy(np.float64)
    uniform = frame[BRANCH_UNIFORM].to_numpy(np.float64)
    has_t, has_u = np.isfinite(threads), np.isfinite(uniform)
    work = pd.DataFrame(
        {
            "kernel_name": frame["kernel_name"].to_numpy(object),
            "dur_ns": frame["dur_ns"].to_numpy(np.float64),
            "wt": np.where(has_t, weight * threads, 0.0),
            "w_t": np.where(has_t, weight, 0.0),
            "wu": np.where(has_u, weight * uniform, 0.0),
            "w_u": np.where(has_u, weight, 0.0),
            "has_t": has_t,
        }
    )
    g = work.groupby("kernel_name", sort=False)
    out = pd.DataFrame(
        {
            "count": g.size(),
            "dur_ns": g["dur_ns"].sum(),
            "threads_per_inst": g["wt"].sum() / g["w_t"].sum().replace(0.0, np.nan),
            "branch_uniformity_pct": g["wu"].sum() / g["w_u"].sum().replace(0.0, np.nan),
        }
    ).reset_index()
    out["warp_divergence_pct"] = warp_divergence_pct(out["threads_per_inst"].to_numpy())
    out = out[out["warp_divergence_pct"] > 100.0 * threshold]
    return out[cols].sort_values("dur_ns", ascending=False, ignore_index=True)
