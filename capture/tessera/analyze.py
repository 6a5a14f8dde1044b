"""`tessera.analyze`: the analyses as pandas DataFrames, for notebooks and scripts.

Every function takes `trace`: a run directory, an open `Run`, a PyTorch profiler (Kineto)
JSON, or a Chrome trace JSON (imported once into a cache; see
`tessera_tb.trace.open_trace`), plus optional `workers` and `steps` selections. They are thin
faces over `tessera_tb.backend`: the numbers are the ones the TensorBoard plugin and
`tessera-prof report` show, from the same functions. Column definitions are in each backend
function's docstring and in ../shared/docs/METRICS.md.

    from tessera import analyze
    analyze.roofline(trace="demo_runs/gpt_1gpu", arch="sm90")
    analyze.stalls(trace="demo_runs/gpt_1gpu", group_by="kernel")
    analyze.collectives(trace="demo_runs/fsdp_gpt_4rank", min_bytes=64 << 20)
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pandas as pd

from tessera_tb.backend import breakdown as _breakdown
from tessera_tb.backend import collectives as _collectives
from tessera_tb.backend import divergence as _divergence
from tessera_tb.backend import findings as _findings
from tessera_tb.backend import memory as _memory
from tessera_tb.backend import roofline as _roofline
from tessera_tb.backend import stalls as _stalls
from tessera_tb.backend import summary as _summary
from tessera_tb.backend import topk as _topk
from tessera_tb.trace.open_trace import open_trace
from tessera_tb.trace.reader import Run

Trace = str | os.PathLike | Run
Workers = Iterable[str] | None
Steps = Iterable[int] | None

__all__ = [
    "breakdown",
    "collectives",
    "divergence",
    "findings",
    "kernels",
    "memory",
    "ops",
    "roofline",
    "stalls",
    "summary",
    "topk",
]


def summary(trace: Trace, *, workers: Workers = None, steps: Steps = None) -> pd.DataFrame:
    """Per worker: median step time, GPU busy %, tensor-core % (estimated), occupancy over the
    steps (default: the steady-state step). See `tessera_tb.backend.summary.summary`."""
    return _summary.summary(open_trace(trace), workers, steps)


def breakdown(
    trace: Trace, *, workers: Workers = None, steps: Steps = None, data_regions: Iterable[str] = ()
) -> pd.DataFrame:
    """Step time breakdown per worker and step: compute, collective, memcpy, memset, runtime,
    data loading, other host work and idle, in ns and %, summing to the step span.
    See `tessera_tb.backend.breakdown.step_time_breakdown`."""
    return _breakdown.step_time_breakdown(open_trace(trace), workers, steps, data_regions)


def findings(
    trace: Trace, *, workers: Workers = None, steps: Steps = None, data_regions: Iterable[str] = ()
) -> pd.DataFrame:
    """What could be won back, ranked by ms per step, with evidence.
    See `tessera_tb.backend.findings.findings`."""
    return _findings.findings(open_trace(trace), workers, steps, data_regions)


def ops(
    trace: Trace,
    *,
    k: int | None = 20,
    sort: str | None = None,
    search: str | None = None,
    by_input_dims: bool = False,
    workers: Workers = None,
    steps: Steps = None,
) -> pd.DataFrame:
    """Operators by self time (host and device), top `k` plus an "(other)" row.
    See `tessera_tb.backend.topk.op_table`."""
    return _topk.op_table(
        open_trace(trace),
        workers,
        steps,
        by_input_dims=by_input_dims,
        sort=sort,
        k=k,
        search=search,
    )


def kernels(
    trace: Trace,
    *,
    k: int | None = 20,
    sort: str = "total_dur_ns",
    search: str | None = None,
    workers: Workers = None,
    steps: Steps = None,
) -> pd.DataFrame:
    """Kernels by total time: calls, total/mean/min/max, launch configuration, owning op.
    See `tessera_tb.backend.topk.kernel_table`."""
    return _topk.kernel_table(open_trace(trace), workers, steps, sort=sort, k=k, search=search)


def topk(
    trace: Trace,
    *,
    what: str = "ops",
    k: int | None = 20,
    sort: str | None = None,
    search: str | None = None,
    workers: Workers = None,
    steps: Steps = None,
) -> pd.DataFrame:
    """`ops(...)` or `kernels(...)` by `what`."""
    if what == "ops":
        return ops(trace, k=k, sort=sort, search=search, workers=workers, steps=steps)
    if what == "kernels":
        return kernels(
            trace, k=k, sort=sort or "total_dur_ns", search=search, workers=workers, steps=steps
        )
    raise ValueError(f"what={what!r}: use 'ops' or 'kernels'")


def roofline(
    trace: Trace,
    *,
    arch: str | None = None,
    group_by: str = "kernel",
    workers: Workers = None,
    steps: Steps = None,
) -> pd.DataFrame:
    """One point per kernel name (or per op with group_by="op"): FLOP/byte, FLOP/s, time,
    efficiency against dense peaks, headroom, and where FLOPs and bytes came from (measured
    counters vs derived from shapes). `arch`: a device name ("h100-sxm", "h200") or a compute
    capability ("sm90"; the likeliest device is picked and named in the `peaks_note` attr).
    The roofs are in `result.attrs["roofs"]`. See `tessera_tb.backend.roofline.roofline`."""
    run = open_trace(trace)
    table = _roofline.roofline(run, workers=workers, steps=steps, arch=arch, group_by=group_by)
    worker = sorted(run.workers)[0] if workers is None else list(workers)[0]
    peaks = _roofline.run_peaks(run, worker, arch)
    table.attrs["roofs"] = _roofline.roofs(peaks)
    table.attrs["device"] = peaks.name
    table.attrs["peaks_note"] = getattr(peaks, "note", "")
    return table


def stalls(
    trace: Trace, *, group_by: str = "kernel", workers: Workers = None, steps: Steps = None
) -> pd.DataFrame:
    """Warp stall breakdown (memory / dependency / structural, with reasons) from Nsight
    Compute counters, weighted by issued instructions. Without counters the table is empty and
    `result.attrs` holds `missing_counters` and the `collect_command` that collects them.
    See `tessera_tb.backend.stalls.stall_breakdown`."""
    result = _stalls.stall_breakdown(
        open_trace(trace), workers=workers, steps=steps, group_by=group_by
    )
    table = result.table
    table.attrs.update(
        available=result.available,
        missing_counters=result.missing_counters,
        collect_command=result.collect_command,
        note=result.note,
    )
    return table


def divergence(
    trace: Trace, *, threshold: float = 0.2, workers: Workers = None, steps: Steps = None
) -> pd.DataFrame:
    """Kernels whose warp divergence exceeds `threshold` (a fraction), heaviest time first.
    See `tessera_tb.backend.divergence.divergence`."""
    return _divergence.divergence(
        open_trace(trace), workers=workers, steps=steps, threshold=threshold
    )


def collectives(
    trace: Trace,
    *,
    min_bytes: int = 0,
    workers: Workers = None,
    steps: Steps = None,
    dask=None,
) -> pd.DataFrame:
    """Collective instances across ranks: type, size, transfer and wait times, algbw/busbw
    (nccl-tests factors), straggler. Mismatched instances are in `result.attrs["mismatches"]`,
    the per-rank straggler table in `result.attrs["stragglers"]`.
    `dask`: a Dask scheduler (`tcp://host:8786`, `local:N`, or a `distributed.Client`) that
    reads the step files, one task per rank (pip install 'tessera-profiler[dask]').
    See `tessera_tb.backend.collectives.analyze_collectives`."""
    a = _collectives.analyze_collectives(open_trace(trace), workers, steps, min_bytes, dask=dask)
    instances = a.instances
    instances.attrs["mismatches"] = a.mismatches
    instances.attrs["stragglers"] = _collectives.stragglers(None, analysis=a)
    return instances


def memory(trace: Trace, *, workers: Workers = None, steps: Steps = None) -> pd.DataFrame:
    """The memory peak per device with the op (and stack) behind it; the timeline and the
    allocation table are `tessera_tb.backend.memory.memory_timeline` / `allocation_table`."""
    return _memory.memory_peaks(open_trace(trace), workers, steps)
