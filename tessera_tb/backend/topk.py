"""Operator and kernel tables: the heaviest ops by self time, the heaviest kernels.

Definitions: METRICS.md, "Time" (host self time, launch linkage, device self time) and
"Steps and nesting" (the host op tree). What METRICS.md leaves open is decided here:

- Operators are the events of kind cpu_op. User annotations (`record_function` ranges,
  `ProfilerStep#N`, `Optimizer.step#...`) are not operators and get no row.
- Host self time subtracts the durations of the DIRECT children in the host op tree, and that
  tree holds annotations and runtime/driver calls as well as ops. So an annotation nested in
  an op is a child of the op: its time is not the op's self time (it is the annotation's own
  business, and the ops inside the annotation have their own rows). Likewise a runtime call
  (cudaLaunchKernel) is a child, so an op's host self time excludes its launch calls. This is
  what PyTorch's `key_averages()` does (record_function ranges and runtime calls are nodes of
  its event tree), and the tests compare against it.
- Device self time follows METRICS.md literally: a device event belongs to the innermost cpu_op
  around its launching call (`linkage.owning_op_rows`), so annotations and runtime calls are
  transparent there, unlike for host self time. Device work counted: kernels, NCCL kernels
  (kind collective: they are kernels to the GPU), memcpys and memsets; never
  gpu_user_annotation labels.
- Totals (host_total_ns, device_total_ns) of a group count each instant once: a call nested
  inside a call of the same group (autocast's aten::linear inside aten::linear) adds to the
  group's calls and self times but not again to its totals. `key_averages()` would count the
  inner call twice (its cpu_time_total sums instance totals).
- A parent or launch link into another step is not stored (docs/FORMAT.md), so an op whose
  child starts in the next step keeps that child's time as self time. Steps split at
  `ProfilerStep#N` starts, which ops do not cross in PyTorch traces.

All durations are ns; means are float ns per call.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from tessera_tb.backend.linkage import owning_op_rows
from tessera_tb.backend.selection import iter_selected
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import DEVICE_WORK_KINDS, HOST_TREE_KINDS, KERNEL_KINDS, KIND, StepData

OTHER_NAME = "(other)"

_OP_SUMS = ["calls", "host_self_ns", "host_total_ns", "device_self_ns", "device_total_ns"]


def op_times_by_row(step: StepData) -> dict[str, np.ndarray]:
    """Per event row, for every row (meaningful on cpu_op rows): host_self_ns, device_self_ns
    and op_parent (row of the nearest enclosing cpu_op, -1 if none).

    host_self_ns = dur_ns - summed dur_ns of the direct children in the host op tree;
    device_self_ns = summed dur_ns of the device work whose owning op is the row
    (METRICS.md, "Time"). int64 ns.
    """
    ev = step.events
    n = step.num_events
    kind, parent, dur = ev["kind"], ev["parent"], ev["dur_ns"]
    # Only host-tree events are children of an op; python_function rows have parents in
    # their own tree, never an op.
    child = np.flatnonzero((parent >= 0) & np.isin(kind, HOST_TREE_KINDS))
    # bincount sums in float64: exact for integers below 2**53 ns (104 days).
    child_ns = np.bincount(parent[child], weights=dur[child], minlength=n)
    host_self = dur - np.rint(child_ns).astype(np.int64)

    owner = owning_op_rows(step)
    work = np.flatnonzero(np.isin(kind, DEVICE_WORK_KINDS) & (owner >= 0))
    device_self = np.rint(np.bincount(owner[work], weights=dur[work], minlength=n)).astype(np.int64)
    has_parent = parent >= 0
    op_parent = np.where(has_parent, owner[np.where(has_parent, parent, 0)], -1).astype(np.int64)
    op_parent[~np.isin(kind, HOST_TREE_KINDS)] = -1
    return {"host_self_ns": host_self, "device_self_ns": device_self, "op_parent": op_parent}


def _input_dims_ids(step: StepData) -> np.ndarray:
    """Per row: string id of the "Input Dims" JSON text, -1 where the event has none."""
    out = np.full(step.num_events, -1, dtype=np.int64)
    a = step.attrs_by_key.get("Input Dims")
    if a is None:
        return out
    if a.type in ("json", "string"):
        out[a.rows] = a.values
    return out


def _op_groups_one_step(step: StepData, by_input_dims: bool) -> pd.DataFrame:
    """Per (name[, input dims]) of one step: calls and summed times (see module docstring)."""
    ev = step.events
    ops = np.flatnonzero(ev["kind"] == KIND["cpu_op"])
    if ops.size == 0:
        return pd.DataFrame(columns=["name", "input_dims", *_OP_SUMS])
    t = op_times_by_row(step)
    dims = _input_dims_ids(step)
    # One integer key per (name, dims) pair; rows that are not ops get key -1.
    key = np.full(step.num_events, -1, dtype=np.int64)
    width = len(step.strings) + 1
    key[ops] = ev["name_id"][ops].astype(np.int64) * width + (dims[ops] + 1 if by_input_dims else 0)
    uniq, group = np.unique(key[ops], return_inverse=True)
    group = group.reshape(-1)

    # Totals, counted once per group: climb each op's op-ancestors level by level; an op with
    # an ancestor of the same group is covered by that ancestor's total.
    dur = ev["dur_ns"]
    op_parent = t["op_parent"]
    device_total = t["device_self_ns"].astype(np.int64).copy()
    covered = np.zeros(ops.size, dtype=bool)
    src = np.flatnonzero(op_parent[ops] >= 0)
    cur = op_parent[ops[src]]
    while src.size:
        np.add.at(device_total, cur, t["device_self_ns"][ops[src]])
        covered[src] |= key[cur] == key[ops[src]]
        cur = op_parent[cur]
        keep = cur >= 0
        src, cur = src[keep], cur[keep]
    outer = ~covered
    g = uniq.size

    def sums(values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        w = values if mask is None else np.where(mask, values, 0)
        return np.rint(np.bincount(group, weights=w, minlength=g)).astype(np.int64)

    names = step.string_values((uniq // width).astype(np.int64))
    dims_id = (uniq % width) - 1
    dims_text = np.where(dims_id >= 0, step.string_values(np.maximum(dims_id, 0)), "")
    return pd.DataFrame(
        {
            "name": names,
            "input_dims": dims_text if by_input_dims else "",
            "calls": np.bincount(group, minlength=g).astype(np.int64),
            "host_self_ns": sums(t["host_self_ns"][ops]),
            "host_total_ns": sums(dur[ops], outer),
            "device_self_ns": sums(t["device_self_ns"][ops]),
            "device_total_ns": sums(device_total[ops], outer),
        }
    )


def _name_matches(names: pd.Series, search: str | None) -> np.ndarray:
    if not search:
        return np.ones(len(names), dtype=bool)
    return names.str.lower().str.contains(search.lower(), regex=False).to_numpy()


def _top_k_with_other(
    df: pd.DataFrame, sort: str, k: int | None, sum_columns: list[str], tie: list[str]
) -> pd.DataFrame:
    """Sort descending by `sort` (ties by `tie`), keep k rows and add one "(other)" row
    summing `sum_columns` over the rest, so the table sums to the whole."""
    ordered = df.sort_values(
        [sort, *tie, "name"], ascending=[False] * (1 + len(tie)) + [True], kind="stable"
    ).reset_index(drop=True)
    ordered["is_other"] = False
    if k is None or len(ordered) <= k:
        return ordered
    top, rest = ordered.iloc[:k].copy(), ordered.iloc[k:]
    other = {c: rest[c].sum() for c in sum_columns}
    other.update(name=OTHER_NAME, is_other=True)
    return pd.concat([top, pd.DataFrame([other])], ignore_index=True)


def op_table(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    *,
    by_input_dims: bool = False,
    sort: str | None = None,
    k: int | None = 20,
    search: str | None = None,
) -> pd.DataFrame:
    """The operators of the selected workers and steps, heaviest first.

    One row per op name (per (name, "Input Dims" text) with `by_input_dims`), over cpu_op
    events only; definitions in the module docstring and METRICS.md, "Time". Columns:
    name, input_dims ("" when not grouped or not recorded), calls, host_self_ns,
    host_total_ns, device_self_ns, device_total_ns (int64 ns summed over the selection),
    host_self_mean_ns, host_total_mean_ns, device_self_mean_ns, device_total_mean_ns (per
    call), host_self_pct, device_self_pct (share of the table's sum of that column),
    is_other.

    `search` keeps names containing it (case-insensitive). `sort` is a column name; the
    default is device_self_ns when the selection has device work (where GPU time goes is
    what a GPU profile is read for, and host time of a GPU-bound step is mostly waiting), else
    host_self_ns. The top `k` rows are followed by one "(other)" row (is_other True) summing
    the rest, so each self column sums to its whole; totals of "(other)" sum its ops' totals
    and may include time of listed ops nested in them. k=None keeps every row.
    """
    parts = [_op_groups_one_step(s, by_input_dims) for _, s in iter_selected(run, workers, steps)]
    parts = [p for p in parts if len(p)]
    if not parts:
        merged = pd.DataFrame({"name": [], "input_dims": [], **{c: [] for c in _OP_SUMS}})
    else:
        merged = pd.concat(parts, ignore_index=True)
    merged = merged.groupby(["name", "input_dims"], as_index=False, sort=False)[_OP_SUMS].sum()
    merged = merged[_name_matches(merged["name"], search)]
    if sort is None:
        sort = "device_self_ns" if merged["device_self_ns"].sum() > 0 else "host_self_ns"
    _check_sort(sort, merged)
    tie = ["host_self_ns"] if sort != "host_self_ns" else ["device_self_ns"]
    table = _top_k_with_other(merged, sort, k, _OP_SUMS, tie)
    table["input_dims"] = table["input_dims"].fillna("")
    for c in ("host_self", "host_total", "device_self", "device_total"):
        table[f"{c}_mean_ns"] = table[f"{c}_ns"] / table["calls"].where(table["calls"] > 0)
    for c in ("host_self", "device_self"):
        whole = table[f"{c}_ns"].sum()
        table[f"{c}_pct"] = 100.0 * table[f"{c}_ns"] / whole if whole else np.nan
    for c in _OP_SUMS:
        table[c] = table[c].astype(np.int64)
    return table[
        [
            "name",
            "input_dims",
            *_OP_SUMS,
            "host_self_mean_ns",
            "host_total_mean_ns",
            "device_self_mean_ns",
            "device_total_mean_ns",
            "host_self_pct",
            "device_self_pct",
            "is_other",
        ]
    ]


def _check_sort(sort: str, table: pd.DataFrame) -> None:
    if sort not in table.columns or sort == "name":
        raise ValueError(f"unknown sort column {sort!r}")


def _attr_for_rows(step: StepData, key: str, rows: np.ndarray) -> np.ndarray:
    """Values of one attribute for `rows`: float64 (NaN = none) for numbers, object (None =
    none) for text and JSON text."""
    a = step.attrs_by_key.get(key)
    text = a is not None and a.type in ("string", "json")
    out = np.full(rows.size, None if text else np.nan, dtype=object if text else np.float64)
    if a is None or a.rows.size == 0:
        return out
    pos = np.searchsorted(a.rows, rows)
    hit = (pos < a.rows.size) & (a.rows[np.minimum(pos, a.rows.size - 1)] == rows)
    vals = a.values[pos[hit]]
    out[hit] = step.string_values(vals) if text else vals.astype(np.float64)
    return out


def _kernel_rows_one_step(step: StepData) -> pd.DataFrame:
    """One row per kernel or NCCL kernel of the step, with its launch attributes."""
    ev = step.events
    rows = np.flatnonzero(np.isin(ev["kind"], KERNEL_KINDS))
    owner = owning_op_rows(step)[rows]
    owner_name = np.where(owner >= 0, step.string_values(ev["name_id"][np.maximum(owner, 0)]), "")
    return pd.DataFrame(
        {
            "name": step.string_values(ev["name_id"][rows]),
            "kind": np.where(ev["kind"][rows] == KIND["collective"], "collective", "kernel"),
            "dur_ns": ev["dur_ns"][rows],
            "grid": _attr_for_rows(step, "grid", rows),
            "block": _attr_for_rows(step, "block", rows),
            "registers_per_thread": _attr_for_rows(step, "registers per thread", rows),
            "shared_memory_bytes": _attr_for_rows(step, "shared memory", rows),
            "occupancy_pct": _attr_for_rows(step, "est. achieved occupancy %", rows),
            "owner": owner_name,
        }
    )


def _most_common(df: pd.DataFrame, column: str) -> pd.Series:
    """Per kernel name, the most frequent non-null value of `column` (ties: the lower value)."""
    sub = df[["name", column]].dropna()
    if sub.empty:
        return pd.Series(dtype=object, name=column)
    counts = sub.groupby(["name", column], sort=True).size().reset_index(name="n")
    counts = counts.sort_values(["name", "n"], ascending=[True, False], kind="stable")
    return counts.drop_duplicates("name").set_index("name")[column]


def kernel_table(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    *,
    sort: str = "total_dur_ns",
    k: int | None = 20,
    search: str | None = None,
) -> pd.DataFrame:
    """The GPU kernels (kinds kernel and collective) of the selection, one row per name.

    Columns: name, kind ("kernel" or "collective"), calls, total_dur_ns, mean_dur_ns,
    min_dur_ns, max_dur_ns, total_pct (share of all kernel time in the table), grid, block
    (most common launch shape, JSON text as recorded), registers_per_thread,
    shared_memory_bytes (most common; NaN when not recorded), est_occupancy_pct (Kineto's
    "est. achieved occupancy %", weighted by duration over the calls that carry it: an
    estimate, not a measurement, METRICS.md "Kernel counters"), top_op (the owning op, by
    launch linkage, with the most of this kernel's time; "" when none), top_op_pct (its share
    of the kernel's time), is_other. Sorted by `sort` descending; top `k` rows plus an
    "(other)" row summing calls and total_dur_ns of the rest (k=None keeps all). `search`
    keeps names containing it (case-insensitive).
    """
    parts = [_kernel_rows_one_step(s) for _, s in iter_selected(run, workers, steps)]
    ker = pd.concat(parts, ignore_index=True) if parts else _kernel_rows_one_step_empty()
    ker = ker[_name_matches(ker["name"], search)]
    g = ker.groupby("name", sort=False)
    table = pd.DataFrame(
        {
            "kind": g["kind"].first(),
            "calls": g.size(),
            "total_dur_ns": g["dur_ns"].sum(),
            "min_dur_ns": g["dur_ns"].min(),
            "max_dur_ns": g["dur_ns"].max(),
        }
    )
    weighted = (
        ker.assign(
            occ_ns=ker["occupancy_pct"] * ker["dur_ns"],
            occ_dur_ns=ker["dur_ns"].where(ker["occupancy_pct"].notna(), 0),
        )
        .groupby("name", sort=False)[["occ_ns", "occ_dur_ns"]]
        .sum(min_count=1)
    )
    table["est_occupancy_pct"] = weighted["occ_ns"] / weighted["occ_dur_ns"].where(
        weighted["occ_dur_ns"] > 0
    )
    for col in ("grid", "block", "registers_per_thread", "shared_memory_bytes"):
        table[col] = _most_common(ker, col)
    by_owner = ker.groupby(["name", "owner"], sort=True)["dur_ns"].sum().reset_index()
    by_owner = by_owner.sort_values(["name", "dur_ns"], ascending=[True, False], kind="stable")
    top = by_owner.drop_duplicates("name").set_index("name")
    table["top_op"] = top["owner"]
    table["top_op_pct"] = 100.0 * top["dur_ns"] / table["total_dur_ns"]
    table = table.reset_index()
    _check_sort(sort, table)
    table = _top_k_with_other(table, sort, k, ["calls", "total_dur_ns"], ["calls"])
    table["kind"] = table["kind"].fillna("")
    table["mean_dur_ns"] = table["total_dur_ns"] / table["calls"].where(table["calls"] > 0)
    whole = table["total_dur_ns"].sum()
    table["total_pct"] = 100.0 * table["total_dur_ns"] / whole if whole else np.nan
    for c in ("calls", "total_dur_ns"):
        table[c] = table[c].astype(np.int64)
    return table[
        [
            "name",
            "kind",
            "calls",
            "total_dur_ns",
            "mean_dur_ns",
            "min_dur_ns",
            "max_dur_ns",
            "total_pct",
            "grid",
            "block",
            "registers_per_thread",
            "shared_memory_bytes",
            "est_occupancy_pct",
            "top_op",
            "top_op_pct",
            "is_other",
        ]
    ]


def _kernel_rows_one_step_empty() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "name": pd.Series([], dtype=object),
            "kind": pd.Series([], dtype=object),
            "dur_ns": pd.Series([], dtype=np.int64),
            "grid": pd.Series([], dtype=object),
            "block": pd.Series([], dtype=object),
            "registers_per_thread": pd.Series([], dtype=np.float64),
            "shared_memory_bytes": pd.Series([], dtype=np.float64),
            "occupancy_pct": pd.Series([], dtype=np.float64),
            "owner": pd.Series([], dtype=object),
        }
    )
