"""Roofline points per kernel and per operator (METRICS.md, "Roofline").

A point is x = FLOPs / DRAM bytes (FLOP/byte), y = FLOPs / time (FLOP/s), log-log, under the
memory roof y = BW x x and the compute roof of the kernel's precision path, against DENSE
datasheet peaks (`devices.py`). Per point:

- `time_at_roof_ns` = max(FLOPs / peak, bytes / BW): the time the work would take on the roof;
- `efficiency_pct` = 100 x y / min(peak, BW x x) = 100 x time_at_roof / time. For a kernel with
  no FLOPs it is the memory-roof efficiency, 100 x (bytes / BW) / time;
- `headroom_ms` = time - time_at_roof, in ms.

FLOPs and bytes come from, per point (`flops_source`, `bytes_source`):

- "measured": Nsight Compute counters (`measured_work`): SASS FP instruction counts
  (FP32 = fadd + fmul + 2 ffma, FP64 = dadd + dmul + 2 dfma, FP16/BF16 non-tensor =
  2 hadd + 2 hmul + 4 hfma) plus tensor FLOPs (the sum of `sm__ops_path_tensor_src_*`); DRAM
  bytes = read + write sums, else rate x duration;
- "partial": measured, but for a kernel without tensor work whose XU pipe (MUFU,
  conversions) ran, or whose report lacks the SASS counts of a precision (METRICS.md: MUFU,
  integer and conversion work is not counted; elementwise FLOPs are partial);
- "measured:cupti_range": SASS counts of CUPTI range-profiler events in the Kineto trace;
- "derived" / "derived:partial": from the op's input shapes (`derived_op_work`), compulsory
  bytes (inputs + outputs, no cache reuse); elementwise FLOPs are always partial;
- "none": nothing to compute them from (the point has a time but no FLOPs).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable

import numpy as np
import pandas as pd

from tessera_tb.backend.counter_join import linked_kernels, op_labels, worker_profiles
from tessera_tb.backend.devices import PATHS, DevicePeaks, device_peaks
from tessera_tb.backend.selection import iter_selected, resolve_workers
from tessera_tb.importers.kernel_names import kernel_name_key
from tessera_tb.importers.ncu_csv import DENSE_CEILINGS, TENSOR_SRC_PATHS
from tessera_tb.trace.kernel_counters import MATCH_INSTANCE, CounterProfile
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import KIND, StepData

SASS = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"
XU_PIPE = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
# Vector paths: (path, [(op, FLOPs per instruction)], per-cycle peak metric, FLOPs per peak inst)
VECTOR_PATHS = (
    ("fp32", (("fadd", 1), ("fmul", 1), ("ffma", 2)), "ffma", 2),
    ("fp64", (("dadd", 1), ("dmul", 1), ("dfma", 2)), "dfma", 2),
    ("fp16_vector", (("hadd", 2), ("hmul", 2), ("hfma", 4)), "hfma", 4),
)


# --- measured ---------------------------------------------------------------------------


def sass_count(profile: CounterProfile, op: str) -> np.ndarray:
    """Thread instructions executed of a SASS op (METRICS.md, "Roofline"): the `.sum` when the
    report has it, else `.sum.per_cycle_elapsed` x `smsp__cycles_elapsed.avg`, else x
    `smsp__cycles_elapsed.avg.per_second` x `gpu__time_duration.sum` (elapsed cycles = clock
    rate x duration). NaN where none of these exist."""
    name = SASS.format(op)
    if profile.has(name):
        return profile.values(name)
    rate = profile.values(name + ".per_cycle_elapsed")
    cycles = profile.values("smsp__cycles_elapsed.avg")
    fallback = profile.values("smsp__cycles_elapsed.avg.per_second") * profile.values(
        "gpu__time_duration.sum"
    )
    return rate * np.where(np.isfinite(cycles), cycles, fallback)


def measured_work(profile: CounterProfile) -> pd.DataFrame:
    """FLOPs and DRAM bytes of every profiled kernel, from its counters.

    Columns: fp32_flops, fp64_flops, fp16_vector_flops, tensor_flops (NaN where the report
    lacks the counters), flops (sum of the known ones), path (tensor path with the most FLOPs,
    else the vector path with the most, "" with no FLOPs), dram_bytes, bytes_source
    ("read+write" or "rate x duration"), dur_ns (Nsight Compute's gpu__time_duration),
    counter_ceiling_flops_per_s (dense ceiling of the path at the observed SM clock:
    `..._sparsity_off.sum.peak_sustained` x `sm__cycles_elapsed.avg.per_second` for tensor
    paths, FMA peak x FLOPs per FMA x clock for vector paths), flops_source, flops_note.
    """
    n = profile.count
    out = pd.DataFrame(index=pd.RangeIndex(n))
    clock = profile.values("sm__cycles_elapsed.avg.per_second")
    missing_notes = []
    vector_ceiling = {}
    for path, ops, fma, per_fma in VECTOR_PATHS:
        counts = [(sass_count(profile, op), k) for op, k in ops]
        known = [c for c, _ in counts if np.isfinite(c).any()]
        if len(known) < len(counts):
            missing_notes.append(f"no {path.replace('_vector', '')} SASS counts")
        out[f"{path}_flops"] = (
            np.nansum([k * c for c, k in counts], axis=0) if known else np.full(n, np.nan)
        )
        vector_ceiling[path] = (
            profile.values(f"sm__sass_thread_inst_executed_op_{fma}_pred_on.sum.peak_sustained")
            * per_fma
            * clock
        )
    tensor_by_path: dict[str, np.ndarray] = {}
    for metric, path in TENSOR_SRC_PATHS.items():
        v = profile.values(metric)
        if np.isfinite(v).any():
            tensor_by_path[path] = np.nansum([tensor_by_path.get(path, np.zeros(n)), v], axis=0)
    if len(tensor_by_path) < len(set(TENSOR_SRC_PATHS.values())):
        missing_notes.append("no tensor counters for some paths")
    tensor_paths = list(tensor_by_path)
    tensor = np.array([tensor_by_path[p] for p in tensor_paths]).reshape(len(tensor_paths), n)
    out["tensor_flops"] = tensor.sum(axis=0) if tensor_paths else np.full(n, np.nan)
    parts = out[["fp32_flops", "fp64_flops", "fp16_vector_flops", "tensor_flops"]].to_numpy()
    out["flops"] = np.where(np.isfinite(parts).any(axis=1), np.nansum(parts, axis=1), np.nan)

    vector_names = [p for p, *_ in VECTOR_PATHS]
    vec = np.nan_to_num(out[[f"{p}_flops" for p in vector_names]].to_numpy())
    best_vec = np.array(vector_names, dtype=object)[vec.argmax(axis=1)]
    if tensor_paths:
        best_tensor = np.array(tensor_paths, dtype=object)[np.nan_to_num(tensor).argmax(axis=0)]
        use_tensor = np.nan_to_num(tensor).max(axis=0) > 0
    else:
        best_tensor = np.full(n, "", dtype=object)
        use_tensor = np.zeros(n, dtype=bool)
    has_flops = np.nan_to_num(out["flops"].to_numpy()) > 0
    out["path"] = np.where(use_tensor, best_tensor, np.where(has_flops, best_vec, ""))

    ceiling = np.full(n, np.nan)
    for path, names in DENSE_CEILINGS.items():
        per_cycle = np.nanmax(np.array([profile.values(m) for m in names]), axis=0, initial=-np.inf)
        per_cycle = np.where(np.isfinite(per_cycle), per_cycle, np.nan)
        ceiling = np.where(out["path"] == path, per_cycle * clock, ceiling)
    for path, values in vector_ceiling.items():
        ceiling = np.where(out["path"] == path, values, ceiling)
    out["counter_ceiling_flops_per_s"] = ceiling

    dur_s = profile.values("gpu__time_duration.sum")
    read, write = profile.values("dram__bytes_read.sum"), profile.values("dram__bytes_write.sum")
    rate = profile.values("dram__bytes.sum.per_second")
    both = np.isfinite(read) & np.isfinite(write)
    out["dram_bytes"] = np.where(both, read + write, rate * dur_s)
    out["bytes_source"] = np.where(
        both, "read+write", np.where(np.isfinite(rate * dur_s), "rate x duration", "")
    )
    out["dur_ns"] = dur_s * 1e9

    # METRICS.md: MUFU, integer and conversion work is not counted, so the FLOPs of kernels
    # without tensor work are partial when the XU pipe (MUFU, conversions) ran or is unknown,
    # or when the report lacks the SASS counts of a precision.
    xu = profile.values(XU_PIPE)
    has_xu = np.isfinite(xu)
    xu_work = np.where(has_xu, np.nan_to_num(xu) > 0, True)
    notes = np.where(
        xu_work,
        np.where(
            has_xu,
            "XU-pipe work (MUFU, conversions) not counted",
            "no XU-pipe counter: MUFU and conversion work unknown",
        ),
        "",
    ).astype(object)
    if missing_notes:
        missing = "; ".join(missing_notes)
        notes = np.where(notes == "", missing, notes + "; " + missing).astype(object)
    partial = ~use_tensor & (xu_work | bool(missing_notes))
    out["flops_source"] = np.where(
        np.isfinite(out["flops"]), np.where(partial, "partial", "measured"), "none"
    )
    out["flops_note"] = notes
    return out


def profiler_range_work(step: StepData) -> pd.DataFrame:
    """Measured FLOPs of the step's CUPTI range-profiler events (`cuda_profiler_range`, kind
    profiler_range), from their SASS count args: fp32, fp64, fp16_vector FLOPs as in
    `measured_work`. Columns: row, name, start_ns, fp32_flops, fp64_flops, fp16_vector_flops,
    flops, path. The events' durations are left out: Kineto lays the ranges out back to back
    with one fixed duration, so they are not kernel times.
    """
    ev = step.events
    rows = np.flatnonzero(ev["kind"] == KIND["profiler_range"])
    out = pd.DataFrame(
        {
            "row": rows,
            "name": step.string_values(ev["name_id"][rows]),
            "start_ns": ev["start_ns"][rows],
        }
    )
    for path, ops, _, _ in VECTOR_PATHS:
        total = np.zeros(rows.size)
        known = np.zeros(rows.size, dtype=bool)
        for op, k in ops:
            col = step.attr(SASS.format(op)).reindex(rows)
            known |= col.notna().to_numpy()
            total += k * col.fillna(0).to_numpy(np.float64)
        out[f"{path}_flops"] = np.where(known, total, np.nan)
    parts = out[[f"{p}_flops" for p, *_ in VECTOR_PATHS]].to_numpy()
    known = np.isfinite(parts).any(axis=1)
    out["flops"] = np.where(known, np.nansum(parts, axis=1), np.nan)
    names = np.array([p for p, *_ in VECTOR_PATHS], dtype=object)
    out["path"] = np.where(
        np.nan_to_num(out["flops"]) > 0, names[np.nan_to_num(parts).argmax(axis=1)], ""
    )
    return out


# --- derived from shapes ----------------------------------------------------------------

DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
_TENSOR_PATH = {
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "float": "fp32",
    "double": "fp64_tensor",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
}
_MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
               "aten::linear", "aten::addbmm"}  # fmt: skip
_CONV_OPS = {  # op -> positions of (stride, padding, dilation, groups, transposed or None)
    "aten::conv1d": (3, 4, 5, 6, None),
    "aten::conv2d": (3, 4, 5, 6, None),
    "aten::conv3d": (3, 4, 5, 6, None),
    "aten::convolution": (3, 4, 5, 8, 6),
    "aten::_convolution": (3, 4, 5, 8, 6),
    "aten::cudnn_convolution": (3, 2, 4, 5, None),
}
# attention op -> (index of query among the inputs, index of is_causal, backward?)
_ATTENTION_OPS = {
    "aten::scaled_dot_product_attention": (0, 5, False),
    "aten::_scaled_dot_product_flash_attention": (0, 4, False),
    "aten::_scaled_dot_product_efficient_attention": (0, 6, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, 6, False),
    "aten::_flash_attention_forward": (0, 8, False),
    "aten::_cudnn_attention_forward": (0, 10, False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 11, True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 14, True),
    "aten::_flash_attention_backward": (1, 11, True),
    "aten::_cudnn_attention_backward": (1, 14, True),
}
# elementwise op -> FLOPs per output element (METRICS.md: numel x ops per element; partial)
_ELEMENTWISE_OPS = {
    **{f"aten::{op}": 1 for op in ("add", "sub", "mul", "div", "rsub")},
    **{f"aten::{op}_": 1 for op in ("add", "sub", "mul", "div")},
    **{f"aten::{op}": 2 for op in ("addcmul", "addcdiv", "addcmul_", "addcdiv_", "lerp", "lerp_")},
}


def _numel(shape: list) -> int:
    return int(np.prod(shape)) if shape else 1


def _tensor_inputs(dims: list, types: list) -> list[tuple[list, str]]:
    return [
        (d, t)
        for d, t in zip(dims, types)
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d) and t in DTYPE_BYTES
    ]


def _matmul_work(name: str, dims: list, types: list):
    """2 x M x N x K per batch (METRICS.md). Returns (flops, bytes, dtype) or None."""
    t = _tensor_inputs(dims, types)
    added: list[tuple[list, str]] = []
    if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm"):
        added, t = t[:1], t[1:]  # the added term comes first
    if len(t) < 2:
        return None
    (a, ta), (b, tb) = t[0], t[1]
    if name == "aten::linear":  # input [..., K], weight [N, K], optional bias [N]
        if len(b) != 2 or a[-1] != b[1]:
            return None
        added = t[2:3]
        batch, m, k, n = (), _numel(a[:-1]), a[-1], b[0]
    else:
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            return None
        try:
            batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        except ValueError:
            return None
        m, k, n = a[-2], a[-1], b[-1]
    nb = _numel(list(batch))
    size = DTYPE_BYTES[ta]
    nbytes = _numel(a) * size + _numel(b) * DTYPE_BYTES[tb] + nb * m * n * size
    nbytes += sum(_numel(d) * DTYPE_BYTES[tt] for d, tt in added)
    return 2 * nb * m * n * k, nbytes, ta


def _list_arg(text: str) -> list[int] | None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value
    return None


def _conv_work(name: str, dims: list, types: list, concrete: list):
    """2 x N x K x (C / groups) x R x S x P x Q (METRICS.md), from stride/padding/dilation/
    groups in the op's Concrete Inputs. Returns (flops, bytes, dtype) or None."""
    pos_stride, pos_pad, pos_dil, pos_groups, pos_transposed = _CONV_OPS[name]
    if (
        len(dims) < 2
        or not concrete
        or len(concrete) <= max(pos_stride, pos_pad, pos_dil, pos_groups)
    ):
        return None
    x, w = dims[0], dims[1]
    if not (isinstance(x, list) and isinstance(w, list)) or len(x) < 3 or len(x) != len(w):
        return None
    if pos_transposed is not None and str(concrete[pos_transposed]).lower() == "true":
        return None
    spatial = len(x) - 2
    stride, pad, dil = (_list_arg(concrete[p]) for p in (pos_stride, pos_pad, pos_dil))
    groups = _list_arg(concrete[pos_groups])
    if None in (stride, pad, dil, groups):
        return None
    stride, pad, dil = ((v * spatial if len(v) == 1 else v) for v in (stride, pad, dil))
    out_spatial = [
        (x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
        for i in range(spatial)
    ]
    if min(out_spatial) <= 0 or x[1] != w[1] * groups[0]:
        return None
    n, k = x[0], w[0]
    flops = 2 * n * k * w[1] * _numel(w[2:]) * _numel(out_spatial)
    size = DTYPE_BYTES.get(types[0], 0)
    nbytes = (_numel(x) + _numel(w) + n * k * _numel(out_spatial)) * size
    return flops, nbytes, types[0]


def _attention_work(name: str, dims: list, types: list, concrete: list):
    """Forward 2 x B x Hq x Sq x Sk x (Dqk + Dv); causal with Sq = Sk counts useful FLOPs
    (x (Sk + 1) / (2 Sk)); backward 2.5 x forward (METRICS.md). (flops, bytes, dtype, causal)."""
    q_at, causal_at, backward = _ATTENTION_OPS[name]
    if len(dims) < q_at + 3:
        return None
    q, k, v = dims[q_at : q_at + 3]
    if not all(isinstance(s, list) and len(s) == 4 for s in (q, k, v)):
        return None
    b, hq, sq, dqk = q
    sk, dv = k[2], v[3]
    flops = 2.0 * b * hq * sq * sk * (dqk + dv)
    causal = (
        concrete is not None
        and len(concrete) > causal_at
        and str(concrete[causal_at]).strip().lower() == "true"
    )
    if causal and sq == sk:
        flops *= (sk + 1) / (2 * sk)
    size = DTYPE_BYTES.get(types[q_at], 0)
    out = b * hq * sq * dv
    nbytes = (_numel(q) + _numel(k) + _numel(v) + out) * size
    if backward:
        flops *= 2.5
        nbytes = nbytes * 2 + out * size  # also reads grad_out and out, writes dq, dk, dv
    return flops, nbytes, types[q_at], causal


def _elementwise_work(name: str, dims: list, types: list):
    t = _tensor_inputs(dims, types)
    if not t:
        return None
    try:
        shape = np.broadcast_shapes(*(tuple(d) for d, _ in t))
    except ValueError:
        return None
    numel = _numel(list(shape))
    out_size = max(DTYPE_BYTES[tt] for _, tt in t)
    nbytes = sum(_numel(d) * DTYPE_BYTES[tt] for d, tt in t) + numel * out_size
    return _ELEMENTWISE_OPS[name] * numel, nbytes, t[0][1]


@functools.lru_cache(maxsize=65536)
def _derive(name: str, dims_text: str, types_text: str, concrete_text: str):
    """(flops, bytes, path, source, formula) for one op signature, or None. Cached: the same
    signatures recur in every step of a run."""
    try:
        dims = json.loads(dims_text) if dims_text else []
        types = json.loads(types_text) if types_text else []
        concrete = json.loads(concrete_text) if concrete_text else []
    except ValueError:
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    types = types + [""] * (len(dims) - len(types))
    if name in _MATMUL_OPS:
        r = _matmul_work(name, dims, types)
        if r:
            return r[0], r[1], _TENSOR_PATH.get(r[2], ""), "derived", "2*M*N*K per batch"
    elif name in _CONV_OPS:
        r = _conv_work(name, dims, types, concrete)
        if r:
            path = _TENSOR_PATH.get(r[2], "")
            return r[0], r[1], path, "derived", "2*N*K*(C/groups)*R*S*P*Q"
    elif name in _ATTENTION_OPS:
        r = _attention_work(name, dims, types, concrete)
        if r:
            formula = "2*B*Hq*Sq*Sk*(Dqk+Dv)" + (" x (Sk+1)/(2*Sk) causal" if r[3] else "")
            if _ATTENTION_OPS[name][2]:
                formula = "2.5 x " + formula
            return r[0], r[1], _TENSOR_PATH.get(r[2], ""), "derived", formula
    elif name in _ELEMENTWISE_OPS:
        r = _elementwise_work(name, dims, types)
        if r:
            path = "fp64" if r[2] == "double" else "fp32"
            return r[0], r[1], path, "derived:partial", "numel x ops per element"
    return None


def derived_op_work(step: StepData, only: Iterable[str] | None = None) -> pd.DataFrame:
    """FLOPs and compulsory bytes of the step's cpu ops that have a formula (METRICS.md,
    "Roofline": derived from shapes). Indexed by cpu_op row; columns flops, dram_bytes, path,
    flops_source ("derived" or "derived:partial"), formula. Each distinct op signature (name,
    Input Dims, Input type, Concrete Inputs) is computed once. `only`: op names to consider
    (default: every op with a formula).
    """
    ev = step.events
    known = _MATMUL_OPS | set(_CONV_OPS) | set(_ATTENTION_OPS) | set(_ELEMENTWISE_OPS)
    if only is not None:
        known &= set(only)
    ids = [i for i, name in enumerate(step.strings) if name in known]
    ops = np.flatnonzero((ev["kind"] == KIND["cpu_op"]) & np.isin(ev["name_id"], ids))
    names = step.string_values(ev["name_id"][ops])
    wanted = np.ones(ops.size, dtype=bool)
    ops, names = ops[wanted], names[wanted]
    cols = ["flops", "dram_bytes", "path", "flops_source", "formula"]
    if ops.size == 0:
        return pd.DataFrame(columns=cols, index=pd.Index([], name="row"))
    sig = pd.DataFrame(
        {
            "name": names,
            "dims": step.attr("Input Dims").reindex(ops).fillna("").to_numpy(object),
            "types": step.attr("Input type").reindex(ops).fillna("").to_numpy(object),
            "concrete": step.attr("Concrete Inputs").reindex(ops).fillna("").to_numpy(object),
        },
        index=pd.Index(ops, name="row"),
    )
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(sig))
    results = [_derive(*u) for u in uniques]  # one call per distinct signature, not per op
    keep = np.array([r is not None for r in results], dtype=bool)
    table = pd.DataFrame(
        [r if r is not None else (np.nan, np.nan, "", "none", "") for r in results], columns=cols
    )
    out = table.iloc[codes].set_index(sig.index)
    return out[keep[codes]]


# --- points -----------------------------------------------------------------------------


def roof_points(work: pd.DataFrame, peaks: DevicePeaks) -> pd.DataFrame:
    """Add the roofline columns to a frame with flops, dram_bytes, dur_ns and path:
    intensity_flops_per_byte, flops_per_s, peak_flops_per_s (dense datasheet peak of the path),
    bw_bytes_per_s, roof_flops_per_s (min(peak, BW x x)), time_at_roof_ns, efficiency_pct,
    headroom_ms. Peaks are DENSE (METRICS.md); a path without a datasheet peak gives NaN."""
    out = work.copy()
    flops = out["flops"].to_numpy(np.float64)
    nbytes = out["dram_bytes"].to_numpy(np.float64)
    dur_ns = out["dur_ns"].to_numpy(np.float64)
    peak_of = {p: peaks.peak_flops_per_s(p) for p in PATHS}
    peak = np.array([peak_of.get(p) or np.nan for p in out["path"]], dtype=np.float64)
    bw = peaks.bw_bytes_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(nbytes > 0, flops / nbytes, np.nan)
        y = np.where(dur_ns > 0, flops / (dur_ns * 1e-9), np.nan)
        compute_s = np.where(flops > 0, flops / peak, 0.0)
        compute_s = np.where(np.isnan(flops), np.nan, compute_s)
        at_roof_ns = np.maximum(compute_s, nbytes / bw) * 1e9
        efficiency = 100.0 * at_roof_ns / dur_ns
    out["intensity_flops_per_byte"] = x
    out["flops_per_s"] = y
    out["peak_flops_per_s"] = peak
    out["bw_bytes_per_s"] = bw
    out["roof_flops_per_s"] = np.minimum(peak, bw * x)
    out["time_at_roof_ns"] = at_roof_ns
    out["efficiency_pct"] = efficiency
    out["headroom_ms"] = (dur_ns - at_roof_ns) / 1e6
    return out


def roofs(peaks: DevicePeaks) -> pd.DataFrame:
    """The roofs of a device: one memory roof (kind "memory", bw_bytes_per_s) and one compute
    roof per precision path with a datasheet peak (kind "compute", peak_flops_per_s,
    ridge_flops_per_byte = peak / BW). Columns: kind, path, peak_flops_per_s, bw_bytes_per_s,
    ridge_flops_per_byte, source, device."""
    rows = [
        {
            "kind": "memory",
            "path": "hbm",
            "peak_flops_per_s": np.nan,
            "bw_bytes_per_s": peaks.bw_bytes_per_s,
            "ridge_flops_per_byte": np.nan,
            "source": peaks.sources.get("hbm_tbps", ""),
        }
    ]
    fields = {"fp64": "fp64_tflops", "fp64_tensor": "fp64_tensor_tflops", "fp32": "fp32_tflops",
              "tf32": "tf32_tflops", "bf16": "bf16_tflops", "fp16": "bf16_tflops",
              "fp8": "fp8_tflops"}  # fmt: skip
    for path in PATHS:
        peak = peaks.peak_flops_per_s(path)
        if peak is None:
            continue
        rows.append(
            {
                "kind": "compute",
                "path": path,
                "peak_flops_per_s": peak,
                "bw_bytes_per_s": peaks.bw_bytes_per_s,
                "ridge_flops_per_byte": peak / peaks.bw_bytes_per_s,
                "source": peaks.sources.get(fields[path], ""),
            }
        )
    out = pd.DataFrame(rows)
    out["device"] = peaks.name
    return out


def profile_peaks(profile: CounterProfile, arch: str | None = None) -> DevicePeaks:
    """Peaks for a counter profile: `arch` if given, else its device name, else its CC."""
    return device_peaks(arch or profile.device_name or f"sm_{profile.compute_capability}")


def run_peaks(run: Run, worker: str, arch: str | None = None) -> DevicePeaks:
    """Peaks for a worker: `arch` if given, else its first device's name and SM count."""
    if arch:
        return device_peaks(arch)
    devices = run.worker(worker).meta.devices
    if not devices:
        raise ValueError(f"worker {worker} records no device: pass arch= (e.g. 'h100-sxm')")
    d = devices[0]
    try:
        return device_peaks(d.name, num_sms=d.num_sms or None)
    except ValueError:
        return device_peaks(f"sm_{d.compute_major}{d.compute_minor}", num_sms=d.num_sms or None)


def counter_roofline(
    profile: CounterProfile, peaks: DevicePeaks | None = None, *, group_by: str = "none"
) -> pd.DataFrame:
    """Roofline of the profiled kernels themselves (no run): times are Nsight Compute's.

    group_by "none": one row per profiled kernel (profiled_id, kernel_name); "kernel": one row
    per kernel name (sums of FLOPs, bytes and time; `count`).
    """
    peaks = peaks or profile_peaks(profile)
    work = measured_work(profile)
    work.insert(0, "kernel_name", profile.kernel_names)
    work.insert(0, "profiled_id", profile.profiled_id)
    work["time_source"] = "ncu"
    if group_by == "kernel":
        work = _group(work, ["kernel_name", "flops_source"])
    elif group_by != "none":
        raise ValueError(f"group_by must be 'none' or 'kernel', not {group_by!r}")
    return roof_points(work, peaks)


def _group(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Sum flops, bytes and time per group; path = the path with most FLOPs in the group."""
    f = frame.copy()
    f["_flops0"] = f["flops"].fillna(0.0)
    top = f.sort_values("_flops0", ascending=False).drop_duplicates(keys).set_index(keys)
    g = f.groupby(keys, sort=False, dropna=False)
    out = pd.DataFrame(
        {
            "count": g.size(),
            "flops": g["flops"].sum(min_count=1),
            "dram_bytes": g["dram_bytes"].sum(min_count=1),
            "dur_ns": g["dur_ns"].sum(min_count=1),
        }
    )
    if "_same_instance" in f:
        # Share of the group's kernels whose counters are another launch's (same name, grid,
        # block: `measured:same-kernel-instance`); NaN when none has counters.
        out["counters_same_instance_pct"] = 100.0 * g["_same_instance"].mean()
    for col in ("path", "bytes_source", "flops_note", "time_source", "formula"):
        if col in f:
            out[col] = top[col].reindex(out.index)
    return out.reset_index()


def roofline(
    run: Run,
    *,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    arch: str | None = None,
    group_by: str = "kernel",
    peaks: DevicePeaks | None = None,
) -> pd.DataFrame:
    """Roofline points of the selected steps, per kernel name or per op (METRICS.md).

    Kernel FLOPs and bytes are measured where the worker's Nsight Compute counters were matched
    with the kernel (`tessera-prof import-ncu`) or CUPTI range-profiler counters name it; else
    derived from the owning op's shapes when that op launched only this kernel; else none.
    Times are the run's kernel durations (`time_source` "run").

    group_by "kernel": one row per (worker, kernel_name, flops_source); "op": one row per
    (worker, op_name, op_input_dims, flops_source), an op instance's work being the sum over
    its kernels when all of them were measured, else the op's derived work (whatever the
    number of its kernels), else none. Columns: the group keys, count, flops, dram_bytes,
    dur_ns, counters_same_instance_pct (per kernel: % of its instances whose counters are
    another launch's, `measured:same-kernel-instance`; NaN without counters), path,
    bytes_source, flops_note, formula, time_source, then `roof_points`' columns; rows by
    time, longest first. Peaks: `peaks`, else `arch`, else the worker's device.
    """
    if group_by not in ("kernel", "op"):
        raise ValueError(f"group_by must be 'kernel' or 'op', not {group_by!r}")
    profiles = worker_profiles(run, workers)
    measured = {w: measured_work(p) for w, p in profiles.items()}
    frames = []
    for w in resolve_workers(run, workers):
        parts = [
            _step_instances(st, profiles.get(w), measured.get(w))
            for _, st in iter_selected(run, [w], steps)
        ]
        if not parts:
            continue
        inst = pd.concat([k for k, _ in parts], ignore_index=True)
        inst["worker"] = w
        if group_by == "kernel":
            grouped = _group(inst, ["worker", "kernel_name", "flops_source"])
        else:
            derived = pd.concat([d for _, d in parts])
            ops = _op_instances(inst, derived)
            grouped = _group(ops, ["worker", "op_name", "op_input_dims", "flops_source"])
        frames.append(roof_points(grouped, peaks or run_peaks(run, w, arch)))
    if not frames:
        keys = ["worker", "kernel_name"] if group_by == "kernel" else ["worker", "op_name"]
        empty = pd.DataFrame(columns=keys + ["flops_source", "count", "flops", "dram_bytes",
                                             "dur_ns", "path"])  # fmt: skip
        return roof_points(empty, peaks or run_peaks(run, resolve_workers(run, workers)[0], arch))
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values("dur_ns", ascending=False, ignore_index=True)


_MEASURED = ("measured", "partial", "measured:cupti_range")


def _step_instances(
    st: StepData, profile: CounterProfile | None, measured: pd.DataFrame | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernel instances with their work and its source, the step's derived op work)."""
    ev = st.events
    rows = np.flatnonzero(ev["kind"] == KIND["kernel"])
    n = rows.size
    op_row, op_name, op_dims = op_labels(st, rows)
    inst = pd.DataFrame(
        {
            "step": st.step,
            "row": rows,
            "kernel_name": st.string_values(ev["name_id"][rows]),
            "dur_ns": ev["dur_ns"][rows].astype(np.float64),
            "op_row": op_row,
            "op_name": op_name,
            "op_input_dims": op_dims,
            "flops": np.full(n, np.nan),
            "dram_bytes": np.full(n, np.nan),
            "path": np.full(n, "", dtype=object),
            "flops_source": np.full(n, "none", dtype=object),
            "bytes_source": np.full(n, "", dtype=object),
            "flops_note": np.full(n, "", dtype=object),
            "formula": np.full(n, "", dtype=object),
            "time_source": "run",
            "_same_instance": np.full(n, np.nan),  # 1: counters of another launch, 0: own
        }
    )
    derived = derived_op_work(st)
    derived["step"] = st.step
    if n == 0:
        return inst, derived
    # Derived: the owning op's work, when the op launched exactly this one kernel.
    per_op = pd.Series(op_row).map(pd.Series(op_row).value_counts()).to_numpy()
    has = (op_row >= 0) & (per_op == 1) & np.isin(op_row, derived.index.to_numpy())
    if has.any():
        d = derived.loc[op_row[has]]
        inst.loc[has, "flops"] = d["flops"].to_numpy(np.float64)
        inst.loc[has, "dram_bytes"] = d["dram_bytes"].to_numpy(np.float64)
        inst.loc[has, "path"] = d["path"].to_numpy(object)
        inst.loc[has, "flops_source"] = d["flops_source"].to_numpy(object)
        inst.loc[has, "bytes_source"] = "derived (inputs + outputs)"
        inst.loc[has, "formula"] = d["formula"].to_numpy(object)
    ranges = profiler_range_work(st)
    if len(ranges):
        _attach_ranges(inst, ranges)
    if profile is not None and measured is not None:
        idx, linked_rows = linked_kernels(profile, st)
        at = pd.Series(np.arange(n), index=rows).reindex(linked_rows).to_numpy(np.int64)
        m = measured.iloc[idx]
        for col in ("flops", "dram_bytes", "path", "flops_source", "bytes_source", "flops_note"):
            inst.loc[at, col] = m[col].to_numpy()
        inst.loc[at, "formula"] = ""
        inst.loc[at, "_same_instance"] = (profile.match[idx] == MATCH_INSTANCE).astype(float)
    return inst, derived


def _attach_ranges(inst: pd.DataFrame, ranges: pd.DataFrame) -> None:
    """CUPTI range profiler: the k-th range of a kernel name is the k-th kernel of that name."""
    keys_k = pd.Series([kernel_name_key(s) for s in inst["kernel_name"]])
    keys_r = pd.Series([kernel_name_key(s) for s in ranges["name"]])
    nth_k = keys_k.groupby(keys_k).cumcount()
    nth_r = keys_r.groupby(keys_r).cumcount()
    pos = pd.Series(np.arange(len(inst)), index=pd.MultiIndex.from_arrays([keys_k, nth_k]))
    at = pos.reindex(pd.MultiIndex.from_arrays([keys_r, nth_r])).to_numpy()
    ok = np.isfinite(at)
    if not ok.any():
        return
    at = at[ok].astype(np.int64)
    inst.loc[at, "flops"] = ranges["flops"].to_numpy()[ok]
    inst.loc[at, "path"] = ranges["path"].to_numpy()[ok]
    inst.loc[at, "flops_source"] = "measured:cupti_range"
    inst.loc[at, "flops_note"] = "SASS FP counts only (no tensor or DRAM counters)"


def _op_instances(inst: pd.DataFrame, derived: pd.DataFrame) -> pd.DataFrame:
    """Kernel instances -> op instances (one row per worker, step, op row)."""
    k = inst[inst["op_row"] >= 0].copy()
    k["_measured"] = k["flops_source"].isin(_MEASURED)
    k["_rank"] = k["flops_source"].map(_SOURCE_RANK).fillna(len(_SOURCE_RANK)).astype(int)
    keys = ["worker", "step", "op_row"]
    g = k.groupby(keys, sort=False)
    ops = pd.DataFrame(
        {
            "op_name": g["op_name"].first(),
            "op_input_dims": g["op_input_dims"].first(),
            "dur_ns": g["dur_ns"].sum(),
            "all_measured": g["_measured"].all(),
            "flops": g["flops"].sum(min_count=1),
            "dram_bytes": g["dram_bytes"].sum(min_count=1),
            "flops_source": g["_rank"].min().map(_RANK_SOURCE),
            "bytes_source": g["bytes_source"].first(),
            "flops_note": g["flops_note"].first(),
            "time_source": g["time_source"].first(),
        }
    )
    top = k.assign(_f=k["flops"].fillna(0)).sort_values("_f", ascending=False)
    ops["path"] = top.drop_duplicates(keys).set_index(keys)["path"].reindex(ops.index)
    ops["formula"] = ""
    d = derived.set_index("step", append=True).reorder_levels(["step", "row"])
    d = d.reindex(pd.MultiIndex.from_arrays(
        [ops.index.get_level_values("step"), ops.index.get_level_values("op_row")]
    ))  # fmt: skip
    use_derived = ~ops["all_measured"].to_numpy() & d["flops"].notna().to_numpy()
    none = ~ops["all_measured"].to_numpy() & ~use_derived
    for col in ("flops", "dram_bytes", "path", "flops_source", "formula"):
        ops.loc[use_derived, col] = d[col].to_numpy()[use_derived]
    ops.loc[use_derived, "bytes_source"] = "derived (inputs + outputs)"
    ops.loc[use_derived, "flops_note"] = ""
    ops.loc[none, ["flops", "dram_bytes"]] = np.nan
    ops.loc[none, "flops_source"] = "none"
    ops.loc[none, ["path", "bytes_source", "formula"]] = ""
    return ops.drop(columns="all_measured").reset_index()


# The weakest label among an op's kernels names the op's source.
_SOURCE_ORDER = ("partial", "measured:cupti_range", "measured", "derived:partial", "derived")
_SOURCE_RANK = {label: i for i, label in enumerate(_SOURCE_ORDER)}
_RANK_SOURCE = {**dict(enumerate(_SOURCE_ORDER)), len(_SOURCE_ORDER): "none"}
