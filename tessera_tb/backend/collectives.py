"""Collectives across ranks: NCCL kernels, their instances, waits, stragglers, overlap.

Every figure here is defined in METRICS.md, "Collectives". The parts that section leaves
open are decided here (and repeated in the docstrings of the functions that compute them):

- Kernels: every event of kind "collective" of the selected workers and steps. A rank is the
  worker's rank from its metadata.
- Type comes only from the kernel's `Collective name` arg, normalised by `COLLECTIVE_TYPES`
  (PyTorch's spellings: "allreduce", "_allgather_base", "reduce_scatter_tensor_coalesced",
  "all_to_allv", ...). A name not in the table has no type (null), never a guess from the
  kernel name.
- Bandwidths are in GB/s = 1e9 bytes/s (as nccl-tests prints them): bytes / ns.
  Busbw factors are nccl-tests': all_reduce 2(n-1)/n; all_gather, reduce_scatter,
  all_to_all (n-1)/n; broadcast, reduce, send/recv 1. gather and scatter, which METRICS.md
  does not list, take nccl-tests' (n-1)/n as well.
- Coalesced launches (a `Collective name` containing "coalesced": one kernel carrying several
  ops, In/Out msg nelems already the sums over the ops) and uneven all_to_allv (non-empty
  "In split size"/"Out split size") get algbw only; their busbw is null with a note.
- Instances: key (Process Group Name, step, ordinal); the ordinal counts that group's NCCL
  kernels on the rank within the step, ordered by the start of the launching runtime/driver
  call (the kernel start where a kernel has no launch link). Ordinals are assigned before any
  size filter, so `min_bytes` never renumbers instances. An instance whose members disagree
  on Collective name, In msg nelems, Out msg nelems, dtype or Group size is not matched: its
  members go to the mismatches table. An instance is complete when it has exactly one member
  per rank of the group (Group size members, each rank once, each in "Process Group Ranks"
  where that arg is present); transfer, wait, busbw and the straggler are computed for
  complete instances only (null otherwise): with a rank missing, the shortest present member
  need not be the transfer time.
- Transfer = the shortest member duration; wait of a member = its duration - transfer
  (>= 0); the straggler is the member with the least wait (the shortest kernel: the rank
  that arrived last, the one the others waited for); ties go to the lowest rank.
- Clocks: wait uses durations only, which no clock offset changes. Where members run on
  different hosts (more than one distinct non-empty `host` in the workers' metadata), each
  host's clock offset against the host of the lowest rank is the median, over complete
  instances, of (median member end on that host - median member end on the reference host);
  members then get `start_aligned_ns`/`end_aligned_ns` on the reference clock. On one host
  (or where hosts are unknown) the offset is 0.
- Overlap % of a collective kernel: 100 x |its interval intersected with the union of compute
  kernels (kind "kernel") on other streams of the same device| / its duration. Compute kernels
  are pooled over the worker's selected steps, so a kernel of the next selected step that runs
  beside the collective counts; one of an unselected step does not.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tessera_tb.backend.intervals import merged_segments
from tessera_tb.backend.selection import resolve_steps, resolve_workers
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import KIND, StepData

# Element size of PyTorch's dtype names (c10::toString(ScalarType)), as NCCL kernels carry them.
DTYPE_SIZE_BYTES: dict[str, int] = {
    "Bool": 1,
    "Byte": 1,
    "Char": 1,
    "QInt8": 1,
    "QUInt8": 1,
    "Bits8": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e8m0fnu": 1,
    "Short": 2,
    "UInt16": 2,
    "Half": 2,
    "BFloat16": 2,
    "Bits16": 2,
    "Int": 4,
    "UInt32": 4,
    "Float": 4,
    "QInt32": 4,
    "ComplexHalf": 4,
    "Long": 8,
    "UInt64": 8,
    "Double": 8,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
}

# `Collective name` spellings (PyTorch's record_param_comms names) -> collective type.
COLLECTIVE_TYPES: dict[str, str] = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_allv": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "send": "send_recv",
    "recv": "send_recv",
    "recvAnysource": "send_recv",
    "gather": "gather",
    "scatter": "scatter",
}

# Which collective types have a busbw factor and how it depends on the group size n.
_FACTOR_ALL_REDUCE = ("all_reduce",)
_FACTOR_N_MINUS_1_OVER_N = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
_FACTOR_ONE = ("broadcast", "reduce", "send_recv")

# Fields every member of an instance must agree on (METRICS.md, "Collectives").
MATCH_FIELDS = ("collective_name", "in_nelems", "out_nelems", "dtype", "group_size")
INSTANCE_KEY = ["process_group", "step", "ordinal"]

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def busbw_factor(collective_type: pd.Series, group_size: pd.Series) -> pd.Series:
    """nccl-tests' bus bandwidth factor per row; NaN where the type has none."""
    n = pd.to_numeric(group_size, errors="coerce").astype("float64").to_numpy()
    t = collective_type.astype(object).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.select(
            [
                np.isin(t, _FACTOR_ALL_REDUCE),
                np.isin(t, _FACTOR_N_MINUS_1_OVER_N),
                np.isin(t, _FACTOR_ONE),
            ],
            [2.0 * (n - 1.0) / n, (n - 1.0) / n, np.ones_like(n)],
            default=np.nan,
        )
    out[~np.isfinite(out)] = np.nan
    return pd.Series(out, index=collective_type.index, name="busbw_factor")


def size_bucket_label(lo_bytes: int) -> str:
    """Label of the power-of-two bucket [lo, 2 lo): "64 MiB-128 MiB"; "0 B" for empty ones."""
    if lo_bytes <= 0:
        return "0 B"
    return f"{_binary_size(lo_bytes)}-{_binary_size(2 * lo_bytes)}"


def _binary_size(n: int) -> str:
    unit = 0
    while n >= 1024 and n % 1024 == 0 and unit < len(_BINARY_UNITS) - 1:
        n //= 1024
        unit += 1
    return f"{n} {_BINARY_UNITS[unit]}"


@dataclass
class CollectiveAnalysis:
    """Every collective table of one selection (see the module docstring for definitions).

    kernels: one row per NCCL kernel (`collective_kernels`).
    members: the kernels of complete or incomplete matched instances with their instance's
        transfer, their wait and straggler flag (`collective_members`).
    instances: one row per matched instance (`collective_instances`).
    mismatches: one row per member of an instance whose members disagree.
    """

    kernels: pd.DataFrame
    members: pd.DataFrame
    instances: pd.DataFrame
    mismatches: pd.DataFrame


def analyze_collectives(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    min_bytes: int = 0,
    dask=None,
) -> CollectiveAnalysis:
    """Kernels, members, instances and mismatches of the selection in one pass.

    A map and a reduce: `worker_kernels` per selected worker (reads that worker's step
    files), then the match of instances keyed by (process group, step, ordinal). `dask`: a
    Dask scheduler (`tcp://host:8786`, `local:N` or a `distributed.Client`) runs the map as
    one task per worker (`cross_rank.map_workers`); the reduce runs here on the gathered
    kernel rows. Both paths run the same functions and give the same tables.

    `min_bytes` keeps kernels and instances of at least that many bytes (sizes that are
    unknown are dropped when `min_bytes` > 0); it is applied after matching, so it never
    changes which kernels form an instance. The mismatches table keeps an instance when any
    member reaches `min_bytes`.
    """
    return reduce_kernels(_kernels_unfiltered(run, workers, steps, dask), min_bytes)


def reduce_kernels(kernels: pd.DataFrame, min_bytes: int = 0) -> CollectiveAnalysis:
    """The reduce of the cross-rank collective analyses: `worker_kernels` tables of several
    workers (concatenated in worker order) matched into instances keyed by (process group,
    step, ordinal), then the `min_bytes` filter (see `analyze_collectives`)."""
    members, instances, mismatches = _match_instances(kernels)
    if min_bytes > 0:
        kernels = kernels[_at_least(kernels["size_bytes"], min_bytes)]
        instances = instances[_at_least(instances["size_bytes"], min_bytes)]
        members = members[_at_least(members["size_bytes"], min_bytes)]
        big = pd.Series(_at_least(mismatches["size_bytes"], min_bytes), index=mismatches.index)
        keep = big.groupby([mismatches[k] for k in INSTANCE_KEY]).transform("any")
        mismatches = mismatches[keep.to_numpy(dtype=bool)]
    return CollectiveAnalysis(
        kernels=kernels.reset_index(drop=True),
        members=members.reset_index(drop=True),
        instances=instances.reset_index(drop=True),
        mismatches=mismatches.reset_index(drop=True),
    )


def collective_kernels(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    min_bytes: int = 0,
) -> pd.DataFrame:
    """One row per NCCL kernel of the selected workers (ranks) and steps.

    Columns:
      worker, rank, host, step, row (event row in the step file), device, stream,
      kernel_name, collective_name (the `Collective name` arg), collective_type (from
      `COLLECTIVE_TYPES`; null when the name is missing or unknown), process_group (the
      `Process Group Name` arg), process_group_ranks (its JSON text), group_size, dtype,
      dtype_size_bytes, in_nelems, out_nelems, in_split_size, out_split_size (the args'
      text), coalesced, uneven (bools),
      size_bytes = max(In msg nelems, Out msg nelems) x sizeof(dtype) (nullable; for a
      coalesced launch the args already hold the sum over its ops), size_note (why
      size_bytes is null),
      start_ns, end_ns (epoch ns), dur_ns (the kernel's own duration: includes waiting for
      the other ranks), launch_ns (start of the launching runtime/driver call; the kernel
      start where there is none), has_launch, ordinal (position among the rank's kernels of
      the same process group in the step, by launch_ns; null without a process group),
      algbw_incl_wait_gbps = size_bytes / dur_ns, busbw_factor (nccl-tests),
      busbw_incl_wait_gbps = algbw_incl_wait_gbps x busbw_factor (null for coalesced, uneven
      or untyped kernels), busbw_note (why busbw is null),
      overlap_ns, overlap_pct (share of dur_ns during which a compute kernel runs on another
      stream of the same device, 0..100).
    Definitions: METRICS.md, "Collectives"; this module's docstring.
    """
    return analyze_collectives(run, workers, steps, min_bytes).kernels


def collective_instances(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    min_bytes: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(instances, mismatches) of the selection.

    instances, one row per matched instance (members agree on every match field):
      process_group, step, ordinal (the key), collective_name, collective_type, dtype,
      group_size, in_nelems, out_nelems, size_bytes, coalesced, uneven, n_members,
      complete (one member per rank of the group),
      transfer_ns (shortest member duration), max_wait_ns, total_wait_ns,
      straggler_rank, straggler_worker (the member with wait 0), busbw_factor,
      algbw_gbps = size_bytes / transfer_ns, busbw_gbps = algbw_gbps x busbw_factor
      (null for coalesced/uneven/untyped), busbw_note, end_spread_ns and start_spread_ns
      (max - min member end/start on the aligned clock). Transfer, waits, straggler and
      bandwidths are null for incomplete instances.
    mismatches, one row per member of an instance whose members disagree:
      process_group, step, ordinal, worker, rank, collective_name, in_nelems, out_nelems,
      dtype, group_size, size_bytes, dur_ns, start_ns, mismatch_fields (the fields that
      differ, comma-separated).
    Definitions: METRICS.md, "Collectives"; this module's docstring.
    """
    a = analyze_collectives(run, workers, steps, min_bytes)
    return a.instances, a.mismatches


def collective_members(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    min_bytes: int = 0,
) -> pd.DataFrame:
    """The kernels of matched instances with their instance figures.

    Columns: those of `collective_kernels`, plus complete, transfer_ns, wait_ns
    (dur_ns - transfer_ns), is_straggler, clock_offset_ns, start_aligned_ns, end_aligned_ns,
    instance_busbw_gbps (from the transfer time). Definitions: METRICS.md, "Collectives".
    """
    return analyze_collectives(run, workers, steps, min_bytes).members


def stragglers(
    run: Run | None,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    min_bytes: int = 0,
    analysis: CollectiveAnalysis | None = None,
) -> pd.DataFrame:
    """Per rank: how often the others waited for it, over complete instances.

    Columns: worker, rank, n_instances, n_straggler (instances where it is the straggler),
    straggler_pct = 100 x n_straggler / n_instances, wait_ns (its own total wait),
    others_wait_ns (the other members' total wait in the instances where it is the
    straggler: the time it cost them). Sorted by n_straggler, descending.
    Pass `analysis` to reuse an `analyze_collectives` result (`run` and the selection
    arguments are then ignored).
    """
    a = analysis if analysis is not None else analyze_collectives(run, workers, steps, min_bytes)
    return stragglers_from_counts(straggler_counts(a, ["worker", "rank"]))


_STRAGGLER_COUNTS = ("n_instances", "n_straggler", "wait_ns", "others_wait_ns")


def straggler_counts(analysis: CollectiveAnalysis, by: list[str]) -> pd.DataFrame:
    """Per group of members of complete instances (`by`: ["worker", "rank"], or with
    "step"): n_instances, n_straggler, wait_ns (their own waits), others_wait_ns (the other
    members' waits in the instances where the member is the straggler). Sums, so groups
    add up: `stragglers_from_counts` of per-step counts summed over steps is `stragglers`."""
    m = analysis.members[analysis.members["complete"]]
    if m.empty:
        return pd.DataFrame(
            {
                **{k: pd.Series(dtype=object if k == "worker" else "int64") for k in by},
                **{c: pd.Series(dtype="int64") for c in _STRAGGLER_COUNTS},
            }
        )
    wait = m["wait_ns"].astype("int64")
    instance_wait = wait.groupby([m[k] for k in INSTANCE_KEY]).transform("sum")
    others = np.where(m["is_straggler"], instance_wait - wait, 0)
    return (
        pd.DataFrame(
            {
                **{k: m[k] for k in by},
                "n_instances": 1,
                "n_straggler": m["is_straggler"].astype("int64"),
                "wait_ns": wait,
                "others_wait_ns": others.astype("int64"),
            }
        )
        .groupby(by, as_index=False, sort=True)
        .sum()
    )


def stragglers_from_counts(counts: pd.DataFrame) -> pd.DataFrame:
    """The `stragglers` table from `straggler_counts` rows (summed per worker first)."""
    per = counts.groupby(["worker", "rank"], as_index=False, sort=True)[
        list(_STRAGGLER_COUNTS)
    ].sum()
    per["straggler_pct"] = (
        100.0 * per["n_straggler"] / per["n_instances"] if len(per) else pd.Series(dtype="float64")
    )
    cols = ["worker", "rank", "n_instances", "n_straggler", "straggler_pct", "wait_ns"]
    per = per[cols + ["others_wait_ns"]]
    for c in ("rank", "n_instances", "n_straggler", "wait_ns", "others_wait_ns"):
        per[c] = per[c].astype("int64")
    return per.sort_values(["n_straggler", "rank"], ascending=[False, True], ignore_index=True)


def collective_type_size_table(analysis: CollectiveAnalysis) -> pd.DataFrame:
    """Collective type x message-size bucket (powers of two), long form.

    Columns: collective_type (the `Collective name` where the type is unknown),
    size_bucket ("64 MiB-128 MiB"; "0 B" for empty messages), size_bucket_lo_bytes,
    n_kernels, n_instances (matched, complete), busbw_median_gbps (median over complete
    instances of their busbw, from transfer time), wait_median_ns (median over the members
    of complete instances), overlap_median_pct (median over kernels).
    Kernels of unknown size are left out. Definitions: METRICS.md, "Collectives".
    """
    k = analysis.kernels
    k = k[k["size_bytes"].notna()]
    ktype = k["collective_type"].astype(object).fillna(k["collective_name"].astype(object))
    klo = _bucket_lo(k["size_bytes"])
    kern = (
        pd.DataFrame(
            {"collective_type": ktype, "size_bucket_lo_bytes": klo, "overlap_pct": k["overlap_pct"]}
        )
        .groupby(["collective_type", "size_bucket_lo_bytes"])
        .agg(n_kernels=("overlap_pct", "size"), overlap_median_pct=("overlap_pct", "median"))
    )
    inst = analysis.instances
    inst = inst[inst["complete"] & inst["size_bytes"].notna()]
    itype = inst["collective_type"].astype(object).fillna(inst["collective_name"].astype(object))
    inst_stats = (
        pd.DataFrame(
            {
                "collective_type": itype,
                "size_bucket_lo_bytes": _bucket_lo(inst["size_bytes"]),
                "busbw_gbps": inst["busbw_gbps"],
            }
        )
        .groupby(["collective_type", "size_bucket_lo_bytes"])
        .agg(n_instances=("busbw_gbps", "size"), busbw_median_gbps=("busbw_gbps", "median"))
    )
    m = analysis.members
    m = m[m["complete"] & m["size_bytes"].notna()]
    mtype = m["collective_type"].astype(object).fillna(m["collective_name"].astype(object))
    wait_stats = (
        pd.DataFrame(
            {
                "collective_type": mtype,
                "size_bucket_lo_bytes": _bucket_lo(m["size_bytes"]),
                "wait_ns": m["wait_ns"].astype("float64"),
            }
        )
        .groupby(["collective_type", "size_bucket_lo_bytes"])
        .agg(wait_median_ns=("wait_ns", "median"))
    )
    out = kern.join(inst_stats, how="left").join(wait_stats, how="left").reset_index()
    out["n_instances"] = out["n_instances"].fillna(0).astype("int64")
    out["size_bucket"] = [size_bucket_label(int(lo)) for lo in out["size_bucket_lo_bytes"]]
    cols = [
        "collective_type",
        "size_bucket",
        "size_bucket_lo_bytes",
        "n_kernels",
        "n_instances",
        "busbw_median_gbps",
        "wait_median_ns",
        "overlap_median_pct",
    ]
    return out[cols].sort_values(["collective_type", "size_bucket_lo_bytes"], ignore_index=True)


def collective_rank_step_table(analysis: CollectiveAnalysis) -> pd.DataFrame:
    """Rank x step, long form.

    Columns: worker, rank, step, n_kernels, collective_ns (summed kernel durations, waits
    included), wait_ns (summed waits of its members of complete instances), transfer_ns
    (summed transfer times of those instances; both null where the rank has no kernel in a
    complete instance in that step), busbw_gbps = sum(size_bytes x busbw_factor) /
    sum(transfer_ns) over its members of complete instances that have a busbw (a time-weighted
    mean), overlap_pct = 100 x sum(overlap_ns) / sum(dur_ns).
    Definitions: METRICS.md, "Collectives".
    """
    k = analysis.kernels
    keys = ["worker", "rank", "step"]
    base = k.groupby(keys).agg(
        n_kernels=("dur_ns", "size"),
        collective_ns=("dur_ns", "sum"),
        overlap_ns=("overlap_ns", "sum"),
    )
    m = analysis.members
    m = m[m["complete"]]
    has_bw = m["instance_busbw_gbps"].notna()
    bus_bytes = (m["size_bytes"].astype("float64") * m["busbw_factor"]).where(has_bw, 0.0)
    bw_transfer = m["transfer_ns"].astype("float64").where(has_bw, 0.0)
    mem = (
        pd.DataFrame(
            {
                "worker": m["worker"],
                "rank": m["rank"],
                "step": m["step"],
                "wait_ns": m["wait_ns"].astype("int64"),
                "transfer_ns": m["transfer_ns"].astype("int64"),
                "bus_bytes": bus_bytes,
                "bw_transfer_ns": bw_transfer,
            }
        )
        .groupby(keys)
        .sum()
    )
    out = base.join(mem, how="left").reset_index()
    for c in ("wait_ns", "transfer_ns"):
        # Null, not 0, where none of the rank's kernels in the step is in a complete instance.
        out[c] = out[c].astype("Int64")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["busbw_gbps"] = np.where(
            out["bw_transfer_ns"] > 0, out["bus_bytes"] / out["bw_transfer_ns"], np.nan
        )
        out["overlap_pct"] = np.where(
            out["collective_ns"] > 0, 100.0 * out["overlap_ns"] / out["collective_ns"], np.nan
        )
    cols = keys + [
        "n_kernels",
        "collective_ns",
        "wait_ns",
        "transfer_ns",
        "busbw_gbps",
        "overlap_pct",
    ]
    return out[cols].sort_values(keys, ignore_index=True)


_HEATMAP_VALUES = {
    "type_size": {
        "busbw": "busbw_median_gbps",
        "wait": "wait_median_ns",
        "overlap": "overlap_median_pct",
        "count": "n_kernels",
    },
    "rank_step": {
        "busbw": "busbw_gbps",
        "wait": "wait_ns",
        "overlap": "overlap_pct",
        "time": "collective_ns",
        "count": "n_kernels",
    },
}


def collective_heatmap(
    run: Run | None,
    by: str = "type_size",
    value: str = "busbw",
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    min_bytes: int = 0,
    analysis: CollectiveAnalysis | None = None,
) -> pd.DataFrame:
    """A heatmap matrix: one of the long tables pivoted.

    by="type_size": rows collective_type, columns size_bucket (ascending size), value one of
    "busbw" (busbw_median_gbps), "wait" (wait_median_ns), "overlap" (overlap_median_pct),
    "count" (n_kernels); from `collective_type_size_table`.
    by="rank_step": rows rank, columns step, value one of "busbw" (busbw_gbps), "wait"
    (wait_ns), "overlap" (overlap_pct), "time" (collective_ns), "count" (n_kernels); from
    `collective_rank_step_table`. Empty cells are NaN. The value's column name (with its
    unit) is in `frame.attrs["value_column"]`. Pass `analysis` to reuse an
    `analyze_collectives` result (`run` and the selection arguments are then ignored).
    """
    if by not in _HEATMAP_VALUES:
        raise ValueError(f"by must be one of {sorted(_HEATMAP_VALUES)}, not {by!r}")
    columns = _HEATMAP_VALUES[by]
    if value not in columns:
        raise ValueError(f"value for by={by!r} must be one of {sorted(columns)}, not {value!r}")
    a = analysis if analysis is not None else analyze_collectives(run, workers, steps, min_bytes)
    if by == "type_size":
        table = collective_type_size_table(a)
    else:
        table = collective_rank_step_table(a)
    return heatmap_of_table(table, by, value)


def heatmap_of_table(table: pd.DataFrame, by: str, value: str) -> pd.DataFrame:
    """`collective_heatmap` from its long table already made (`collective_type_size_table`
    for by="type_size", a table with `collective_rank_step_table`'s columns for
    by="rank_step"), as the derived index holds them."""
    columns = _HEATMAP_VALUES[by]
    if value not in columns:
        raise ValueError(f"value for by={by!r} must be one of {sorted(columns)}, not {value!r}")
    column = columns[value]
    if by == "type_size":
        order = (
            table.drop_duplicates("size_bucket")
            .sort_values("size_bucket_lo_bytes")["size_bucket"]
            .tolist()
        )
        out = table.pivot(index="collective_type", columns="size_bucket", values=column)
        out = out.reindex(columns=order)
    else:
        out = table.pivot(index="rank", columns="step", values=column)
    out.attrs["value_column"] = column
    return out


# ----------------------------------------------------------------------------------------
# Kernel extraction


def _kernels_unfiltered(
    run: Run, workers: Iterable[str] | None, steps: Iterable[int] | None, dask=None
) -> pd.DataFrame:
    """The kernels table before the size filter (ordinals and overlap assigned): the map
    (`worker_kernels`, one worker's selected step files) over the selected workers, locally
    or as Dask tasks, concatenated in worker order."""
    names = resolve_workers(run, workers)
    chosen = resolve_steps(run, steps)
    if dask is None:
        frames = [worker_kernels(run, w, chosen) for w in names]
    else:
        from tessera_tb.backend import cross_rank

        frames = cross_rank.map_workers(dask, run, names, chosen, "collective_kernels")
    return concat_kernels(frames)


def concat_kernels(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """`worker_kernels` tables of several workers as one (the reduce's input)."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return _derive(_empty_kernels())
    return pd.concat(frames, ignore_index=True)


def worker_kernels(run: Run, worker: str, steps: Iterable[int]) -> pd.DataFrame:
    """The map of the cross-rank collective analyses: one worker's NCCL kernels over its
    selected steps (step files read one at a time), with overlap, sizes, types and ordinals
    (`collective_kernels`' columns). Ordinals and overlap are per worker, so the reduce
    (`_match_instances`, keyed by process group, step and ordinal) can take the workers'
    tables from anywhere."""
    wanted = set(steps)
    parts = [
        _step_collectives(run.load_step(worker, s)) for s in run.worker(worker).steps if s in wanted
    ]
    if not parts:
        return _derive(_empty_kernels())
    coll = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}
    compute = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
    coll["overlap_ns"] = _overlap_ns(coll, compute)
    info = run.worker(worker)
    frame = pd.DataFrame(coll)
    frame.insert(0, "worker", worker)
    frame.insert(1, "rank", int(info.rank))
    frame.insert(2, "host", info.meta.host)
    return _derive(frame)


def _step_collectives(step: StepData) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The collective kernels of one step (raw columns) and its compute kernels' intervals."""
    ev = step.events
    kind = ev["kind"]
    device_of_track = np.array([t.device for t in step.tracks], dtype=np.int64)
    stream_of_track = np.array([t.stream for t in step.tracks], dtype=np.int64)
    rows = np.flatnonzero(kind == KIND["collective"])
    start = ev["start_ns"][rows]
    dur = ev["dur_ns"][rows]
    launch = ev["launch"][rows]
    has_launch = launch >= 0
    launch_ns = np.where(has_launch, ev["start_ns"][np.maximum(launch, 0)], start)
    track = ev["track_id"][rows]
    coll = {
        "step": np.full(rows.size, step.step, dtype=np.int64),
        "row": rows.astype(np.int64),
        "device": device_of_track[track] if rows.size else np.zeros(0, np.int64),
        "stream": stream_of_track[track] if rows.size else np.zeros(0, np.int64),
        "kernel_name": step.string_values(ev["name_id"][rows]),
        "collective_name": _attr_at(step, "Collective name", rows, text=True),
        "process_group": _attr_at(step, "Process Group Name", rows, text=True),
        "process_group_ranks": _attr_at(step, "Process Group Ranks", rows, text=True),
        "group_size": _attr_at(step, "Group size", rows),
        "dtype": _attr_at(step, "dtype", rows, text=True),
        "in_nelems": _attr_at(step, "In msg nelems", rows),
        "out_nelems": _attr_at(step, "Out msg nelems", rows),
        "in_split_size": _attr_at(step, "In split size", rows, text=True),
        "out_split_size": _attr_at(step, "Out split size", rows, text=True),
        "start_ns": start,
        "end_ns": start + dur,
        "dur_ns": dur,
        "launch_ns": launch_ns,
        "has_launch": has_launch,
    }
    krows = np.flatnonzero(kind == KIND["kernel"])
    ktrack = ev["track_id"][krows]
    compute = {
        "device": device_of_track[ktrack] if krows.size else np.zeros(0, np.int64),
        "stream": stream_of_track[ktrack] if krows.size else np.zeros(0, np.int64),
        "start_ns": ev["start_ns"][krows],
        "end_ns": ev["start_ns"][krows] + ev["dur_ns"][krows],
    }
    return coll, compute


def _attr_at(step: StepData, key: str, rows: np.ndarray, text: bool = False) -> np.ndarray:
    """Attribute `key` at event `rows` as an object array (None where a row lacks it).

    Numeric args come back as Python numbers, text args as str; `text=True` turns numbers
    into their text (a trace may store an arg of either type).
    """
    out = np.full(rows.size, None, dtype=object)
    a = step.attrs_by_key.get(key)
    if a is None or a.rows.size == 0 or rows.size == 0:
        return out
    pos = np.minimum(np.searchsorted(a.rows, rows), a.rows.size - 1)
    has = a.rows[pos] == rows
    values = a.values[pos[has]]
    if a.type in ("string", "json"):
        values = step.string_values(values)
    elif text:
        values = values.astype(str)
    out[has] = values
    return out


def _empty_kernels() -> pd.DataFrame:
    cols = [
        "worker",
        "rank",
        "host",
        "step",
        "row",
        "device",
        "stream",
        "kernel_name",
        "collective_name",
        "process_group",
        "process_group_ranks",
        "group_size",
        "dtype",
        "in_nelems",
        "out_nelems",
        "in_split_size",
        "out_split_size",
        "start_ns",
        "end_ns",
        "dur_ns",
        "launch_ns",
        "has_launch",
        "overlap_ns",
    ]
    ints = {"rank", "step", "row", "device", "stream", "start_ns", "end_ns", "dur_ns"}
    ints |= {"launch_ns", "overlap_ns"}
    return pd.DataFrame(
        {
            c: pd.Series(dtype="int64" if c in ints else (bool if c == "has_launch" else object))
            for c in cols
        }
    )


def _derive(df: pd.DataFrame) -> pd.DataFrame:
    """Add types, sizes, ordinals, bandwidths and overlap % to the raw kernel columns."""
    name = df["collective_name"].astype(object)
    df["collective_type"] = name.map(COLLECTIVE_TYPES).astype(object)
    for c in ("group_size", "in_nelems", "out_nelems"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    df["dtype_size_bytes"] = df["dtype"].astype(object).map(DTYPE_SIZE_BYTES).astype("Int64")
    df["coalesced"] = name.str.contains("coalesced", regex=False).fillna(False).astype(bool)
    df["uneven"] = _non_empty_list(df["in_split_size"]) | _non_empty_list(df["out_split_size"])

    nelems = pd.concat([df["in_nelems"], df["out_nelems"]], axis=1).max(axis=1, skipna=False)
    size = (nelems * df["dtype_size_bytes"]).astype("Int64")
    no_nelems = df["in_nelems"].isna() | df["out_nelems"].isna()
    unknown_dtype = df["dtype_size_bytes"].isna()
    empty_coalesced = df["coalesced"] & (nelems == 0).fillna(False)
    size = size.mask(empty_coalesced.to_numpy(dtype=bool))
    df["size_bytes"] = size
    # Later assignments win: the first reason in this list is the one reported.
    note = np.full(len(df), None, dtype=object)
    note[empty_coalesced.to_numpy(dtype=bool)] = "coalesced launch without per-op sizes"
    bad_dtype = unknown_dtype.to_numpy(dtype=bool)
    if bad_dtype.any():
        dtypes = df["dtype"].astype(object).to_numpy()[bad_dtype]
        note[bad_dtype] = [
            f"unknown dtype {d!r}" if d is not None else "no dtype arg" for d in dtypes
        ]
    note[no_nelems.to_numpy(dtype=bool)] = "no In/Out msg nelems args"
    df["size_note"] = note

    df["ordinal"] = _ordinals(df)

    size_f = df["size_bytes"].astype("float64")
    dur_f = df["dur_ns"].astype("float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        df["algbw_incl_wait_gbps"] = np.where(dur_f > 0, size_f / dur_f, np.nan)
    df["busbw_factor"] = busbw_factor(df["collective_type"], df["group_size"])
    df["busbw_note"] = _busbw_note(df)
    df["busbw_incl_wait_gbps"] = (df["algbw_incl_wait_gbps"] * df["busbw_factor"]).where(
        df["busbw_note"].isna()
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        df["overlap_pct"] = np.where(dur_f > 0, 100.0 * df["overlap_ns"] / dur_f, np.nan)
    order = [
        "worker",
        "rank",
        "host",
        "step",
        "row",
        "device",
        "stream",
        "kernel_name",
        "collective_name",
        "collective_type",
        "process_group",
        "process_group_ranks",
        "group_size",
        "dtype",
        "dtype_size_bytes",
        "in_nelems",
        "out_nelems",
        "in_split_size",
        "out_split_size",
        "coalesced",
        "uneven",
        "size_bytes",
        "size_note",
        "start_ns",
        "end_ns",
        "dur_ns",
        "launch_ns",
        "has_launch",
        "ordinal",
        "algbw_incl_wait_gbps",
        "busbw_factor",
        "busbw_incl_wait_gbps",
        "busbw_note",
        "overlap_ns",
        "overlap_pct",
    ]
    return df[order]


def _non_empty_list(text: pd.Series) -> pd.Series:
    t = text.astype(object)
    stripped = t.str.replace(" ", "", regex=False)
    return (t.notna() & ~stripped.isin(["", "[]"])).astype(bool)


def _busbw_note(df: pd.DataFrame) -> pd.Series:
    """Why a kernel or instance has no busbw (None where it has one)."""
    note = np.select(
        [
            df["collective_name"].isna().to_numpy(dtype=bool),
            df["collective_type"].isna().to_numpy(dtype=bool),
            df["size_bytes"].isna().to_numpy(dtype=bool),
            df["coalesced"].to_numpy(dtype=bool),
            df["uneven"].to_numpy(dtype=bool),
            df["busbw_factor"].isna().to_numpy(dtype=bool),
        ],
        [
            "no Collective name arg",
            "unknown collective name: algbw only",
            "unknown size",
            "coalesced launch: algbw only",
            "uneven all_to_allv: algbw only",
            "no group size",
        ],
        default="",
    )
    return pd.Series(note, index=df.index, dtype=object).replace("", None)


def _ordinals(df: pd.DataFrame) -> pd.Series:
    """Per (worker, step, process group): 0, 1, ... by launch time (kernel start, row)."""
    has_pg = df["process_group"].notna().to_numpy(dtype=bool)
    out = pd.Series(pd.NA, index=df.index, dtype="Int64")
    if not has_pg.any():
        return out
    sub = df.loc[has_pg, ["worker", "step", "process_group", "launch_ns", "start_ns", "row"]]
    sub = sub.sort_values(["worker", "step", "process_group", "launch_ns", "start_ns", "row"])
    k = sub.groupby(["worker", "step", "process_group"], sort=False).cumcount()
    out.loc[k.index] = k.to_numpy()
    return out


def _overlap_ns(coll: dict[str, np.ndarray], compute: dict[str, np.ndarray]) -> np.ndarray:
    """Per collective: ns of its interval covered by compute kernels on other streams of
    its device (union of those kernels, so concurrent compute kernels count once)."""
    out = np.zeros(coll["start_ns"].size, dtype=np.int64)
    if out.size == 0 or compute["start_ns"].size == 0:
        return out
    pairs = np.unique(np.stack([coll["device"], coll["stream"]], axis=1), axis=0)
    for device, stream in pairs:
        mine = (coll["device"] == device) & (coll["stream"] == stream)
        others = (compute["device"] == device) & (compute["stream"] != stream)
        if not others.any():
            continue
        seg_start, seg_end = merged_segments(compute["start_ns"][others], compute["end_ns"][others])
        covered_before = np.concatenate([[0], np.cumsum(seg_end - seg_start)])
        lo, hi = coll["start_ns"][mine], coll["end_ns"][mine]
        out[mine] = _covered_until(hi, seg_start, seg_end, covered_before) - _covered_until(
            lo, seg_start, seg_end, covered_before
        )
    return out


def _covered_until(
    t: np.ndarray, seg_start: np.ndarray, seg_end: np.ndarray, covered_before: np.ndarray
) -> np.ndarray:
    """Length of the union segments before time t (vectorised over t)."""
    i = np.searchsorted(seg_start, t, side="right") - 1  # last segment starting at or before t
    inside = np.where(i >= 0, np.minimum(t, seg_end[np.maximum(i, 0)]) - seg_start[i], 0)
    return np.where(i >= 0, covered_before[np.maximum(i, 0)] + inside, 0)


def _at_least(size: pd.Series, min_bytes: int) -> np.ndarray:
    return (size >= min_bytes).fillna(False).to_numpy(dtype=bool)


def _bucket_lo(size: pd.Series) -> np.ndarray:
    s = size.astype("int64").to_numpy()
    lo = np.zeros(s.size, dtype=np.int64)
    pos = s > 0
    # Exact integer floor(log2): float log2 misplaces values just under a power of two.
    exp = np.frexp(s[pos].astype(np.float64))[1] - 1
    too_high = (np.int64(1) << exp.astype(np.int64)) > s[pos]
    exp = exp - too_high
    lo[pos] = np.int64(1) << exp.astype(np.int64)
    return lo


# ----------------------------------------------------------------------------------------
# Instances


def _match_instances(kernels: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(members, instances, mismatches) from the unfiltered kernels table."""
    cand = kernels[kernels["ordinal"].notna()].copy()
    cand["ordinal"] = cand["ordinal"].astype("int64")
    if cand.empty:
        return _empty_members(kernels), _empty_instances(), _empty_mismatches()
    keys = [cand[k] for k in INSTANCE_KEY]
    groups = cand.groupby(keys, sort=False)
    differs = {
        f: (groups[f].transform("nunique", dropna=False) > 1).to_numpy(dtype=bool)
        for f in MATCH_FIELDS
    }
    bad = np.logical_or.reduce(list(differs.values()))

    mism = cand[bad]
    fields = np.full(mism.shape[0], "", dtype=object)
    for f in MATCH_FIELDS:
        fields = np.where(differs[f][bad], fields + "," + f, fields)
    mismatches = mism[
        INSTANCE_KEY
        + ["worker", "rank", "host"]
        + list(MATCH_FIELDS)
        + ["size_bytes", "dur_ns", "start_ns"]
    ].copy()
    mismatches["mismatch_fields"] = [s.lstrip(",") for s in fields]
    mismatches = mismatches.sort_values(INSTANCE_KEY + ["rank"], ignore_index=True)

    m = cand[~bad].copy()
    if m.empty:
        return _empty_members(kernels), _empty_instances(), mismatches
    # Split sizes are not match fields: an instance is coalesced or uneven if any member is.
    g = m.groupby(INSTANCE_KEY, sort=False)
    m["coalesced"] = g["coalesced"].transform("any").to_numpy(dtype=bool)
    m["uneven"] = g["uneven"].transform("any").to_numpy(dtype=bool)
    m["busbw_note"] = _busbw_note(m)
    m["busbw_incl_wait_gbps"] = m["busbw_incl_wait_gbps"].where(m["busbw_note"].isna())
    m = _with_completeness(m)
    m = _with_waits(m)
    m = _with_aligned_clocks(m)
    instances = _instances_from_members(m)
    m = m.sort_values(INSTANCE_KEY + ["rank"], ignore_index=True)
    return m, instances, mismatches


def _with_completeness(m: pd.DataFrame) -> pd.DataFrame:
    """complete = one member per rank of the group (Group size ranks, each in the group)."""
    in_group = np.ones(m.shape[0], dtype=bool)
    ranks_text = m["process_group_ranks"].astype(object).to_numpy()
    rank = m["rank"].to_numpy()
    # A loop over the distinct rank lists (one per process group), not over kernels.
    for text in pd.unique(ranks_text[pd.notna(ranks_text)]):
        members = _parse_ranks(text)
        if members is not None:
            these = ranks_text == text
            in_group[these] = np.isin(rank[these], list(members))
    g = m.groupby(INSTANCE_KEY, sort=False)
    n_members = g["rank"].transform("size")
    n_ranks = g["rank"].transform("nunique")
    all_in = (
        pd.Series(in_group, index=m.index).groupby([m[k] for k in INSTANCE_KEY]).transform("all")
    )
    size = m["group_size"]
    m["n_members"] = n_members.astype("int64")
    m["complete"] = (
        ((n_members == size) & (n_ranks == n_members)).fillna(False) & all_in
    ).to_numpy(dtype=bool)
    return m


def _parse_ranks(text: str) -> frozenset[int] | None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(value, list):
        return None
    return frozenset(int(v) for v in value)


def _with_waits(m: pd.DataFrame) -> pd.DataFrame:
    """transfer_ns (shortest member), wait_ns, is_straggler; null for incomplete instances."""
    complete = m["complete"].to_numpy(dtype=bool)
    transfer = m.groupby(INSTANCE_KEY, sort=False)["dur_ns"].transform("min")
    m["transfer_ns"] = transfer.astype("Int64").where(complete)
    m["wait_ns"] = (m["dur_ns"].astype("Int64") - m["transfer_ns"]).astype("Int64")
    # The straggler: least wait (shortest kernel), lowest rank on ties.
    order = m.sort_values(INSTANCE_KEY + ["dur_ns", "rank"]).index
    first = ~m.loc[order, INSTANCE_KEY].duplicated()
    straggler = pd.Series(False, index=m.index)
    straggler.loc[order[first.to_numpy()]] = True
    m["is_straggler"] = (straggler & complete).to_numpy(dtype=bool)
    size_f = m["size_bytes"].astype("float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = size_f / m["transfer_ns"].astype("float64")
    m["instance_algbw_gbps"] = algbw.where(np.isfinite(algbw))
    m["instance_busbw_gbps"] = (m["instance_algbw_gbps"] * m["busbw_factor"]).where(
        m["busbw_note"].isna()
    )
    return m


def _with_aligned_clocks(m: pd.DataFrame) -> pd.DataFrame:
    """clock_offset_ns per member's host, and start/end on the reference host's clock."""
    hosts = m["host"].astype(object).fillna("")
    named = hosts[hosts != ""].unique()
    m["clock_offset_ns"] = np.zeros(m.shape[0], dtype=np.int64)
    if len(named) > 1:
        ref_host = hosts[m["rank"].idxmin()]
        comp = m[m["complete"].to_numpy(dtype=bool)]
        ends = (
            comp.assign(host=hosts[comp.index])
            .groupby(INSTANCE_KEY + ["host"])["end_ns"]
            .median()
            .unstack("host")
        )
        if ref_host in ends.columns:
            offsets = ends.sub(ends[ref_host], axis=0).median(axis=0, skipna=True)
            offsets = offsets.fillna(0).round().astype("int64")
            m["clock_offset_ns"] = hosts.map(offsets).fillna(0).astype("int64").to_numpy()
    m["start_aligned_ns"] = m["start_ns"] - m["clock_offset_ns"]
    m["end_aligned_ns"] = m["end_ns"] - m["clock_offset_ns"]
    return m


def _instances_from_members(m: pd.DataFrame) -> pd.DataFrame:
    g = m.groupby(INSTANCE_KEY, sort=True)
    first = g[
        [
            "collective_name",
            "collective_type",
            "dtype",
            "group_size",
            "in_nelems",
            "out_nelems",
            "size_bytes",
            "coalesced",
            "uneven",
            "n_members",
            "complete",
            "transfer_ns",
            "busbw_factor",
            "instance_algbw_gbps",
            "instance_busbw_gbps",
            "busbw_note",
        ]
    ].first()
    agg = g.agg(
        max_wait_ns=("wait_ns", "max"),
        total_wait_ns=("wait_ns", "sum"),
        end_max=("end_aligned_ns", "max"),
        end_min=("end_aligned_ns", "min"),
        start_max=("start_aligned_ns", "max"),
        start_min=("start_aligned_ns", "min"),
    )
    strag = m[m["is_straggler"]].set_index(INSTANCE_KEY)[["rank", "worker"]]
    strag = strag.rename(columns={"rank": "straggler_rank", "worker": "straggler_worker"})
    out = first.join(agg).join(strag, how="left")
    out["end_spread_ns"] = (out["end_max"] - out["end_min"]).astype("int64")
    out["start_spread_ns"] = (out["start_max"] - out["start_min"]).astype("int64")
    complete = out["complete"].to_numpy(dtype=bool)
    out["max_wait_ns"] = out["max_wait_ns"].astype("Int64").where(complete)
    out["total_wait_ns"] = out["total_wait_ns"].astype("Int64").where(complete)
    out["straggler_rank"] = out["straggler_rank"].astype("Int64")
    out = out.rename(
        columns={"instance_algbw_gbps": "algbw_gbps", "instance_busbw_gbps": "busbw_gbps"}
    ).reset_index()
    cols = INSTANCE_KEY + [
        "collective_name",
        "collective_type",
        "dtype",
        "group_size",
        "in_nelems",
        "out_nelems",
        "size_bytes",
        "coalesced",
        "uneven",
        "n_members",
        "complete",
        "transfer_ns",
        "max_wait_ns",
        "total_wait_ns",
        "straggler_rank",
        "straggler_worker",
        "busbw_factor",
        "algbw_gbps",
        "busbw_gbps",
        "busbw_note",
        "end_spread_ns",
        "start_spread_ns",
    ]
    return out[cols]


_MEMBER_EXTRA = {
    "n_members": "int64",
    "complete": bool,
    "transfer_ns": "Int64",
    "wait_ns": "Int64",
    "is_straggler": bool,
    "instance_algbw_gbps": "float64",
    "instance_busbw_gbps": "float64",
    "clock_offset_ns": "int64",
    "start_aligned_ns": "int64",
    "end_aligned_ns": "int64",
}


def _empty_members(kernels: pd.DataFrame) -> pd.DataFrame:
    out = kernels.iloc[0:0].copy()
    for c, dt in _MEMBER_EXTRA.items():
        out[c] = pd.Series(dtype=dt)
    return out


def _empty_instances() -> pd.DataFrame:
    return _instances_from_members(
        pd.DataFrame(
            {
                **{k: pd.Series(dtype="int64") for k in ("step", "ordinal", "rank")},
                "process_group": pd.Series(dtype=object),
                "worker": pd.Series(dtype=object),
                **{
                    c: pd.Series(dtype=object)
                    for c in (
                        "collective_name",
                        "collective_type",
                        "dtype",
                        "busbw_note",
                    )
                },
                **{
                    c: pd.Series(dtype="Int64")
                    for c in ("group_size", "in_nelems", "out_nelems", "size_bytes")
                },
                "coalesced": pd.Series(dtype=bool),
                "uneven": pd.Series(dtype=bool),
                "busbw_factor": pd.Series(dtype="float64"),
                **{c: pd.Series(dtype=dt) for c, dt in _MEMBER_EXTRA.items()},
            }
        )
    )


def _empty_mismatches() -> pd.DataFrame:
    cols = (
        INSTANCE_KEY
        + ["worker", "rank", "host"]
        + list(MATCH_FIELDS)
        + ["size_bytes", "dur_ns", "start_ns", "mismatch_fields"]
    )
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
