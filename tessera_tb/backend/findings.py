"""Findings: problems a user can act on, each with the ms per step it could win back.

Each finding has a kind, a title, `win_ms_per_step` (the time it could win back, defined per
kind below), evidence (numbers and where they come from) and a severity. Findings are ranked
by `win_ms_per_step`; a finding whose win is below `min_win_pct` of the step time is not
reported, so a healthy run gets none. Over a step range every number is the median over the
steps (a step where a kind does not occur counts as 0).

Kinds and their win (all on the step span, METRICS.md "Time"; the categories are those of
`backend.breakdown`):

- `gpu_idle_host_bound`: GPU idle while a launching thread is busy in runtime calls or CPU ops:
  the breakdown's `runtime_ns + host_other_ns`. Evidence adds the CPU ops with the most self
  time during GPU idle (self time: the op's interval minus its children's).
- `dataloader_stall`: GPU idle while a launching thread is in data loading: `dataloader_ns`.
- `exposed_collective` (one per `Collective name`): time a collective kernel of that type runs
  with no compute kernel on the same device: |union(collective_d) - union(compute_d)| summed
  over devices. A simple overlap by interval arithmetic; the kernel durations include waiting
  for other ranks (METRICS.md, "Collectives"), so part of the win may be load imbalance.
- `launch_bound_kernels`: kernels shorter than their launch call (launch calls that start one
  device event only; graph launches are left out). Win: the sum of (launch duration - kernel
  duration) over them, at most the step's GPU idle time, since the gaps can only show as
  GPU idle.
- `pageable_memcpy`: copies from or to pageable host memory (CUPTI's copy kind in the memcpy
  name: "Pageable"): they cannot overlap with compute and block the host. Win: their time with
  no compute kernel on the same device, as for collectives.
- `low_tensor_core_share`: kernels of matmul/conv/attention ops without fp16/bf16/fp8 inputs
  (`summary.tensor_core_eligible_kernels`, estimated). Win: their time x (1 - 1/7), an upper
  bound: 7 is about the dense tf32/fp32 peak ratio of every device in METRICS.md ("Peaks":
  6.97 to 8).
- `unrecorded_idle`: neither device work nor any recorded host range on a launching thread:
  the breakdown's `idle_ns` (un-instrumented host work, waits on I/O or on other processes).
- `collective_straggler` (several workers; one per straggling worker, on that worker): the
  worker is the straggler (the member the others waited for, METRICS.md "Collectives") of
  at least `STRAGGLER_OVER_FAIR_SHARE` x its fair share (100 / group size %) of the complete
  collective instances it is in. Win: the other members' wait in those instances
  (`collectives.stragglers`' others_wait_ns) per step and per other rank: what each of them
  would get back if the worker arrived with the rest.
- Kernel-level kinds (`gemm_below_roof`, `host_sync`, `tiny_kernels`, `unfused_optimizer`):
  `kernel_findings`; `allocator_calls`: `memory_findings`.
- `kernel_counters` (one per kernel, only with Nsight Compute counters): the kernel's largest
  stall reasons and DRAM % of peak; win: its speed-of-light headroom (`counter_findings`).

Severity: "high" when the win is at least 10% of the step, "medium" at least 5%, else "low".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import quote

import numpy as np
import pandas as pd

from tessera_tb.backend.breakdown import (
    CATEGORIES,
    category_intervals,
    iter_with_neighbours,
    priority_cover_ns,
    window_events,
)
from tessera_tb.backend.counter_findings import counter_findings
from tessera_tb.backend.devices import DevicePeaks
from tessera_tb.backend.intervals import union_length_ns
from tessera_tb.backend.kernel_findings import (
    describe_kernel_finding,
    kernel_finding_numbers,
    kernel_finding_view,
)
from tessera_tb.backend.memory_findings import describe_memory_finding, memory_finding_numbers
from tessera_tb.backend.selection import resolve_workers, steady_state_step
from tessera_tb.backend.summary import tensor_core_family_op
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import DEVICE_WORK_KINDS, HOST_TREE_KINDS, KIND, StepData

MIN_WIN_PCT = 2.0
STRAGGLER_OVER_FAIR_SHARE = 1.5
TF32_OVER_FP32_PEAK = 7.0
TOP_OPS = 3
# Element sizes of the NCCL `dtype` arg (torch scalar type names).
DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Int": 4,
    "Long": 8,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
}

FINDING_COLUMNS = [
    "worker",
    "rank",
    "steps",
    "kind",
    "subject",
    "title",
    "win_ms_per_step",
    "win_pct_of_step",
    "severity",
    "evidence",
    "numbers",
    "link",
]
# The plugin view that shows each step-time kind (state keys of the tab's URL hash).
_KIND_VIEWS = {
    "gpu_idle_host_bound": {"view": "timeline"},
    "dataloader_stall": {"view": "timeline", "q": "enumerate(DataLoader)"},
    "unrecorded_idle": {"view": "timeline"},
    "exposed_collective": {"view": "collectives"},
    "launch_bound_kernels": {"view": "kernels", "sort": "calls"},
    "pageable_memcpy": {"view": "timeline", "q": "Pageable"},
    "low_tensor_core_share": {"view": "roofline", "level": "op"},
    "collective_straggler": {"view": "collectives", "metric": "wait"},
    "allocator_calls": {"view": "timeline", "q": "cudaFree"},
    "kernel_counters": {"view": "stalls"},
}


def _num_attr(step: StepData, key: str, rows: np.ndarray) -> np.ndarray:
    a = step.attrs_by_key.get(key)
    out = np.full(rows.size, np.nan)
    if a is None or a.rows.size == 0 or a.type not in ("int64", "float64"):
        return out
    pos = np.minimum(np.searchsorted(a.rows, rows), a.rows.size - 1)
    hit = a.rows[pos] == rows
    out[hit] = a.values[pos[hit]]
    return out


def _str_attr(step: StepData, key: str, rows: np.ndarray) -> np.ndarray:
    a = step.attrs_by_key.get(key)
    out = np.full(rows.size, "", dtype=object)
    if a is None or a.rows.size == 0 or a.type != "string":
        return out
    pos = np.minimum(np.searchsorted(a.rows, rows), a.rows.size - 1)
    hit = a.rows[pos] == rows
    out[hit] = step.string_values(a.values[pos[hit]])
    return out


def _clipped_dur(step: StepData, rows: np.ndarray) -> np.ndarray:
    start = step.events["start_ns"][rows]
    end = start + step.events["dur_ns"][rows]
    return np.maximum(np.minimum(end, step.end_ns) - np.maximum(start, step.start_ns), 0)


def _exposed_ns(step: StepData, window: dict, rows: np.ndarray) -> int:
    """Time the step's events `rows` run with no compute kernel on their device, summed over
    devices (a device's own compute kernels from the window, neighbours included)."""
    dev_of_track = np.array([t.device for t in step.tracks], dtype=np.int64)
    devices = dev_of_track[step.events["track_id"][rows]]
    start = step.events["start_ns"][rows]
    end = start + step.events["dur_ns"][rows]
    compute = window["kind"] == KIND["kernel"]
    total = 0
    for d in np.unique(devices).tolist():
        c = compute & (window["device"] == d)
        m = devices == d
        cover = priority_cover_ns(
            step.start_ns,
            step.end_ns,
            [(window["start_ns"][c], window["end_ns"][c]), (start[m], end[m])],
        )
        total += int(cover[1])
    return total


def _exposed_by_bucket(
    step: StepData, window: dict, rows: np.ndarray, size_bytes: np.ndarray
) -> list[dict]:
    """Exposed time (as `_exposed_ns`) of one collective type's kernels per power-of-two
    message-size bucket (`collectives.size_bucket_label`), most exposed first: which
    messages to overlap or bucket differently."""
    from tessera_tb.backend.collectives import size_bucket_label

    known = np.isfinite(size_bytes)
    lo = np.full(rows.size, -1, dtype=np.int64)
    positive = known & (size_bytes > 0)
    lo[known & (size_bytes == 0)] = 0
    lo[positive] = 2 ** np.floor(np.log2(size_bytes[positive])).astype(np.int64)
    out = []
    for b in np.unique(lo).tolist():
        m = lo == b
        out.append(
            {
                "bucket": size_bucket_label(b) if b >= 0 else "unknown size",
                "count": int(m.sum()),
                "exposed_ns": float(_exposed_ns(step, window, rows[m])),
            }
        )
    out.sort(key=lambda it: -it["exposed_ns"])
    return out[:TOP_OPS]


def _ops_by_time(step: StepData, ops: np.ndarray, dur_ns: np.ndarray) -> list[dict]:
    """The ops (name and Input Dims) whose kernels take the most of `dur_ns`, with their
    count and kernel time: evidence rows."""
    dims = step.attr("Input Dims")
    keys = [(step.strings[step.events["name_id"][o]], str(dims.get(o, ""))) for o in ops.tolist()]
    table: dict[tuple[str, str], list] = {}
    for key, o, d in zip(keys, ops.tolist(), dur_ns.tolist()):
        entry = table.setdefault(key, [set(), 0.0])
        entry[0].add(o)
        entry[1] += d
    ranked = sorted(table.items(), key=lambda kv: -kv[1][1])[:TOP_OPS]
    return [{"op": name, "dims": d, "count": len(v[0]), "dur_ns": v[1]} for (name, d), v in ranked]


def _gpu_idle_self_ns_by_op(step: StepData, window: dict) -> dict[str, int]:
    """GPU-idle self time of the step's cpu ops on launching threads, summed by op name.

    GPU idle here = the span minus the union of all device work and data loading ranges in the
    window (data loading is its own finding). An op's GPU-idle time is |op interval ∩ GPU
    idle|, computed for all host-tree events from a prefix sum of the idle set; its self part
    subtracts its direct children's.
    """
    lo, hi = step.start_ns, step.end_ns
    dev = np.isin(window["kind"], DEVICE_WORK_KINDS) | window["dataloader"]
    s = np.clip(window["start_ns"][dev], lo, hi)
    e = np.clip(window["end_ns"][dev], lo, hi)
    keep = e > s
    s, e = s[keep], e[keep]
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    if s.size:
        reach = np.maximum.accumulate(e)
        new = np.concatenate([[True], s[1:] > reach[:-1]])
        seg_s = s[new]
        seg_e = np.maximum.reduceat(e, np.flatnonzero(new))
    else:
        seg_s = seg_e = np.zeros(0, dtype=np.int64)
    busy_before = np.concatenate([[0], np.cumsum(seg_e - seg_s)])

    def idle_until(x: np.ndarray) -> np.ndarray:
        """GPU idle ns in [lo, x)."""
        x = np.clip(x, lo, hi)
        if not seg_s.size:
            return x - lo
        i = np.searchsorted(seg_s, x, "right")  # busy segments starting at or before x
        j = np.maximum(i - 1, 0)
        busy = np.where(i > 0, busy_before[j] + np.minimum(x, seg_e[j]) - seg_s[j], 0)
        return (x - lo) - busy

    ev = step.events
    own = window["source"] == 0
    rows = window["row"][own & window["on_launcher"]]
    rows = rows[np.isin(ev["kind"][rows], HOST_TREE_KINDS)]
    start = ev["start_ns"][rows]
    overlap = idle_until(start + ev["dur_ns"][rows]) - idle_until(start)
    self_ns = np.zeros(ev["kind"].size, dtype=np.int64)
    self_ns[rows] = overlap
    parent = ev["parent"][rows]
    has_parent = parent >= 0
    np.subtract.at(self_ns, parent[has_parent], overlap[has_parent])
    ops = rows[ev["kind"][rows] == KIND["cpu_op"]]
    frame = pd.DataFrame({"name_id": ev["name_id"][ops], "ns": self_ns[ops]})
    by_name = frame.groupby("name_id")["ns"].sum().sort_values(ascending=False)
    by_name = by_name[by_name > 0].head(TOP_OPS)
    return {step.strings[int(i)]: int(v) for i, v in by_name.items()}


def step_finding_numbers(
    step: StepData,
    neighbours: Sequence[StepData] = (),
    data_regions: Iterable[str] = (),
    peaks: DevicePeaks | None = None,
) -> dict[tuple[str, str], dict[str, float]]:
    """The numbers behind every finding kind for one step, before any threshold.

    Keys are (kind, subject) (subject: the collective type, else ""); values map number names
    to values, always with `win_ns` and `span_ns`; the kernel-level kinds
    (`kernel_findings`) add an `items` list of evidence rows. Kinds that cannot occur in the
    step (no collectives, no pageable copy, ...) are absent. `peaks`: the device's peaks,
    needed by `gemm_below_roof` (without them that kind is skipped).
    """
    window = window_events(step, neighbours, data_regions)
    intervals = category_intervals(window)
    cover = priority_cover_ns(step.start_ns, step.end_ns, [intervals[c] for c in CATEGORIES[:-1]])
    ns = dict(zip(CATEGORIES, (int(v) for v in cover)))
    span = step.span_ns
    gpu_idle = ns["runtime"] + ns["dataloader"] + ns["host_other"] + ns["idle"]
    out: dict[tuple[str, str], dict[str, float]] = {}

    host_busy = ns["runtime"] + ns["host_other"]
    numbers = {
        "win_ns": host_busy,
        "span_ns": span,
        "gpu_idle_ns": gpu_idle,
        "runtime_ns": ns["runtime"],
        "host_other_ns": ns["host_other"],
    }
    for name, v in _gpu_idle_self_ns_by_op(step, window).items():
        numbers[f"op_self_ns:{name}"] = v
    out[("gpu_idle_host_bound", "")] = numbers
    out[("dataloader_stall", "")] = {
        "win_ns": ns["dataloader"],
        "span_ns": span,
        "gpu_idle_ns": gpu_idle,
        "dataloader_ns": ns["dataloader"],
    }
    out[("unrecorded_idle", "")] = {"win_ns": ns["idle"], "span_ns": span, "idle_ns": ns["idle"]}

    ev = step.events
    kind = ev["kind"]
    coll = np.flatnonzero(kind == KIND["collective"])
    if coll.size:
        names = _str_attr(step, "Collective name", coll)
        names[names == ""] = "unknown"
        nelems = np.fmax(
            _num_attr(step, "In msg nelems", coll), _num_attr(step, "Out msg nelems", coll)
        )
        elem = np.array(
            [DTYPE_BYTES.get(d, np.nan) for d in _str_attr(step, "dtype", coll)], dtype=float
        )
        size = nelems * elem
        for name in np.unique(names).tolist():
            rows = coll[names == name]
            starts = ev["start_ns"][rows]
            out[("exposed_collective", name)] = {
                "win_ns": _exposed_ns(step, window, rows),
                "span_ns": span,
                "count": rows.size,
                "kernel_ns": int(_clipped_dur(step, rows).sum()),
                "union_ns": union_length_ns(
                    starts, starts + ev["dur_ns"][rows], step.start_ns, step.end_ns
                ),
                "size_bytes": float(size[names == name].sum()),
                "items": _exposed_by_bucket(step, window, rows, size[names == name]),
            }

    kernels = np.flatnonzero(kind == KIND["kernel"])
    launch = ev["launch"][kernels]
    device_work = np.flatnonzero(np.isin(kind, DEVICE_WORK_KINDS) & (ev["launch"] >= 0))
    per_launch = np.bincount(ev["launch"][device_work], minlength=kind.size)
    single = launch >= 0
    single[single] = per_launch[launch[single]] == 1
    k_rows, l_rows = kernels[single], launch[single]
    gap = ev["dur_ns"][l_rows] - ev["dur_ns"][k_rows]
    bound = gap > 0
    if bound.any():
        out[("launch_bound_kernels", "")] = {
            "win_ns": min(int(gap[bound].sum()), gpu_idle),
            "span_ns": span,
            "gap_ns": int(gap[bound].sum()),
            "gpu_idle_ns": gpu_idle,
            "count": int(bound.sum()),
            "kernels": int(kernels.size),
            "median_kernel_ns": float(np.median(ev["dur_ns"][k_rows[bound]])),
            "median_launch_ns": float(np.median(ev["dur_ns"][l_rows[bound]])),
        }

    copies = np.flatnonzero(kind == KIND["memcpy"])
    if copies.size:
        ids = np.unique(ev["name_id"][copies])
        pageable_ids = ids[["Pageable" in step.strings[i] for i in ids.tolist()]]
        rows = copies[np.isin(ev["name_id"][copies], pageable_ids)]
        if rows.size:
            dur = ev["dur_ns"][rows]
            nbytes = _num_attr(step, "bytes", rows)
            out[("pageable_memcpy", "")] = {
                "win_ns": _exposed_ns(step, window, rows),
                "span_ns": span,
                "count": rows.size,
                "copy_ns": int(_clipped_dur(step, rows).sum()),
                "size_bytes": float(np.nansum(nbytes)),
                "gb_per_s": float(np.nansum(nbytes) / dur.sum()) if dur.sum() else np.nan,
            }

    family = tensor_core_family_op(step)
    if family is not None:
        rows, op, low_precision_row = family
        in_family = op >= 0
        tensor_core = np.zeros(rows.size, dtype=bool)
        tensor_core[in_family] = low_precision_row[op[in_family]]
        dur = _clipped_dur(step, rows)
        family_ns = int(dur[in_family].sum())
        other = in_family & ~tensor_core
        other_ns = int(dur[other].sum())
        if other_ns:
            out[("low_tensor_core_share", "")] = {
                "win_ns": other_ns * (1.0 - 1.0 / TF32_OVER_FP32_PEAK),
                "span_ns": span,
                "family_ns": family_ns,
                "no_tensor_core_ns": other_ns,
                "items": _ops_by_time(step, op[other], dur[other]),
            }
    out.update(kernel_finding_numbers(step, window, gpu_idle, peaks))
    out.update(memory_finding_numbers(step, gpu_idle))
    return out


def _severity(pct: float) -> str:
    return "high" if pct >= 10 else "medium" if pct >= 5 else "low"


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.0f} MB" if np.isfinite(nbytes) else "unknown size"


def _describe(kind: str, subject: str, n: dict[str, float], where: str) -> tuple[str, str]:
    """(title, evidence) from a finding's (median) numbers."""
    span = n["span_ns"]
    pct = lambda v: 100.0 * v / span if span else float("nan")  # noqa: E731
    if kind == "gpu_idle_host_bound":
        ops = sorted(
            ((k.split(":", 1)[1], v) for k, v in n.items() if k.startswith("op_self_ns:") and v),
            key=lambda kv: -kv[1],
        )
        share = n["win_ns"] / n["gpu_idle_ns"] if n["gpu_idle_ns"] else 0.0
        how = "mostly" if share >= 0.5 else "partly"
        title = (
            f"GPU idle {pct(n['gpu_idle_ns']):.0f}% of {where}, {how} waiting on host CPU work "
            f"and launches"
        )
        evidence = (
            f"GPU idle {_ms(n['gpu_idle_ns'])} of the {_ms(span)} step (span minus the union of "
            f"kernels, collectives, memcpys, memsets); during it the launching threads were in "
            f"CPU ops {_ms(n['host_other_ns'])} and in runtime/driver calls "
            f"{_ms(n['runtime_ns'])} (step time breakdown)"
        )
        if ops:
            listed = ", ".join(f"{name} {_ms(v)}" for name, v in ops[:TOP_OPS])
            evidence += (
                f"; CPU ops with the most self time while the GPU was idle (data loading "
                f"excluded): {listed}"
            )
        return title, evidence
    if kind == "dataloader_stall":
        title = f"Data loading stalls the GPU {_ms(n['win_ns'])} per step ({pct(n['win_ns']):.0f}%)"
        evidence = (
            f"{_ms(n['dataloader_ns'])} of the {_ms(span)} step the GPU had no work while a "
            f"launching thread was inside enumerate(DataLoader) or a data region (step time "
            f"breakdown, dataloader category)"
        )
        return title, evidence
    if kind == "unrecorded_idle":
        title = f"GPU and host both idle {_ms(n['win_ns'])} per step ({pct(n['win_ns']):.0f}%)"
        evidence = (
            f"{_ms(n['idle_ns'])} of the {_ms(span)} step had no device work and no recorded op "
            f"on any launching thread (step time breakdown, idle category): un-instrumented host "
            f"work, I/O or waits on other processes"
        )
        return title, evidence
    if kind == "exposed_collective":
        title = f"{subject} of {_mb(n['size_bytes'])} not overlapped with compute"
        overlap = 1.0 - n["win_ns"] / n["union_ns"] if n["union_ns"] else float("nan")
        evidence = (
            f"{n['count']:.0f} {subject} kernels, {_ms(n['kernel_ns'])} of kernel time; "
            f"{_ms(n['win_ns'])} of it with no compute kernel on the same device "
            f"({100 * overlap:.0f}% overlapped); size = max(In, Out msg nelems) x dtype size; "
            f"kernel time includes waiting for other ranks"
        )
        buckets = n.get("items") or []
        if buckets:
            listed = ", ".join(
                f"{b['bucket']} x{b['count']} {_ms(b['exposed_ns'])}" for b in buckets
            )
            evidence += f"; exposed by message size: {listed}"
        return title, evidence
    if kind == "launch_bound_kernels":
        title = f"{n['count']:.0f} kernels shorter than their launch call (launch-bound)"
        evidence = (
            f"{n['count']:.0f} of {n['kernels']:.0f} kernels ran shorter than the runtime call "
            f"that launched them (median {n['median_kernel_ns'] / 1e3:.1f} us on the GPU vs "
            f"{n['median_launch_ns'] / 1e3:.1f} us to launch); launch minus kernel time sums to "
            f"{_ms(n['gap_ns'])}, counted up to the GPU idle time {_ms(n['gpu_idle_ns'])}: "
            f"fuse kernels or capture them in a CUDA graph"
        )
        return title, evidence
    if kind == "pageable_memcpy":
        title = f"{n['count']:.0f} copies from/to pageable host memory"
        evidence = (
            f"{n['count']:.0f} memcpys of {_mb(n['size_bytes'])} on pageable memory took "
            f"{_ms(n['copy_ns'])} ({n['gb_per_s']:.1f} GB/s), {_ms(n['win_ns'])} of it with no "
            f"compute kernel on the device: pin the host buffers (pin_memory=True) and copy "
            f"with non_blocking=True"
        )
        return title, evidence
    if kind == "low_tensor_core_share":
        share = 100.0 * n["no_tensor_core_ns"] / n["family_ns"] if n["family_ns"] else 0.0
        title = f"{share:.0f}% of matmul/conv/attention kernel time without tensor cores"
        evidence = (
            f"{_ms(n['no_tensor_core_ns'])} of {_ms(n['family_ns'])} of matmul/conv/attention "
            f"kernel time ran from ops without fp16/bf16/fp8 inputs (estimated from op input "
            f"types); the win assumes up to the {TF32_OVER_FP32_PEAK:.0f}x tf32/fp32 peak ratio: "
            f"use bf16 autocast or allow TF32"
        )
        ops = n.get("items") or []
        if ops:
            listed = "; ".join(
                f"{it['op']} {it['dims']} x{it['count']} {_ms(it['dur_ns'])}" for it in ops
            )
            evidence += f". Most time: {listed}"
        return title, evidence
    if kind == "collective_straggler":
        title = (
            f"{subject} arrives last at {n['straggler_pct']:.0f}% of collectives: the other "
            f"ranks wait {_ms(n['win_ns'])} per step for it"
        )
        listed = ", ".join(f"{t} x{c}" for t, c in n.get("items", []))
        evidence = (
            f"{subject} is the straggler (shortest member: the rank the others waited for) of "
            f"{n['n_straggler']:.0f} of the {n['n_instances']:.0f} complete collective "
            f"instances it is in ({listed}; fair share {100 / n['group_size']:.0f}%); the other "
            f"members waited {_ms(n['others_wait_ns'])} in them over {n['n_steps']:.0f} "
            f"steps, {_ms(n['win_ns'])} per step and per other rank (member duration minus "
            f"the instance's transfer time). Find what makes this rank late: its host time, "
            f"data loading, clocks or a slower link"
        )
        return title, evidence
    if kind == "allocator_calls":
        return describe_memory_finding(kind, n)
    return describe_kernel_finding(kind, n, where)


def finding_link(
    kind: str,
    subject: str,
    numbers: dict,
    run: str | None = None,
    worker: str | None = None,
    steps: Sequence[int] = (),
    origin_ns: int | None = None,
) -> str:
    """A deep link to the view and selection that show a finding: the tab's URL hash
    (`#tessera&t.run=...&t.workers=...&t.steps=...&t.view=...`, docs/PLUGIN.md), without the
    run and worker where they are not given. A timeline link of a finding with a
    `window_ns` ([start, end], epoch ns) also zooms to it: `t.t0`/`t.t1` are ns from
    `origin_ns`, the timeline's origin for these steps (the earliest start of the first step
    over the run's workers), with a tenth of the window's width on each side, and no search
    (which would hide the GPU idle around it)."""
    state = {"run": run, "workers": worker}
    if steps:
        lo, hi = min(steps), max(steps)
        state["steps"] = str(lo) if lo == hi else f"{lo}-{hi}"
    if kind in _KIND_VIEWS:
        state.update(_KIND_VIEWS[kind])
        if kind == "exposed_collective":
            state["q"] = subject
    else:
        state.update(kernel_finding_view(kind, numbers))
    window = numbers.get("window_ns")
    if state.get("view") == "timeline" and window and origin_ns is not None:
        pad = max((window[1] - window[0]) // 10, 1_000)
        state["t0"] = str(int(window[0] - origin_ns - pad))
        state["t1"] = str(int(window[1] - origin_ns + pad))
        state.pop("q", None)  # the window is the selection: keep the device work around it
    parts = [f"t.{k}={quote(str(v), safe='')}" for k, v in state.items() if v]
    return "#tessera&" + "&".join(parts)


def _rank_findings(
    per_step: list[dict[tuple[str, str], dict[str, float]]],
    where: str,
    min_win_pct: float,
    link_to: dict | None = None,
) -> list[dict]:
    """Median numbers over the steps, described and thresholded (callers sort)."""
    spans = [next(iter(f.values()))["span_ns"] for f in per_step if f]
    span = float(np.median(spans)) if spans else 0.0
    out = []
    for key in sorted({k for f in per_step for k in f}):
        names = sorted({name for f in per_step if key in f for name in f[key]})
        # Evidence lists and names (`items`, `region`) are not medians: they come from the
        # step whose win is the median one (the upper median over an even count).
        present = sorted((f[key]["win_ns"], i) for i, f in enumerate(per_step) if key in f)
        median_step = per_step[present[len(present) // 2][1]][key]
        numbers = {
            name: (
                median_step.get(name)
                if not isinstance(median_step.get(name, 0.0), (int, float))
                else float(np.median([f.get(key, {}).get(name, 0.0) for f in per_step]))
            )
            for name in names
        }
        numbers["span_ns"] = span
        win_pct = 100.0 * numbers["win_ns"] / span if span else 0.0
        if numbers["win_ns"] <= 0 or win_pct < min_win_pct:
            continue
        title, evidence = _describe(key[0], key[1], numbers, where)
        out.append(
            {
                "kind": key[0],
                "subject": key[1],
                "title": title,
                "win_ms_per_step": numbers["win_ns"] / 1e6,
                "win_pct_of_step": win_pct,
                "severity": _severity(win_pct),
                "evidence": evidence,
                "numbers": numbers,
                "link": finding_link(key[0], key[1], numbers, **(link_to or {})),
            }
        )
    return out


def _timeline_origin_ns(run: Run, steps: Sequence[int]) -> int | None:
    """The timeline's origin for these steps (`plugin_data.timeline_origin_ns`): the earliest
    start of the first of them over every worker of the run, from the step indexes."""
    if not steps:
        return None
    first = min(steps)
    starts = [e.start_ns for w in run.workers.values() for e in w.meta.steps if e.step == first]
    return min(starts) if starts else None


def _worker_peaks(run: Run, worker: str) -> DevicePeaks | None:
    """The worker's device peaks (`roofline.run_peaks`), None for a device not in the table."""
    from tessera_tb.backend.roofline import run_peaks

    try:
        return run_peaks(run, worker)
    except ValueError:
        return None


def straggler_findings(
    run: Run,
    workers: Sequence[str],
    steps_of: dict[str, tuple[int, ...]],
    span_of: dict[str, float],
    min_win_pct: float = MIN_WIN_PCT,
) -> list[dict]:
    """`collective_straggler` findings (module docstring) of the selected workers over their
    steps: rows with the columns of `findings`, one per straggling worker."""
    if len(workers) < 2:
        return []
    from tessera_tb.backend.collectives import analyze_collectives, stragglers

    all_steps = sorted({s for v in steps_of.values() for s in v})
    a = analyze_collectives(run, workers, all_steps)
    per = stragglers(None, analysis=a)
    m = a.members[a.members["complete"]]
    late = m[m["is_straggler"]]
    group_of = m.groupby("worker")["group_size"].median().astype("float64").to_dict()
    types_of = {
        w: late_w["collective_type"].fillna(late_w["collective_name"]).value_counts()
        for w, late_w in late.groupby("worker")
    }
    return _straggler_rows(
        per, group_of, types_of, steps_of, all_steps, span_of, min_win_pct, run.name
    )


def _straggler_rows(
    per: pd.DataFrame,
    group_of: dict[str, float],
    types_of: dict[str, pd.Series],
    steps_of: dict[str, tuple[int, ...]],
    all_steps: list[int],
    span_of: dict[str, float],
    min_win_pct: float,
    run_name: str | None,
) -> list[dict]:
    """`collective_straggler` rows from a `collectives.stragglers` table (`per`), each
    worker's median group size, the types of the instances it was late for, its steps and
    its median step span (ns)."""
    rows = []
    for r in per.itertuples(index=False):
        group = float(group_of.get(r.worker, 0.0))
        if group < 2 or r.straggler_pct < STRAGGLER_OVER_FAIR_SHARE * 100.0 / group:
            continue
        n_steps = len(steps_of.get(r.worker, ())) or len(all_steps)
        win_ns = r.others_wait_ns / (n_steps * (group - 1))
        span = span_of.get(r.worker, 0.0)
        pct = 100.0 * win_ns / span if span else 0.0
        if win_ns <= 0 or pct < min_win_pct:
            continue
        types = types_of.get(r.worker, pd.Series(dtype="int64"))
        numbers = {
            "win_ns": float(win_ns),
            "span_ns": span,
            "straggler_pct": float(r.straggler_pct),
            "n_straggler": float(r.n_straggler),
            "n_instances": float(r.n_instances),
            "others_wait_ns": float(r.others_wait_ns),
            "group_size": group,
            "n_steps": float(n_steps),
            "items": [(str(t), int(c)) for t, c in types.head(TOP_OPS).items()],
        }
        title, evidence = _describe("collective_straggler", r.worker, numbers, "")
        chosen = steps_of.get(r.worker, tuple(all_steps))
        rows.append(
            {
                "worker": r.worker,
                "rank": int(r.rank),
                "steps": chosen,
                "kind": "collective_straggler",
                "subject": r.worker,
                "title": title,
                "win_ms_per_step": win_ns / 1e6,
                "win_pct_of_step": pct,
                "severity": _severity(pct),
                "evidence": evidence,
                "numbers": numbers,
                "link": finding_link(
                    "collective_straggler", r.worker, numbers, run_name, None, chosen
                ),
            }
        )
    return rows


def index_straggler_findings(
    tables: dict[str, pd.DataFrame],
    workers: Sequence[str],
    steps: Sequence[int],
    run_name: str | None = None,
    min_win_pct: float = MIN_WIN_PCT,
) -> pd.DataFrame:
    """`collective_straggler` findings of the selected workers and steps from a run's derived
    index (`cross_rank.RunSummary.tables`: its rank_step straggler counts and step times, and
    its instances), without reading a step file: the same rule and numbers as
    `straggler_findings`, with instances matched over every rank of the run."""
    from tessera_tb.backend.collectives import stragglers_from_counts

    rs = tables["rank_step"]
    rs = rs[rs["worker"].isin(workers) & rs["step"].isin(steps)]
    counts = rs[rs["n_instances"] > 0]
    per = stragglers_from_counts(
        counts.assign(wait_ns=counts["wait_ns"].fillna(0).astype("int64"))[
            ["worker", "rank", "n_instances", "n_straggler", "wait_ns", "others_wait_ns"]
        ]
    )
    inst = tables["instances"]
    inst = inst[inst["complete"].astype(bool) & inst["step"].isin(steps)]
    group = float(inst["group_size"].astype("float64").median()) if len(inst) else 0.0
    # Only ranks that were ever last can make a finding: the per-rank lookups cover those.
    per = per[per["n_straggler"] > 0]
    late = set(per["worker"])
    group_of = {w: group for w in late}
    inst = inst[inst["straggler_worker"].isin(late)]
    types_of = {
        w: g["collective_type"].fillna(g["collective_name"]).value_counts()
        for w, g in inst.groupby("straggler_worker")
    }
    rs = rs[rs["worker"].isin(late)]
    steps_of = {w: tuple(sorted(int(s) for s in g["step"])) for w, g in rs.groupby("worker")}
    span_of = rs.groupby("worker")["step_time_ns"].median().astype("float64").to_dict()
    rows = _straggler_rows(
        per, group_of, types_of, steps_of, sorted(steps), span_of, min_win_pct, run_name
    )
    return pd.DataFrame(rows, columns=FINDING_COLUMNS)


def _where(steps: Sequence[int]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"steps {min(steps)}-{max(steps)} (median)"


def step_findings(
    step: StepData,
    neighbours: Sequence[StepData] = (),
    data_regions: Iterable[str] = (),
    min_win_pct: float = MIN_WIN_PCT,
    peaks: DevicePeaks | None = None,
) -> pd.DataFrame:
    """The findings of one step, ranked; columns as `findings` without worker, rank, steps."""
    per_step = [step_finding_numbers(step, neighbours, data_regions, peaks)]
    link_to = {"steps": [step.step], "origin_ns": step.start_ns}
    rows = _rank_findings(per_step, _where([step.step]), min_win_pct, link_to)
    cols = FINDING_COLUMNS[3:]
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values("win_ms_per_step", ascending=False, kind="stable").reset_index(drop=True)


def findings(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    data_regions: Iterable[str] = (),
    min_win_pct: float = MIN_WIN_PCT,
    collective_stragglers: bool = True,
) -> pd.DataFrame:
    """Findings per worker over a step range (numbers are medians over the steps), ranked by
    win_ms_per_step across workers. `collective_stragglers=False` leaves out the
    `collective_straggler` kind (a caller that has them from a run's derived index,
    `index_straggler_findings`, where instances span ranks not read here).

    `steps=None` means the default single step, `selection.steady_state_step` of the first
    selected worker. `data_regions`: names of annotations/regions that load data (besides
    `enumerate(DataLoader)*`). Columns: worker, rank, steps (tuple), kind, subject (the
    collective type for `exposed_collective`, else ""), title, win_ms_per_step,
    win_pct_of_step (of the median step time), severity, evidence (text), numbers (the
    median numbers the title and evidence were made from; ns unless named otherwise), link
    (`finding_link`: the plugin view and selection that show it).
    """
    names = resolve_workers(run, workers)
    if steps is None:
        steps = [steady_state_step(run, names[0])]
    regions = tuple(data_regions)
    per_worker: dict[str, list] = {w: [] for w in names}
    seen_steps: dict[str, list[int]] = {w: [] for w in names}
    peaks_of = {w: _worker_peaks(run, w) for w in names}
    for worker, step, neighbours in iter_with_neighbours(run, names, steps):
        per_worker[worker].append(step_finding_numbers(step, neighbours, regions, peaks_of[worker]))
        seen_steps[worker].append(step.step)
    rows = []
    for worker in names:
        if not per_worker[worker]:
            continue
        rank = int(run.worker(worker).meta.rank)
        chosen = tuple(seen_steps[worker])
        link_to = {
            "run": run.name,
            "worker": worker,
            "steps": chosen,
            "origin_ns": _timeline_origin_ns(run, chosen),
        }
        for f in _rank_findings(per_worker[worker], _where(chosen), min_win_pct, link_to):
            rows.append({"worker": worker, "rank": rank, "steps": chosen, **f})
    spans = {
        w: float(np.median([next(iter(f.values()))["span_ns"] for f in per_worker[w] if f]))
        for w in names
        if any(per_worker[w])
    }
    steps_of = {w: tuple(seen_steps[w]) for w in names}
    if collective_stragglers:
        rows += straggler_findings(run, names, steps_of, spans, min_win_pct)
    rows += counter_findings(
        run,
        names,
        steps_of,
        spans,
        min_win_pct,
        link=lambda kind, subject, n, worker, chosen: finding_link(
            kind, subject, n, run.name, worker, chosen
        ),
    )
    df = pd.DataFrame(rows, columns=FINDING_COLUMNS)
    return df.sort_values(
        ["win_ms_per_step", "worker"], ascending=[False, True], kind="stable"
    ).reset_index(drop=True)
