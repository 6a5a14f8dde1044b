"""Run kernels joined with their matched Nsight Compute counters (kernel_counters.pb).

The roofline, stall and divergence analyses read counters per kernel instance of the selected
steps: `counter_instances` gives one row per run kernel that has counters, with the run's own
duration, its owning op (METRICS.md, "Time": launch linkage) and the requested metrics.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from tessera_tb.backend.linkage import owning_op_rows
from tessera_tb.backend.selection import iter_selected, resolve_workers
from tessera_tb.importers.kernel_names import kernel_base_name, kernel_name_key
from tessera_tb.trace.kernel_counters import (
    LINKED_METHODS,
    MATCH_BASE_NAME,
    MATCH_CAPABILITY,
    MEASURED,
    CounterProfile,
    load_kernel_counters,
)
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import StepData

ID_COLUMNS = [
    "worker",
    "step",
    "row",
    "kernel_name",
    "dur_ns",
    "op_row",
    "op_name",
    "op_input_dims",
    "profile_index",
    "counters",
]


def worker_profiles(run: Run, workers: Iterable[str] | None = None) -> dict[str, CounterProfile]:
    """Kernel counter profiles of the chosen workers (workers without one are left out)."""
    out = {}
    for w in resolve_workers(run, workers):
        profile = load_kernel_counters(run.path, w)
        if profile is not None:
            out[w] = profile
    return out


def linked_kernels(profile: CounterProfile, step: StepData) -> tuple[np.ndarray, np.ndarray]:
    """(profile positions, event rows) of the profiled kernels linked to this step's kernels.

    A link is kept only if the event row is still the kernel it was matched with (same
    normalised name), so counters never attach to other kernels of re-imported step files.
    """
    if profile.match_method not in LINKED_METHODS:
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    idx = np.flatnonzero((profile.row >= 0) & (profile.step == step.step))
    rows = profile.row[idx]
    inside = rows < step.num_events
    idx, rows = idx[inside], rows[inside]
    run_names = step.string_values(step.events["name_id"][rows])
    same = np.array(
        [
            (kernel_base_name(a) == kernel_base_name(b))
            if m == MATCH_BASE_NAME
            else (kernel_name_key(a) == kernel_name_key(b))
            for a, b, m in zip(profile.kernel_names[idx], run_names, profile.match[idx])
        ],
        dtype=bool,
    )
    return idx[same], rows[same]


def op_labels(step: StepData, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(owning op row, op name, op Input Dims JSON text or "") for event rows."""
    owner = owning_op_rows(step)[rows]
    names = np.where(
        owner >= 0, step.string_values(step.events["name_id"][np.maximum(owner, 0)]), ""
    )
    dims = step.attr("Input Dims").reindex(owner).fillna("").to_numpy(object, copy=True)
    dims[owner < 0] = ""
    return owner, names.astype(object), dims


def counter_instances(
    run: Run,
    metrics: list[str],
    *,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    profiles: dict[str, CounterProfile] | None = None,
) -> pd.DataFrame:
    """One row per kernel of the selected steps that was matched with counters.

    Columns: ID_COLUMNS (worker, step, row, kernel_name as the run spells it, dur_ns of the run
    kernel, op_row/op_name/op_input_dims of its owning op, profile_index = position in the
    worker's profile, counters = `measured` or `measured:same-kernel-instance`) and one column
    per requested metric (NaN where the profile lacks it).
    """
    profiles = worker_profiles(run, workers) if profiles is None else profiles
    frames = []
    for w, st in iter_selected(
        run, [w for w in resolve_workers(run, workers) if w in profiles], steps
    ):
        p = profiles[w]
        idx, rows = linked_kernels(p, st)
        if idx.size == 0:
            continue
        op_row, op_name, op_dims = op_labels(st, rows)
        data = {
            "worker": w,
            "step": st.step,
            "row": rows,
            "kernel_name": st.string_values(st.events["name_id"][rows]),
            "dur_ns": st.events["dur_ns"][rows].astype(np.float64),
            "op_row": op_row,
            "op_name": op_name,
            "op_input_dims": op_dims,
            "profile_index": idx,
            # `measured`, or `measured:same-kernel-instance` when another launch's counters
            # stand for this one (kernel_counters.MATCH_CAPABILITY)
            "counters": [MATCH_CAPABILITY.get(int(m), MEASURED) for m in p.match[idx]],
        }
        for m in metrics:
            data[m] = p.values(m)[idx]
        frames.append(pd.DataFrame(data))
    if not frames:
        return pd.DataFrame({c: [] for c in ID_COLUMNS + list(metrics)})
    return pd.concat(frames, ignore_index=True)
