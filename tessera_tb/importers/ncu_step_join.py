"""Join Nsight Compute counters of NVTX-marked steps with a run's kernels.

`tessera-prof counters` (and `import-ncu` on a report whose rows carry the session's NVTX step
range `tessera_step_N`) profile kernels of one step of the same program run again. Each
profiled row knows its step from the NVTX column, and within the step the run knows every
launch in launch order with its name, grid and block. The join (docs/CAPTURE.md, "Hardware
counters"):

- exact (`measured`, match code MATCH_NAME): every launch of the step was profiled: profiled
  row i of step N is launch i of step N in the run, and its name key and launch configuration
  must agree (`kernel_names.kernel_name_key`, grid, block). Otherwise each profiled row is the
  first launch of its (name, grid, block) in the step not yet taken: ncu's
  `--filter-mode per-launch-config --launch-count 1` profiles exactly those;
- same kernel instance (`measured:same-kernel-instance`, MATCH_INSTANCE): every other launch
  of the run's recorded steps with the same (name, grid, block) gets that instance's counters;
  with an exact step, launch i of another step gets profiled row i when the two launches have
  the same key (steps of a steady training loop launch the same sequence).

The result is a CounterProfile with one entry per run launch that got counters (the metric
values of its profiled row repeated) plus one entry, unlinked, per profiled row that matched
no run kernel. `match_method` is METHOD_NVTX_STEP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tessera_tb.importers.ncu_attach import RunKernels, launch_config
from tessera_tb.importers.ncu_csv import NcuTable, counter_profile
from tessera_tb.importers.ncu_selection import kernel_key
from tessera_tb.nvtx_names import STEP_RANGE_PREFIX
from tessera_tb.trace.kernel_counters import (
    MATCH_INSTANCE,
    MATCH_NAME,
    MATCH_NONE,
    METHOD_NVTX_STEP,
    CounterMetric,
    CounterProfile,
    MatchReport,
)

_STEP_IN_RANGES = re.compile(re.escape(STEP_RANGE_PREFIX) + r"(\d+)\b")
_FIRST_MISMATCHES = 5


def nvtx_steps(table: NcuTable) -> np.ndarray:
    """Step per profiled row from the NVTX start/end range column (`tessera_step_N`), -1
    where the row lies in no such range (or the report was taken without `--nvtx`)."""
    out = np.full(table.count, -1, dtype=np.int64)
    for name, col in table.text.items():
        if "Start/Stop_Range" not in name and "Push/Pop_Range" not in name:
            continue
        for i, cell in enumerate(col):
            if out[i] < 0 and cell:
                m = _STEP_IN_RANGES.search(str(cell))
                if m:
                    out[i] = int(m.group(1))
    return out


@dataclass
class StepJoin:
    """How the profiled rows met the run's launches (one line each in the CLI)."""

    profiled: int = 0
    steps: list[int] = field(default_factory=list)
    exact_steps: list[int] = field(default_factory=list)  # steps joined by launch order
    profiled_matched: int = 0  # profiled rows linked to their own launch
    launches_measured: int = 0  # run launches with their own counters
    launches_same_instance: int = 0  # run launches with another launch's counters
    launches_without: int = 0  # run launches of the recorded steps without counters
    mismatches: list[str] = field(default_factory=list)  # first profiled rows without a kernel
    mismatched: int = 0
    duplicates: int = 0  # profiled rows of a kernel whose step launches all had counters
    distinct_run: int = 0  # distinct (name, grid, block) in the profiled steps of the run
    distinct_covered: int = 0
    missing_keys: list[str] = field(default_factory=list)  # distinct kernels without counters


def concat_tables(tables: list[NcuTable]) -> NcuTable:
    """Rows of several ncu passes as one table; IDs of later passes follow the earlier ones'
    (a metric or text column missing in a pass is NaN / None there)."""
    if len(tables) == 1:
        return tables[0]
    counts = [t.count for t in tables]
    ids, offset = [], 0
    for t in tables:
        ids.append(t.ids + offset)
        offset = int(ids[-1].max()) + 1 if t.count else offset
    values, units, source_units, text = {}, {}, {}, {}
    for t in tables:
        units.update(t.units)
        source_units.update(t.source_units)
    for name in dict.fromkeys(k for t in tables for k in t.values):
        values[name] = np.concatenate(
            [t.values.get(name, np.full(c, np.nan)) for t, c in zip(tables, counts)]
        )
    for name in dict.fromkeys(k for t in tables for k in t.text):
        parts = []
        for t, c in zip(tables, counts):
            col = t.text.get(name)
            parts.append(col if col is not None else np.full(c, None, dtype=object))
        text[name] = np.concatenate(parts)
    return NcuTable(
        path=tables[0].path,
        kernel_names=np.concatenate([t.kernel_names for t in tables]),
        ids=np.concatenate(ids).astype(np.int64),
        values=values,
        units=units,
        source_units=source_units,
        text=text,
        notes=[n for t in tables for n in t.notes],
    )


def _short(name: str, width: int = 70) -> str:
    name = str(name)
    return name if len(name) <= width else name[: width - 3] + "..."


def profiled_keys(table: NcuTable) -> list[str]:
    config = None
    if "Grid Size" in table.text and "Block Size" in table.text:
        config = launch_config(table.text["Grid Size"], table.text["Block Size"])
    return [
        kernel_key(n, None if config is None else config[i])
        for i, n in enumerate(table.kernel_names)
    ]


def join_steps(
    table: NcuTable,
    rk: RunKernels,
    *,
    row_steps: np.ndarray | None = None,
    worker: str = "ncu",
) -> tuple[CounterProfile, StepJoin]:
    """The joined profile and what happened (module docstring). `row_steps` overrides the
    step per profiled row (default: from the NVTX column)."""
    steps_of_rows = nvtx_steps(table) if row_steps is None else np.asarray(row_steps)
    pkeys = profiled_keys(table)
    rkeys = [kernel_key(n, c) for n, c in zip(rk.names, rk.launch_config)]
    order = np.argsort(table.ids, kind="stable")
    run_steps = list(dict.fromkeys(int(s) for s in rk.step))
    launches_of = {s: np.flatnonzero(rk.step == s) for s in run_steps}
    info = StepJoin(profiled=table.count)
    info.steps = sorted({int(s) for s in steps_of_rows if s >= 0})

    link = np.full(rk.step.size, -1, dtype=np.int64)  # run launch -> profiled row
    code = np.zeros(rk.step.size, dtype=np.uint8)
    instance: dict[str, int] = {}  # key -> profiled row standing for it
    position_rows: dict[int, np.ndarray] = {}  # exact step -> profiled rows in launch order
    unmatched = []
    for s in info.steps:
        rows = order[steps_of_rows[order] == s]
        launches = launches_of.get(s, np.zeros(0, np.int64))
        exact = rows.size <= launches.size and all(
            pkeys[r] == rkeys[launches[i]] for i, r in enumerate(rows)
        )
        if exact:
            info.exact_steps.append(s)
            position_rows[s] = rows
            link[launches[: rows.size]] = rows
            code[launches[: rows.size]] = MATCH_NAME
        else:
            free: dict[str, list[int]] = {}
            for j in launches[::-1]:
                free.setdefault(rkeys[j], []).append(int(j))
            for r in rows:
                slots = free.get(pkeys[r])
                if slots:
                    j = slots.pop()
                    link[j], code[j] = r, MATCH_NAME
                elif pkeys[r] in free:
                    # another sample of a kernel whose launches all have counters already
                    # (a later ncu pass profiled it again): not a mismatch, not stored
                    info.duplicates += 1
                else:
                    unmatched.append(int(r))
        for r in rows:
            instance.setdefault(pkeys[r], int(r))
        keys_here = {rkeys[j] for j in launches}
        info.distinct_run += len(keys_here)
        covered = {k for k in keys_here if k in instance}
        info.distinct_covered += len(covered)
        missing = [k for k in dict.fromkeys(rkeys[j] for j in launches) if k not in covered]
        info.missing_keys += missing

    exact_ref = position_rows[info.exact_steps[0]] if info.exact_steps else None
    for s in run_steps:
        for i, j in enumerate(launches_of[s]):
            if link[j] >= 0:
                continue
            if exact_ref is not None and i < exact_ref.size and pkeys[exact_ref[i]] == rkeys[j]:
                link[j], code[j] = exact_ref[i], MATCH_INSTANCE
                continue
            r = instance.get(rkeys[j])
            if r is not None:
                link[j], code[j] = r, MATCH_INSTANCE

    info.profiled_matched = int(np.unique(link[code == MATCH_NAME]).size)
    info.launches_measured = int((code == MATCH_NAME).sum())
    info.launches_same_instance = int((code == MATCH_INSTANCE).sum())
    info.launches_without = int((link < 0).sum())
    no_step = order[steps_of_rows[order] < 0]
    unmatched += [int(r) for r in no_step]
    info.mismatched = len(unmatched)
    for r in unmatched[:_FIRST_MISMATCHES]:
        s = int(steps_of_rows[r])
        where = f"step {s}" if s >= 0 else "no tessera_step range"
        info.mismatches.append(
            f"profiled #{table.ids[r]} ({where}) {_short(table.kernel_names[r])} "
            f"[{pkeys[r].split(' | ')[1]}]: no launch of the run's step has this name, "
            "grid and block"
        )

    linked = np.flatnonzero(link >= 0)
    src = np.concatenate([link[linked], np.array(unmatched, dtype=np.int64)])
    base = counter_profile(table, worker)
    n = src.size
    metrics = {
        name: CounterMetric(m.name, m.unit, m.values[src], m.source, m.source_unit, m.capability)
        for name, m in base.metrics.items()
    }
    profile = CounterProfile(
        worker=worker,
        source=base.source,
        source_format=base.source_format,
        match_method=METHOD_NVTX_STEP,
        match_note=join_note(info),
        compute_capability=base.compute_capability,
        device_name=base.device_name,
        profiled_id=table.ids[src].astype(np.int64),
        kernel_names=table.kernel_names[src],
        step=np.concatenate([rk.step[linked], np.zeros(len(unmatched), np.int64)]),
        row=np.concatenate([rk.row[linked], np.full(len(unmatched), -1, np.int32)]).astype(
            np.int32
        ),
        match=np.concatenate([code[linked], np.full(len(unmatched), MATCH_NONE, np.uint8)]),
        metrics=metrics,
        report=MatchReport(
            profiled_kernels=table.count,
            run_kernels=int(rk.step.size),
            matched=info.profiled_matched,
            mismatched=info.mismatched,
            first_mismatches=list(info.mismatches),
        ),
    )
    assert profile.count == n
    return profile, info


def join_note(info: StepJoin) -> str:
    steps = ",".join(str(s) for s in info.steps) or "none"
    how = "launch order" if info.exact_steps else "first launch of each (name, grid, block)"
    return (
        f"joined by NVTX step range (steps {steps}; {how}): {info.launches_measured} launches "
        f"measured, {info.launches_same_instance} with the counters of the same kernel's "
        f"profiled instance"
    )
