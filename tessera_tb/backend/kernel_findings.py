"""Kernel-level findings: what is wrong with the step's kernels and host syncs, why, and the ms
per step a fix wins back, estimated from the profiled run alone (METRICS.md, "Findings").

Each kind below has its rule, the evidence it cites and how its win is computed. All times
are the step's own events (device work of the neighbouring steps only decides whether the GPU
was idle); `findings.step_finding_numbers` merges these numbers with the step-time kinds and
`findings.findings` ranks them by win (medians over the steps).

- `gemm_below_roof`: matmul/conv ops with fp16/bf16/fp8 inputs whose kernels run below
  `FAR_BELOW_ROOF_PCT` of their roof (min(dense peak of the path, HBM BW x FLOPs/byte), FLOPs
  and compulsory bytes derived from the op's `Input Dims`: METRICS.md "Roofline"). Reasons
  from the trace: a kernel built for an older architecture than the device (`sm75`,
  `cutlass_80_`, ... in its name on an sm90 device), M/N/K (or conv channels) not multiples of
  16 bytes' worth of elements (8 for 16-bit types), a grid smaller than one wave of the
  device's SMs. Win: the op's kernel time minus its time at `ATTAINABLE_ROOF_FRACTION` of the
  roof (the bf16 GEMM ceiling measured on an H200: 788-798 of 989 dense TFLOP/s, METRICS.md
  "Peaks"), counted only for kernels with queued work behind them (the next device work starts
  within `QUEUED_GAP_NS` of their end, or they end the step): a faster kernel followed by GPU
  idle only lengthens the idle. fp32 inputs are `low_tensor_core_share` (findings.py).
- `host_sync`: calls that block the host until the GPU drains (`cudaStreamSynchronize`,
  `cudaDeviceSynchronize`, `cudaEventSynchronize`, synchronous `cudaMemcpy`), grouped by the
  op that made them (`aten::item`, `aten::_local_scalar_dense`, a `.cpu()` copy: the
  outermost cpu op around the call) and, with stacks, the innermost python frame. Win: the GPU
  idle that follows each: from the later of the call's start and the end of the last device
  work before it returns, to the start of the next device work (the queue is empty after a
  sync, so the GPU waits for the host to launch again); the union over the calls, so that
  syncs sharing one idle gap count it once.
- `tiny_kernels`: kernels shorter than `TINY_KERNEL_NS` launched by `aten::` ops that are not
  matmul/conv/attention ops, outside compiled regions and optimizer steps. The ops that launch
  nothing else are the fusion candidates. Win: their host time (the outermost op around each,
  counted once) minus one such op per run of consecutive candidates (what one fused kernel
  per run still costs), at most the step's GPU idle time: fusion removes host launch time,
  which shows in the step only as GPU idle.
- `unfused_optimizer`: an `Optimizer.step#...` region with no `_foreach_`/`_fused_` op (a
  per-parameter loop of small kernels). Win: the region's span (host start to the end of
  the last device work it launched) minus the union of its device work: a fused optimizer
  does at most the same device work in a few launches, and no per-parameter host loop.
"""

from __future__ import annotations

import json
import re

import numpy as np

from tessera_tb.backend.devices import DevicePeaks
from tessera_tb.backend.intervals import union_length_ns
from tessera_tb.backend.memory import innermost_containing
from tessera_tb.backend.roofline import derived_op_work
from tessera_tb.trace.step import DEVICE_WORK_KINDS, KIND, StepData

FAR_BELOW_ROOF_PCT = 40.0
ATTAINABLE_ROOF_FRACTION = 0.8
QUEUED_GAP_NS = 5_000
TINY_KERNEL_NS = 10_000
ALIGN_BYTES = 16  # cuBLAS/cuDNN tensor-core kernels want dims in 16-byte multiples
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
)
TENSOR_PATHS = ("bf16", "fp16", "fp8")
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
            "aten::matmul", "aten::linear"}  # fmt: skip
CONV_OP_PREFIXES = ("aten::conv", "aten::_conv", "aten::cudnn_conv")
ATTENTION_MARK = "attention"
COMPILED_REGION_PREFIXES = ("Torch-Compiled Region", "## Call CompiledFxGraph", "CompiledFunction")
OPTIMIZER_PREFIX = "Optimizer.step#"
_SKIP_PREFIXES = (OPTIMIZER_PREFIX, *COMPILED_REGION_PREFIXES)
TOP_ITEMS = 3
_ELEM_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8,
               "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}  # fmt: skip
# Architecture tags in cuBLAS/CUTLASS/cuDNN kernel names: sm80_xmma_..., cutlass_75_...,
# nvjet_sm90_..., sm90_xmma_...
_ARCH_TAG = re.compile(r"(?:^|[^a-z0-9])(?:sm_?|cutlass_)(\d)(\d)(?:[^0-9]|$)")


def kernel_arch_tag(name: str) -> int | None:
    """The compute capability a kernel was built for, from its name (75 for `cutlass_75_...`,
    80 for `sm80_xmma_...`), or None when the name carries no tag."""
    m = _ARCH_TAG.search(name.lower())
    return int(m.group(1)) * 10 + int(m.group(2)) if m else None


def device_arch(peaks: DevicePeaks) -> int:
    """Compute capability x 10 of a device in the peaks table (A100 80, H100/H200 90)."""
    return 80 if peaks.key.startswith("a100") else 90


def gemm_dims(name: str, dims_text: str) -> tuple[int, ...] | None:
    """(M, N, K) of a matmul op, or the (input channels, output channels) of a conv, from its
    `Input Dims` JSON; None when the shapes do not say."""
    try:
        dims = json.loads(dims_text) if dims_text else []
    except ValueError:
        return None
    shapes = [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    if name.startswith(CONV_OP_PREFIXES):
        if len(shapes) >= 2 and len(shapes[1]) >= 3:
            return (shapes[0][1], shapes[1][0])
        return None
    if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm"):
        shapes = shapes[1:]
    if len(shapes) < 2:
        return None
    a, b = shapes[0], shapes[1]
    if name == "aten::linear":
        return (int(np.prod(a[:-1])), b[0], a[-1]) if len(b) == 2 else None
    if len(a) < 2 or len(b) < 2:
        return None
    return (a[-2], b[-1], a[-1])


def _ancestors(parent: np.ndarray, row: int) -> list[int]:
    out = []
    while row >= 0:
        out.append(row)
        row = int(parent[row])
    return out


def _device_work(window: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, device) of all device work in the window, ordered by start."""
    m = np.isin(window["kind"], DEVICE_WORK_KINDS)
    order = np.argsort(window["start_ns"][m], kind="stable")
    return window["start_ns"][m][order], window["end_ns"][m][order], window["device"][m][order]


def _host_tree_columns(step: StepData) -> tuple[np.ndarray, np.ndarray]:
    """Per event row: the outermost cpu op above it (itself included; -1 if none) and whether
    it lies inside a compiled region or an optimizer step (itself included). Climbs the
    `parent` column one level per pass for all rows at once."""
    ev = step.events
    parent = ev["parent"].astype(np.int64)
    is_cpu = ev["kind"] == KIND["cpu_op"]
    skip_ids = np.array(
        [i for i, s in enumerate(step.strings) if s.startswith(_SKIP_PREFIXES)], dtype=np.int64
    )
    is_skip = np.isin(ev["name_id"], skip_ids)
    rows = np.arange(parent.size, dtype=np.int64)
    outer = np.where(is_cpu, rows, -1)
    skipped = is_skip.copy()
    cur = parent.copy()
    while True:
        live = np.flatnonzero(cur >= 0)
        if live.size == 0:
            break
        up = cur[live]
        outer[live] = np.where(is_cpu[up], up, outer[live])
        skipped[live] |= is_skip[up]
        cur[live] = parent[up]
    return outer, skipped


def _outer_op(step: StepData, row: int) -> int:
    """The outermost cpu op above `row` (itself included), below annotations; -1 if none."""
    ev = step.events
    best = -1
    for r in _ancestors(ev["parent"], row):
        if ev["kind"][r] == KIND["cpu_op"]:
            best = r
    return best


def _gemm_numbers(step: StepData, window: dict, peaks: DevicePeaks | None) -> dict | None:
    if peaks is None:
        return None
    ev = step.events
    gemm_names = {n for n in step.strings if n in GEMM_OPS or n.startswith(CONV_OP_PREFIXES)}
    if not gemm_names:
        return None
    work = derived_op_work(step, only=gemm_names)
    if work.empty:
        return None
    names = step.string_values(ev["name_id"])
    work = work[work["path"].isin(TENSOR_PATHS).to_numpy()]
    if work.empty:
        return None
    # Each kernel goes to the innermost matmul/conv op with derived FLOPs around its launch
    # (climbing the parent column one level per pass for all kernels at once).
    kernels = np.flatnonzero((ev["kind"] == KIND["kernel"]) & (ev["launch"] >= 0))
    parent = ev["parent"].astype(np.int64)
    wanted = np.zeros(parent.size, dtype=bool)
    wanted[work.index.to_numpy()] = True
    found = np.full(kernels.size, -1, dtype=np.int64)
    cur = parent[ev["launch"][kernels]]
    while True:
        live = np.flatnonzero((cur >= 0) & (found < 0))
        if live.size == 0:
            break
        hit = wanted[cur[live]]
        found[live[hit]] = cur[live[hit]]
        cur[live] = parent[cur[live]]
    kernels, found = kernels[found >= 0], found[found >= 0]
    if kernels.size == 0:
        return None
    # Per op: kernel time in the step and time at the roof; only ops far below it go on.
    k_start = ev["start_ns"][kernels]
    k_dur = np.maximum(
        np.minimum(k_start + ev["dur_ns"][kernels], step.end_ns)
        - np.maximum(k_start, step.start_ns),
        0,
    )
    ops, slot = np.unique(found, return_inverse=True)
    op_dur = np.bincount(slot, weights=k_dur, minlength=ops.size)
    w = work.loc[ops]
    peak = np.array([peaks.peak_flops_per_s(p) for p in w["path"]], dtype=np.float64)
    roof = (
        np.maximum(
            w["flops"].to_numpy(float) / peak,
            w["dram_bytes"].to_numpy(float) / peaks.bw_bytes_per_s,
        )
        * 1e9
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(op_dur > 0, 100.0 * roof / op_dur, np.inf)
    slow = np.flatnonzero(pct < FAR_BELOW_ROOF_PCT)
    if slow.size == 0:
        return None
    order = np.argsort(slot, kind="stable")
    bounds = np.searchsorted(slot[order], np.arange(ops.size + 1))
    op_of = {int(ops[i]): kernels[order[bounds[i] : bounds[i + 1]]] for i in slow.tolist()}
    roof_of = {int(ops[i]): float(roof[i]) for i in slow.tolist()}
    path_of = {int(ops[i]): str(w["path"].iloc[i]) for i in slow.tolist()}
    flops_of = {int(ops[i]): float(w["flops"].iloc[i]) for i in slow.tolist()}
    ds, de, ddev = _device_work(window)
    dev_of_track = np.array([t.device for t in step.tracks], dtype=np.int64)
    starts_of = {int(d): ds[ddev == d] for d in np.unique(ddev)}
    grid = step.attr("grid")
    dims_text = step.attr("Input Dims")
    types_text = step.attr("Input type")
    arch = device_arch(peaks)
    total_win = 0.0
    items = []
    for op, ks in op_of.items():
        start = ev["start_ns"][ks]
        end = start + ev["dur_ns"][ks]
        dur = np.maximum(np.minimum(end, step.end_ns) - np.maximum(start, step.start_ns), 0)
        dur_ns = float(dur.sum())
        if dur_ns <= 0:
            continue
        roof_ns = roof_of[op]
        roof_pct = 100.0 * roof_ns / dur_ns
        # Queued work behind a kernel: the next device work on its device (starting after the
        # kernel does) starts within QUEUED_GAP_NS of its end, or the kernel ends the step.
        queued = np.zeros(ks.size, dtype=bool)
        for i, k in enumerate(ks.tolist()):
            later = starts_of.get(int(dev_of_track[ev["track_id"][k]]), ds)
            j = int(np.searchsorted(later, max(start[i] + 1, end[i] - QUEUED_GAP_NS), "left"))
            nxt = later[j] if j < later.size else None
            queued[i] = nxt is None or nxt <= end[i] + QUEUED_GAP_NS or end[i] >= step.end_ns
        fixed_ns = roof_ns / ATTAINABLE_ROOF_FRACTION
        win = max(dur_ns - fixed_ns, 0.0) * float(dur[queued].sum()) / dur_ns
        name = names[op]
        dims = gemm_dims(name, dims_text.get(op, ""))
        types = json.loads(types_text.get(op, "[]") or "[]")
        elem = next((_ELEM_BYTES[t] for t in types if t in _ELEM_BYTES), 2)
        reasons = []
        unaligned = [d for d in (dims or ()) if d % (ALIGN_BYTES // elem)]
        if unaligned:
            reasons.append(
                f"dims {', '.join(map(str, unaligned))} not multiples of {ALIGN_BYTES // elem}"
            )
        tags = {kernel_arch_tag(names[k]) for k in ks.tolist()} - {None}
        old = sorted(t for t in tags if t < arch)
        if old:
            reasons.append(f"kernel built for sm{old[0]} on an sm{arch} device")
        blocks = []
        for k in ks.tolist():
            try:
                g = json.loads(grid.get(k, "[]") or "[]")
                blocks.append(int(np.prod(g)) if g else 0)
            except (TypeError, ValueError):
                blocks.append(0)
        if blocks and 0 < max(blocks) < peaks.sms:
            reasons.append(f"grid of {max(blocks)} blocks < one wave ({peaks.sms} SMs)")
        kernel = names[ks[np.argmax(dur)]]
        total_win += win
        items.append(
            {
                "op": name,
                "dims": list(dims) if dims else [],
                "path": path_of[op],
                "kernel": kernel,
                "count": int(ks.size),
                "dur_ns": dur_ns,
                "roof_pct": roof_pct,
                "tflops": flops_of[op] / dur_ns / 1e3,
                "win_ns": win,
                "reasons": reasons,
            }
        )
    if not items or total_win <= 0:
        return None
    merged: dict[tuple, dict] = {}  # the same op and shapes (e.g. once per layer): one row
    for it in items:
        key = (it["op"], tuple(it["dims"]), it["path"], tuple(it["reasons"]))
        m = merged.get(key)
        if m is None:
            merged[key] = dict(it, ops=1)
            continue
        flops = it["tflops"] * it["dur_ns"] + m["tflops"] * m["dur_ns"]
        m["ops"] += 1
        m["count"] += it["count"]
        m["win_ns"] += it["win_ns"]
        m["roof_pct"] = (m["roof_pct"] * m["dur_ns"] + it["roof_pct"] * it["dur_ns"]) / (
            m["dur_ns"] + it["dur_ns"]
        )
        m["dur_ns"] += it["dur_ns"]
        m["tflops"] = flops / m["dur_ns"]
    items = sorted(merged.values(), key=lambda it: -it["win_ns"])
    return {
        "win_ns": total_win,
        "ops": sum(it["ops"] for it in items),
        "kernel_ns": sum(it["dur_ns"] for it in items),
        "attainable_fraction": ATTAINABLE_ROOF_FRACTION,
        "items": items[:TOP_ITEMS],
    }


def _python_frames(step: StepData, rows: np.ndarray) -> list[str]:
    """For each host event row: the innermost python frame (with_stack) around its start on
    its thread, skipping torch's own frames and built-ins (the user's line), or ""."""
    ev = step.events
    node = innermost_containing(
        step, np.array([KIND["python"]], np.uint8), ev["track_id"][rows], ev["start_ns"][rows]
    )
    out = []
    for n in node.tolist():
        while n >= 0:
            name = step.strings[ev["name_id"][n]]
            if "torch/" not in name and not name.startswith("<built-in"):
                break
            n = int(ev["parent"][n])
        # Without a user frame, say nothing: a built-in's name carries an object address.
        out.append(name if n >= 0 else "")
    return out


def _sync_numbers(step: StepData, window: dict) -> dict | None:
    ev = step.events
    runtime = np.flatnonzero(np.isin(ev["kind"], [KIND["runtime"], KIND["driver"]]))
    names = step.string_values(ev["name_id"][runtime])
    calls = runtime[np.isin(names, SYNC_CALLS)]
    if calls.size == 0:
        return None
    ds, de, _ = _device_work(window)
    reach = np.maximum.accumulate(de) if de.size else de
    frames = _python_frames(step, calls)
    by_cause: dict[str, dict] = {}
    spans: list[tuple[int, int]] = []
    starts: list[int] = []
    for c, frame in zip(calls.tolist(), frames):
        c0 = int(ev["start_ns"][c])
        c1 = c0 + int(ev["dur_ns"][c])
        i = int(np.searchsorted(ds, c1, "right"))
        drained = int(reach[i - 1]) if i > 0 else step.start_ns
        j = int(np.searchsorted(ds, c1, "left"))
        next_ns = int(ds[j]) if j < ds.size else step.end_ns
        lo = max(c0, drained, step.start_ns)
        hi = max(min(next_ns, step.end_ns), lo)
        op = _outer_op(step, c)
        cause = step.strings[ev["name_id"][op]] if op >= 0 else step.strings[ev["name_id"][c]]
        key = f"{cause} @ {frame}" if frame else cause
        entry = by_cause.setdefault(key, {"count": 0, "spans": [], "wait_ns": 0.0})
        entry["count"] += 1
        entry["spans"].append((lo, hi))
        entry["wait_ns"] += c1 - c0
        spans.append((lo, hi))
        starts.append(c0)

    def union_ns(pairs: list[tuple[int, int]]) -> float:
        # Several syncs in one idle gap (a loop of .item() calls) share it: count it once.
        s, e = np.array(pairs, dtype=np.int64).T
        return float(union_length_ns(s, e, step.start_ns, step.end_ns))

    total = union_ns(spans)
    if total <= 0:
        return None
    items = [
        {"cause": k, "count": v["count"], "idle_ns": union_ns(v["spans"]), "wait_ns": v["wait_ns"]}
        for k, v in by_cause.items()
    ]
    items.sort(key=lambda it: -it["idle_ns"])
    first = np.argsort(starts, kind="stable")[:TOP_ITEMS]
    return {
        "win_ns": total,
        "count": int(calls.size),
        "wait_ns": float(ev["dur_ns"][calls].sum()),
        "items": items[:TOP_ITEMS],
        # Where the link zooms the timeline: the first syncs and the idle after them.
        "window_ns": [int(starts[first[0]]), int(max(spans[i][1] for i in first))],
    }


def _tiny_numbers(step: StepData, gpu_idle_ns: int) -> dict | None:
    ev = step.events
    kernels = np.flatnonzero((ev["kind"] == KIND["kernel"]) & (ev["launch"] >= 0))
    if kernels.size == 0:
        return None
    names = step.string_values(ev["name_id"])
    outer, skipped = _host_tree_columns(step)
    launcher = ev["parent"][ev["launch"][kernels]]
    ok = launcher >= 0
    kernels, launcher = kernels[ok], launcher[ok]
    op_names = names[launcher]
    small = (
        (ev["dur_ns"][kernels] < TINY_KERNEL_NS)
        & np.array([n.startswith("aten::") for n in op_names], dtype=bool)
        & ~np.isin(op_names, list(GEMM_OPS))
        & ~np.array([n.startswith(CONV_OP_PREFIXES) or ATTENTION_MARK in n for n in op_names])
        & ~skipped[launcher]
    )
    top = outer[launcher]
    has_top = top >= 0
    candidates = np.setdiff1d(top[small & has_top], top[~small & has_top])
    if candidates.size == 0:
        return None
    ops = candidates[np.argsort(ev["start_ns"][candidates], kind="stable")]
    host_ns = float(ev["dur_ns"][ops].sum())
    # Runs of consecutive candidates: no other top-level op of the step between them.
    rows = np.arange(outer.size)
    tops = rows[(outer == rows) & (ev["kind"] == KIND["cpu_op"])]
    tops = tops[np.argsort(ev["start_ns"][tops], kind="stable")]
    is_cand = np.isin(tops, ops)
    runs = int(np.sum(is_cand & ~np.concatenate([[False], is_cand[:-1]])))
    residual = runs * float(np.median(ev["dur_ns"][ops]))
    win = min(max(host_ns - residual, 0.0), float(gpu_idle_ns))
    mine = small & np.isin(top, ops)
    kinds, counts = np.unique(op_names[mine], return_counts=True)
    order = np.argsort(-counts, kind="stable")[:TOP_ITEMS]
    return {
        "win_ns": win,
        "count": int(mine.sum()),
        "ops": int(ops.size),
        "runs": runs,
        "host_ns": host_ns,
        "kernel_ns": float(ev["dur_ns"][kernels[mine]].sum()),
        "gpu_idle_ns": float(gpu_idle_ns),
        "items": [{"op": str(kinds[i]), "count": int(counts[i])} for i in order],
    }


def _optimizer_numbers(step: StepData, window: dict) -> dict | None:
    ev = step.events
    ids = [i for i, text in enumerate(step.strings) if text.startswith(OPTIMIZER_PREFIX)]
    if not ids:
        return None
    regions = np.flatnonzero((ev["kind"] == KIND["annotation"]) & np.isin(ev["name_id"], ids))
    if regions.size == 0:
        return None
    fused_ids = [
        i for i, text in enumerate(step.strings) if "_foreach_" in text or "_fused_" in text
    ]
    # Each cpu op goes to the region on its thread that contains it (regions on one thread
    # do not overlap: one optimizer step at a time).
    region_of = np.full(ev["kind"].size, -1, dtype=np.int64)
    cpu_rows = np.flatnonzero(ev["kind"] == KIND["cpu_op"])
    for track in np.unique(ev["track_id"][regions]).tolist():
        regs = regions[ev["track_id"][regions] == track]
        regs = regs[np.argsort(ev["start_ns"][regs], kind="stable")]
        r0 = ev["start_ns"][regs]
        r1 = r0 + ev["dur_ns"][regs]
        ops = cpu_rows[ev["track_id"][cpu_rows] == track]
        o0 = ev["start_ns"][ops]
        i = np.searchsorted(r0, o0, "right") - 1
        ok = i >= 0
        ok[ok] = o0[ok] + ev["dur_ns"][ops[ok]] <= r1[i[ok]]
        region_of[ops[ok]] = regs[i[ok]]
    device = np.flatnonzero(np.isin(ev["kind"], DEVICE_WORK_KINDS) & (ev["launch"] >= 0))
    device_region = region_of[ev["parent"][ev["launch"][device]]]
    fused_regions = set(region_of[np.isin(ev["name_id"], fused_ids) & (region_of >= 0)].tolist())
    best = None
    for reg in regions.tolist():
        r0 = int(ev["start_ns"][reg])
        r1 = r0 + int(ev["dur_ns"][reg])
        if reg in fused_regions:
            continue
        inside = np.flatnonzero(region_of == reg)
        launched = device[device_region == reg]
        if launched.size == 0:
            continue
        s = ev["start_ns"][launched]
        e = s + ev["dur_ns"][launched]
        order = np.argsort(s)
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        new = np.concatenate([[True], s[1:] > reach[:-1]])
        busy = float((np.maximum.reduceat(e, np.flatnonzero(new)) - s[new]).sum())
        end = min(max(r1, int(e.max())), step.end_ns)
        span = end - max(r0, step.start_ns)
        win = max(span - busy, 0.0)
        entry = {
            "win_ns": win,
            "region": step.strings[ev["name_id"][reg]],
            "region_ns": float(span),
            "device_ns": busy,
            "kernels": int(launched.size),
            "ops": int(inside.size),
            "window_ns": [max(r0, step.start_ns), int(end)],
        }
        if best is None or win > best["win_ns"]:
            best = entry
    return best


def kernel_finding_numbers(
    step: StepData, window: dict, gpu_idle_ns: int, peaks: DevicePeaks | None
) -> dict[tuple[str, str], dict]:
    """The numbers behind each kind of this module for one step, keyed (kind, ""), each with
    `win_ns` (ns per step), `span_ns` and an `items` list of evidence rows (not medians)."""
    out = {}
    for kind, numbers in (
        ("gemm_below_roof", _gemm_numbers(step, window, peaks)),
        ("host_sync", _sync_numbers(step, window)),
        ("tiny_kernels", _tiny_numbers(step, gpu_idle_ns)),
        ("unfused_optimizer", _optimizer_numbers(step, window)),
    ):
        if numbers:
            numbers["span_ns"] = step.span_ns
            out[(kind, "")] = numbers
    return out


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def describe_kernel_finding(kind: str, n: dict, where: str) -> tuple[str, str]:
    """(title, evidence) of a kind of this module from its (median) numbers; ValueError for a
    kind it does not know."""
    items = n.get("items", [])
    if kind == "gemm_below_roof":
        top = items[0] if items else {}
        reason = "; ".join(top.get("reasons", [])) or "no reason visible in the trace"
        dims = "x".join(map(str, top.get("dims", []))) or "?"
        title = (
            f"{n['ops']:.0f} matmul/conv ops below {FAR_BELOW_ROOF_PCT:.0f}% of their roof; "
            f"most to win: {top.get('op', '')} [{dims}] at {top.get('roof_pct', 0):.0f}% of the "
            f"{top.get('path', '')} roof ({reason})"
        )
        parts = []
        for it in items:
            dims = "x".join(map(str, it["dims"])) if it["dims"] else "?"
            why = "; ".join(it["reasons"]) or "no reason visible in the trace"
            parts.append(
                f"{it['op']} [{dims}] {it['path']} x{it['ops']}: {it['count']} kernels "
                f"{_ms(it['dur_ns'])}, {it['tflops']:.0f} TFLOP/s = {it['roof_pct']:.0f}% of "
                f"the dense roof ({why}; kernel {_short(it['kernel'])})"
            )
        reasons = " ".join(r for it in items for r in it["reasons"])
        advice = []
        if "not multiples" in reasons:
            advice.append(
                f"pad dims to multiples of {ALIGN_BYTES} bytes' worth of elements (e.g. a "
                f"vocabulary of 50,304, not 50,257) so that cuBLAS picks a current tensor-core "
                f"kernel"
            )
        elif "built for sm" in reasons:
            advice.append("update cuBLAS/cuDNN (torch) so that kernels for this GPU are picked")
        if "one wave" in reasons:
            advice.append("give each GEMM more work (batch them, or larger tiles of M x N)")
        if not advice:
            advice.append("see why with Nsight Compute counters (tessera-prof counters)")
        evidence = (
            f"{'; '.join(parts)}. Win: kernel time minus the time at "
            f"{100 * n['attainable_fraction']:.0f}% of the roof (FLOPs and bytes from the "
            f"shapes), for kernels with work queued behind them: {'; '.join(advice)}"
        )
        return title, evidence
    if kind == "host_sync":
        top = items[0]["cause"] if items else "a sync call"
        title = (
            f"{n['count']:.0f} host syncs per step leave the GPU idle {_ms(n['win_ns'])} ({top})"
        )
        parts = [
            f"{it['cause']}: {it['count']} syncs, GPU idle after them {_ms(it['idle_ns'])}, "
            f"host blocked {_ms(it['wait_ns'])}"
            for it in items
        ]
        evidence = (
            f"{'; '.join(parts)}. Win: the GPU idle from each sync's drain point to the next "
            f"device work. Keep values on the GPU (no .item()/.cpu()/print of a tensor in the "
            f"loop), or check them every N steps"
        )
        return title, evidence
    if kind == "tiny_kernels":
        title = (
            f"{n['count']:.0f} tiny kernels (< {TINY_KERNEL_NS / 1e3:.0f} us) from "
            f"{n['ops']:.0f} elementwise/reduction ops: fuse them"
        )
        listed = ", ".join(f"{it['op']} x{it['count']}" for it in items)
        evidence = (
            f"{n['count']:.0f} kernels of {_ms(n['kernel_ns'])} on the GPU cost "
            f"{_ms(n['host_ns'])} of host time in {n['runs']:.0f} run(s) of consecutive ops "
            f"({listed}). Win: that "
            f"host time minus one op per run, at most the GPU idle {_ms(n['gpu_idle_ns'])}: "
            f"torch.compile the region (or capture it in a CUDA graph)"
        )
        return title, evidence
    if kind == "unfused_optimizer":
        title = (
            f"Optimizer step is a per-parameter loop ({n['kernels']:.0f} kernels): use fused=True"
        )
        evidence = (
            f"{n['region'] if 'region' in n else 'Optimizer.step'} spans "
            f"{_ms(n['region_ns'])} with {n['ops']:.0f} ops and {n['kernels']:.0f} kernels, "
            f"no _foreach_/_fused_ op; its device work is only {_ms(n['device_ns'])}. Win: the "
            f"span minus the device work (a fused optimizer does the same math in a few "
            f"launches): pass fused=True (or foreach=True) to the optimizer"
        )
        return title, evidence
    raise ValueError(f"unknown finding kind {kind!r}")


def kernel_finding_view(kind: str, n: dict) -> dict[str, str]:
    """The plugin view and settings that show a kind of this module (state keys of the tab's
    URL hash, docs/PLUGIN.md): the kernels table searched for the slowest GEMM kernel, the
    timeline searched for the sync call or the optimizer region, the operators table searched
    for the op launching most tiny kernels."""
    items = n.get("items") or [{}]
    if kind == "gemm_below_roof":
        return {"view": "kernels", "q": items[0].get("kernel", "")}
    if kind == "host_sync":
        return {"view": "timeline", "q": "Synchronize"}
    if kind == "tiny_kernels":
        return {"view": "operators", "q": items[0].get("op", ""), "sort": "calls"}
    if kind == "unfused_optimizer":
        return {"view": "timeline", "q": OPTIMIZER_PREFIX}
    raise ValueError(f"unknown finding kind {kind!r}")
