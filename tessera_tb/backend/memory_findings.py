"""Memory findings: device allocations that cost step time (docs/FINDINGS.md).

- `allocator_calls`: calls of the CUDA allocator inside the step (`cudaMalloc`, `cudaFree`,
  `cudaMallocAsync`, `cudaFreeAsync`, `cuMemAlloc*`, `cuMemFree*`, `cuMemCreate`, `cuMemMap`,
  `cuMemUnmap`, `cuMemRelease`). PyTorch's caching allocator makes them only when its cache
  cannot serve a request (first steps, growing shapes, or fragmentation: reserved memory in
  blocks too small for the request, which it frees, `cudaFree` synchronising the device, and
  allocates again). Evidence: count and time per call name, the ops that made them, and the
  step's peak reserved and allocated bytes (`[memory]` events' `Total Reserved`/`Total
  Allocated`, METRICS.md "Derived kernel figures": memory) with their difference. Win: the
  calls' host time, at most the step's GPU idle time (the launching thread is blocked in
  them; that can only show in the step as GPU idle).
"""

from __future__ import annotations

import numpy as np

from tessera_tb.trace.step import KIND, StepData

ALLOCATOR_CALLS = (
    "cudaMalloc",
    "cudaFree",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cuMemAlloc",
    "cuMemAlloc_v2",
    "cuMemFree",
    "cuMemFree_v2",
    "cuMemCreate",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemRelease",
)
TOP_ITEMS = 3


def _max_attr(step: StepData, key: str) -> float:
    a = step.attrs_by_key.get(key)
    if a is None or a.rows.size == 0 or a.type not in ("int64", "float64"):
        return float("nan")
    return float(np.max(a.values))


def memory_finding_numbers(step: StepData, gpu_idle_ns: int) -> dict[tuple[str, str], dict]:
    """The numbers of `allocator_calls` for one step, keyed ("allocator_calls", ""), with
    `win_ns`, `span_ns` and `items` (per call name: count, time); absent without such calls."""
    ev = step.events
    calls = np.flatnonzero(np.isin(ev["kind"], [KIND["runtime"], KIND["driver"]]))
    names = step.string_values(ev["name_id"][calls])
    mine = np.isin(names, ALLOCATOR_CALLS)
    calls, names = calls[mine], names[mine]
    if calls.size == 0:
        return {}
    start = np.maximum(ev["start_ns"][calls], step.start_ns)
    end = np.minimum(ev["start_ns"][calls] + ev["dur_ns"][calls], step.end_ns)
    dur = np.maximum(end - start, 0)
    host_ns = float(dur.sum())
    items = []
    for name in np.unique(names).tolist():
        m = names == name
        items.append({"call": name, "count": int(m.sum()), "dur_ns": float(dur[m].sum())})
    items.sort(key=lambda it: -it["dur_ns"])
    ops: dict[str, int] = {}
    for c in calls.tolist():
        p = int(ev["parent"][c])
        outer = ""
        while p >= 0:
            if ev["kind"][p] == KIND["cpu_op"]:
                outer = step.strings[ev["name_id"][p]]
            p = int(ev["parent"][p])
        if outer:
            ops[outer] = ops.get(outer, 0) + 1
    reserved = _max_attr(step, "Total Reserved")
    allocated = _max_attr(step, "Total Allocated")
    return {
        ("allocator_calls", ""): {
            "win_ns": min(host_ns, float(gpu_idle_ns)),
            "span_ns": step.span_ns,
            "count": float(calls.size),
            "host_ns": host_ns,
            "gpu_idle_ns": float(gpu_idle_ns),
            "peak_reserved_bytes": reserved,
            "peak_allocated_bytes": allocated,
            "items": items[:TOP_ITEMS],
            "ops": sorted(ops.items(), key=lambda kv: -kv[1])[:TOP_ITEMS],
            # Where the link zooms the timeline: the longest call.
            "window_ns": [int(start[np.argmax(dur)]), int(end[np.argmax(dur)])],
        }
    }


def describe_memory_finding(kind: str, n: dict) -> tuple[str, str]:
    """(title, evidence) of `allocator_calls`; ValueError for another kind."""
    if kind != "allocator_calls":
        raise ValueError(f"unknown finding kind {kind!r}")
    calls = ", ".join(
        f"{it['call']} x{it['count']} {it['dur_ns'] / 1e6:.2f} ms" for it in n.get("items", [])
    )
    ops = ", ".join(f"{op} x{c}" for op, c in n.get("ops", [])) or "no cpu op"
    title = (
        f"{n['count']:.0f} CUDA allocator calls in the step block the host "
        f"{n['host_ns'] / 1e6:.2f} ms"
    )
    evidence = f"{calls} (made under {ops})."
    res, alloc = n.get("peak_reserved_bytes", np.nan), n.get("peak_allocated_bytes", np.nan)
    if np.isfinite(res) and np.isfinite(alloc):
        evidence += (
            f" Peak reserved {res / 1e9:.2f} GB vs allocated {alloc / 1e9:.2f} GB "
            f"({(res - alloc) / 1e9:.2f} GB cached but unused)."
        )
    evidence += (
        f" Win: their host time, at most the GPU idle {n['gpu_idle_ns'] / 1e6:.2f} ms. Keep "
        f"shapes stable, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so that the "
        f"cache is not freed and refilled"
    )
    return title, evidence
