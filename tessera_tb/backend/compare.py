"""Compare a run B against a baseline run A: the tables of `tessera-prof diff` and of the
plugin's Compare view, one function per table.

Every figure comes from the analyses that define it (step spans from the step index,
`breakdown.step_time_breakdown`, `summary.step_summary`, `topk.op_table`, `topk.kernel_table`,
`collectives.collective_type_size_table`); this module only lines the two runs up.

What is compared, so that runs with different step counts or world sizes compare:

- Per-step figures are medians over the (worker, step) pairs of each side's selection: what
  one GPU spends in one step. Step time is the step span (METRICS.md, "Steps and nesting"),
  read from each worker's step index; breakdown categories and GPU busy % are the analyses'
  per-(worker, step) values. Each median is taken on its own, so category medians need not sum
  to the median step time.
- Operators are matched by name, kernels by `kernel_match_name` (the name without template
  arguments, parameter list or `void`) together with their owning op (`top_op` of
  `topk.kernel_table`: the op, by launch linkage, with the most of the kernel's time in that
  worker and step). A per-(worker, step) figure of an op or kernel that a worker-step lacks is 0
  there, then the median is taken. Self times: METRICS.md, "Time".
- `status` is `new` (only in B), `vanished` (only in A) or `both`. `impact_ns` is the size of
  the change per worker-step, the sort key (largest first).
- Collectives are matched by (type, message-size bucket); bus bandwidth is the median over
  complete instances (METRICS.md, "Collectives").

A side is a `Run`, or a `Side` with a worker and step selection (None: every worker, every step).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd

from tessera_tb.backend import breakdown, collectives, summary, topk
from tessera_tb.backend.selection import resolve_steps, resolve_workers, step_times_ms
from tessera_tb.trace.reader import Run, WorkerInfo
from tessera_tb.trace.step import StepData

STATUS_BOTH, STATUS_NEW, STATUS_VANISHED = "both", "new", "vanished"


@dataclass
class Side:
    """One run of a comparison and its selection (None: every worker / every step)."""

    run: Run
    workers: list[str] | None = None
    steps: list[int] | None = None
    label: str = ""
    _pairs: list[tuple[str, int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if type(self.run) is Run:  # the plugin's runs have a step cache of their own
            self.run = _StepCache(self.run)
        self.workers = resolve_workers(self.run, self.workers)
        self.steps = resolve_steps(self.run, self.steps)
        self.label = self.label or self.run.name

    @property
    def pairs(self) -> list[tuple[str, int]]:
        """The (worker, step) pairs of the selection that exist, in worker then step order."""
        if self._pairs is None:
            wanted = set(self.steps)
            self._pairs = [
                (w, s) for w in self.workers for s in self.run.worker(w).steps if s in wanted
            ]
        return self._pairs


class _StepCache(Run):
    """A run whose steps, once loaded, stay in memory for the comparison (the tables read the
    same step files several times)."""

    def __init__(self, run: Run):
        super().__init__(run.path, run.workers)
        self._inner = run
        self._loaded: dict[tuple[str, int], StepData] = {}

    @property
    def name(self) -> str:
        return self._inner.name

    def worker(self, name: str) -> WorkerInfo:
        return self._inner.worker(name)

    def load_step(self, worker: str, step: int) -> StepData:
        key = (worker, step)
        if key not in self._loaded:
            self._loaded[key] = self._inner.load_step(worker, step)
        return self._loaded[key]

    def iter_steps(self, workers=None, steps=None):
        wanted = set(steps) if steps is not None else None
        for name in workers if workers is not None else sorted(self.workers):
            for s in self.worker(name).steps:
                if wanted is None or s in wanted:
                    yield name, self.load_step(name, s)


def _side(x: Run | Side) -> Side:
    return x if isinstance(x, Side) else Side(x)


# Kernel names ----------------------------------------------------------------------------------

_LEADING_KEYWORDS = re.compile(r"^(?:(?:void|__global__|static|inline)\s+)+")


@lru_cache(maxsize=65536)
def kernel_match_name(name: str) -> str:
    """The name kernels are matched by across runs: template arguments (`<...>`), parameter
    lists (`(...)`) and a leading `void` removed, namespaces kept, spaces collapsed.

    `void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>
    (int, ...)` -> `at::native::vectorized_elementwise_kernel`;
    `ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)` ->
    `ncclDevKernel_AllGather_RING_LL`. A name that would become empty is kept as it is.
    """
    text = name.replace("(anonymous namespace)", "anonymous_namespace")
    out, depth = [], 0
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    stripped = _LEADING_KEYWORDS.sub("", " ".join("".join(out).split())).strip(": ")
    return stripped.replace("anonymous_namespace", "(anonymous namespace)") or name.strip()


# Per-(worker, step) frames ---------------------------------------------------------------------


def _per_pair(side: Side, table) -> pd.DataFrame:
    """`table(run, [worker], [step])` for every (worker, step) of the side, concatenated with
    a `pair` column (the position of the pair)."""
    parts = []
    for i, (w, s) in enumerate(side.pairs):
        df = table(side.run, [w], [s])
        if len(df):
            parts.append(df.assign(pair=i))
    if not parts:
        return pd.DataFrame({"pair": pd.Series(dtype=np.int64)})
    return pd.concat(parts, ignore_index=True)


def _median_over_pairs(
    long: pd.DataFrame, keys: list[str], values: list[str], n_pairs: int
) -> pd.DataFrame:
    """Per key: the median of each value over `n_pairs` (worker, step) pairs, a pair without
    the key counting 0. Columns: keys, values."""
    if long.empty or n_pairs == 0:
        return pd.DataFrame({**{k: [] for k in keys}, **{v: [] for v in values}})
    summed = long.groupby(keys + ["pair"], sort=False, dropna=False)[values].sum()
    out, index = {}, None
    for v in values:
        wide = summed[v].unstack("pair").reindex(columns=range(n_pairs))
        index = wide.index
        out[v] = np.median(wide.fillna(0.0).to_numpy(dtype=np.float64), axis=1)
    return pd.DataFrame(out, index=index).reset_index()


def _join_sides(
    a: pd.DataFrame, b: pd.DataFrame, keys: list[str], values: list[str]
) -> pd.DataFrame:
    """Outer join of the two sides' per-key figures: a_<v>, b_<v>, delta_<v> (B - A, missing
    = 0) and status."""
    merged = a.merge(b, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    out = merged[keys].copy()
    for v in values:
        va = merged[f"{v}_a"].fillna(0.0)
        vb = merged[f"{v}_b"].fillna(0.0)
        out[f"a_{v}"] = va
        out[f"b_{v}"] = vb
        out[f"delta_{v}"] = vb - va
    out["status"] = (
        merged["_merge"]
        .map({"both": STATUS_BOTH, "left_only": STATUS_VANISHED, "right_only": STATUS_NEW})
        .astype(object)
    )
    return out


# Tables ----------------------------------------------------------------------------------------


def runs_table(a: Run | Side, b: Run | Side) -> pd.DataFrame:
    """One row per side. Columns: side ("A" baseline, "B"), run, workers (count), world_size
    (from the metadata; 0 unknown), steps (text, e.g. "4-6"), worker_steps (pairs compared),
    events (summed event counts of the step index)."""
    rows = []
    for role, side in (("A", _side(a)), ("B", _side(b))):
        metas = [side.run.worker(w).meta for w in side.workers]
        wanted = set(side.steps)
        rows.append(
            {
                "side": role,
                "run": side.label,
                "workers": len(side.workers),
                "world_size": max((m.world_size for m in metas), default=0),
                "steps": _ranges(side.steps),
                "worker_steps": len(side.pairs),
                "events": sum(e.event_count for m in metas for e in m.steps if e.step in wanted),
            }
        )
    return pd.DataFrame(rows)


def step_medians(a: Run | Side, b: Run | Side) -> pd.DataFrame:
    """Per-step figures of both runs, each a median over the (worker, step) pairs.

    One row per figure: `step_time_ms` (the step span from the step index), one
    `<category>_ms` per category of `breakdown.CATEGORIES` (`breakdown.step_time_breakdown`),
    and `gpu_busy_pct` (`summary.step_summary`). Columns: figure, a, b, delta (b - a),
    delta_pct (100 x delta / a; NaN when a is 0).
    """
    values = {}
    for role, side in (("a", _side(a)), ("b", _side(b))):
        spans = [step_times_ms(side.run, w) for w in side.workers]
        wanted = set(side.steps)
        step_ms = [ms for times in spans for s, ms in times.items() if s in wanted]
        bd = breakdown.step_time_breakdown(side.run, side.workers, side.steps)
        busy = summary.step_summary(side.run, side.workers, side.steps)["gpu_busy_pct"]
        col = {"step_time_ms": float(np.median(step_ms)) if step_ms else np.nan}
        for c in breakdown.CATEGORIES:
            col[f"{c}_ms"] = float(bd[f"{c}_ns"].median()) / 1e6 if len(bd) else np.nan
        col["gpu_busy_pct"] = float(busy.median()) if busy.notna().any() else np.nan
        values[role] = col
    out = pd.DataFrame(
        {
            "figure": list(values["a"]),
            "a": list(values["a"].values()),
            "b": list(values["b"].values()),
        }
    )
    out["delta"] = out["b"] - out["a"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["delta_pct"] = np.where(out["a"] != 0, 100.0 * out["delta"] / out["a"], np.nan)
    return out


def slowdown_pct(medians: pd.DataFrame) -> float:
    """How much slower B's median step is than A's, in % (negative: faster), from the table of
    `step_medians`."""
    row = medians.loc[medians["figure"] == "step_time_ms"].iloc[0]
    return float(row["delta_pct"])


def _ops_one(run: Run, workers: list[str], steps: list[int]) -> pd.DataFrame:
    t = topk.op_table(run, workers, steps, k=None)
    return t[["name", "calls", "device_self_ns", "host_self_ns"]]


def op_deltas(a: Run | Side, b: Run | Side) -> pd.DataFrame:
    """Operators of both runs, matched by name, by the size of their change.

    Columns: name, a_/b_/delta_ device_self_ns, host_self_ns and calls (medians per
    (worker, step) of `topk.op_table`), status, impact_ns = the larger of |delta device self|
    and |delta host self|. Sorted by impact_ns, largest first.
    """
    sa, sb = _side(a), _side(b)
    values = ["device_self_ns", "host_self_ns", "calls"]
    per = [
        _median_over_pairs(_per_pair(s, _ops_one), ["name"], values, len(s.pairs)) for s in (sa, sb)
    ]
    out = _join_sides(per[0], per[1], ["name"], values)
    out["impact_ns"] = np.maximum(
        out["delta_device_self_ns"].abs(), out["delta_host_self_ns"].abs()
    )
    return out.sort_values(["impact_ns", "name"], ascending=[False, True], ignore_index=True)


def _kernels_one(run: Run, workers: list[str], steps: list[int]) -> pd.DataFrame:
    t = topk.kernel_table(run, workers, steps, k=None)
    names = t["name"].astype(str)
    return pd.DataFrame(
        {
            "kernel": [kernel_match_name(n) for n in names],
            "op": t["top_op"].fillna("").astype(str),
            "kind": t["kind"],
            "full_name": names,
            "calls": t["calls"],
            "total_dur_ns": t["total_dur_ns"],
        }
    )


def _example_names(long: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per key: the full kernel name with the most time, and its kind."""
    if long.empty:
        return pd.DataFrame({**{k: [] for k in keys}, "full_name": [], "kind": []})
    by = long.groupby(keys + ["full_name", "kind"], sort=False)["total_dur_ns"].sum().reset_index()
    by = by.sort_values("total_dur_ns", ascending=False, kind="stable")
    return by.drop_duplicates(keys)[keys + ["full_name", "kind"]]


def kernel_deltas(a: Run | Side, b: Run | Side) -> pd.DataFrame:
    """Kernels of both runs, matched by (`kernel_match_name`, owning op), by the size of their
    change.

    Columns: kernel (the match name), op (owning op), kind ("kernel" or "collective"),
    a_/b_/delta_ total_dur_ns and calls (medians per (worker, step) of `topk.kernel_table`),
    status, impact_ns = |delta total_dur_ns|, a_name / b_name (the full name with the most time
    on each side, "" when absent). Sorted by impact_ns, largest first.
    """
    sa, sb = _side(a), _side(b)
    keys = ["kernel", "op"]
    values = ["total_dur_ns", "calls"]
    longs = [_per_pair(s, _kernels_one) for s in (sa, sb)]
    per = [_median_over_pairs(lg, keys, values, len(s.pairs)) for lg, s in zip(longs, (sa, sb))]
    out = _join_sides(per[0], per[1], keys, values)
    names = [_example_names(lg, keys) for lg in longs]
    for role, n in zip(("a", "b"), names):
        out = out.merge(
            n.rename(columns={"full_name": f"{role}_name", "kind": f"{role}_kind"}),
            on=keys,
            how="left",
        )
    out["kind"] = out["b_kind"].fillna(out["a_kind"]).fillna("")
    out["a_name"] = out["a_name"].fillna("")
    out["b_name"] = out["b_name"].fillna("")
    out["impact_ns"] = out["delta_total_dur_ns"].abs()
    cols = keys + ["kind"] + [c for c in out.columns if c.startswith(("a_", "b_", "delta_"))]
    cols = [c for c in cols if c not in ("a_kind", "b_kind", "a_name", "b_name")]
    out = out[cols + ["status", "impact_ns", "a_name", "b_name"]]
    return out.sort_values(
        ["impact_ns", "kernel", "op"], ascending=[False, True, True], ignore_index=True
    )


def kernel_changes(
    a: Run | Side | None, b: Run | Side | None, deltas: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The kernels that are new in B or vanished from A: the rows of `kernel_deltas` whose
    status is not `both`, new first, each group by time. Pass `deltas` to reuse a
    `kernel_deltas` result (the runs are then ignored)."""
    d = deltas if deltas is not None else kernel_deltas(a, b)
    out = d[d["status"] != STATUS_BOTH].copy()
    out["_order"] = (out["status"] != STATUS_NEW).astype(int)
    out = out.sort_values(["_order", "impact_ns"], ascending=[True, False], kind="stable")
    return out.drop(columns="_order").reset_index(drop=True)


def _collectives_one(side: Side) -> pd.DataFrame:
    a = collectives.analyze_collectives(side.run, side.workers, side.steps)
    t = collectives.collective_type_size_table(a)
    return t[
        [
            "collective_type",
            "size_bucket",
            "size_bucket_lo_bytes",
            "n_instances",
            "busbw_median_gbps",
        ]
    ]


def collective_deltas(a: Run | Side, b: Run | Side) -> pd.DataFrame:
    """Collectives of both runs by (collective type, message-size bucket), from
    `collectives.collective_type_size_table`.

    Columns: collective_type, size_bucket, size_bucket_lo_bytes, a_/b_/delta_
    busbw_median_gbps (median bus bandwidth of complete instances, GB/s; NaN without one) and
    n_instances, delta_busbw_pct (100 x delta / a), status. Sorted by type and size.
    """
    ta, tb = _collectives_one(_side(a)), _collectives_one(_side(b))
    keys = ["collective_type", "size_bucket", "size_bucket_lo_bytes"]
    merged = ta.merge(tb, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    out = merged[keys].copy()
    for v in ("busbw_median_gbps", "n_instances"):
        out[f"a_{v}"] = merged[f"{v}_a"]
        out[f"b_{v}"] = merged[f"{v}_b"]
    for v in ("n_instances",):
        out[f"a_{v}"] = out[f"a_{v}"].fillna(0).astype(np.int64)
        out[f"b_{v}"] = out[f"b_{v}"].fillna(0).astype(np.int64)
    out["delta_busbw_median_gbps"] = out["b_busbw_median_gbps"] - out["a_busbw_median_gbps"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["delta_busbw_pct"] = 100.0 * out["delta_busbw_median_gbps"] / out["a_busbw_median_gbps"]
    out["status"] = (
        merged["_merge"]
        .map({"both": STATUS_BOTH, "left_only": STATUS_VANISHED, "right_only": STATUS_NEW})
        .astype(object)
    )
    return out.sort_values(["collective_type", "size_bucket_lo_bytes"], ignore_index=True)


@dataclass
class Comparison:
    """Every table of a comparison (see the functions of the same names)."""

    runs: pd.DataFrame
    step_medians: pd.DataFrame
    op_deltas: pd.DataFrame
    kernel_deltas: pd.DataFrame
    kernel_changes: pd.DataFrame
    collective_deltas: pd.DataFrame

    @property
    def slowdown_pct(self) -> float:
        return slowdown_pct(self.step_medians)

    def tables(self) -> dict[str, pd.DataFrame]:
        return {
            "runs": self.runs,
            "step_medians": self.step_medians,
            "op_deltas": self.op_deltas,
            "kernel_deltas": self.kernel_deltas,
            "kernel_changes": self.kernel_changes,
            "collective_deltas": self.collective_deltas,
        }


def compare_runs(a: Run | Side, b: Run | Side) -> Comparison:
    """All tables of the comparison of B against the baseline A, each step file read once."""
    sa, sb = _side(a), _side(b)
    kd = kernel_deltas(sa, sb)
    return Comparison(
        runs=runs_table(sa, sb),
        step_medians=step_medians(sa, sb),
        op_deltas=op_deltas(sa, sb),
        kernel_deltas=kd,
        kernel_changes=kernel_changes(None, None, deltas=kd),
        collective_deltas=collective_deltas(sa, sb),
    )


def _ranges(steps: Iterable[int]) -> str:
    """`4-6,9` for [4, 5, 6, 9]."""
    parts: list[list[int]] = []
    for s in sorted(steps):
        if parts and s == parts[-1][1] + 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in parts)
