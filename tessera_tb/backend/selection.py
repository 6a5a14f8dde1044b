"""Which workers and steps an analysis looks at, shared by every analysis.

Analyses take a `Run` plus optional `workers` and `steps`; `None` means all workers and, for
steps, the default step range below.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import StepData


def step_times_ms(run: Run, worker: str) -> dict[int, float]:
    """Step span durations from the worker's index (no step file is read), in ms."""
    return {e.step: (e.end_ns - e.start_ns) / 1e6 for e in run.worker(worker).meta.steps}


def steady_state_step(run: Run, worker: str | None = None) -> int:
    """The default single step: the step whose time is closest to the median step time,
    ignoring the worker's first step when there are others (it carries warm-up work).

    Ties go to the later step.
    """
    worker = worker or sorted(run.workers)[0]
    entries = list(run.worker(worker).meta.steps)
    if not entries:
        raise ValueError(f"worker {worker} has no steps")
    times = step_times_ms(run, worker)
    candidates = [e.step for e in entries]
    if len(candidates) > 1:
        candidates = candidates[1:]
    median = float(np.median([times[s] for s in candidates]))
    return min(candidates, key=lambda s: (abs(times[s] - median), -s))


def resolve_steps(run: Run, steps: Iterable[int] | None) -> list[int]:
    """The steps to analyse: the given ones that exist, or every step of the run."""
    available = run.steps
    if steps is None:
        return available
    wanted = sorted(set(int(s) for s in steps))
    missing = [s for s in wanted if s not in available]
    if missing:
        raise ValueError(f"run {run.path} has no step(s) {missing}; it has {available}")
    return wanted


def resolve_workers(run: Run, workers: Iterable[str] | None) -> list[str]:
    if workers is None:
        return sorted(run.workers)
    names = list(workers)
    for w in names:
        run.worker(w)  # raises KeyError naming the run
    return names


def iter_selected(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> Iterator[tuple[str, StepData]]:
    """(worker, step) pairs of the selection, one step file in memory at a time."""
    chosen = set(resolve_steps(run, steps))
    for w in resolve_workers(run, workers):
        for s in run.worker(w).steps:
            if s in chosen:
                yield w, run.load_step(w, s)
