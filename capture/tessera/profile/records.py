"""Portable records: one `Record` per kernel, NCCL kernel, memcpy and memset of a run.

```python
for rec in sess.records():  # or tessera_tb.trace.records("runs/exp1")
    if rec.kind == "kernel":
        print(rec.kernel_name, rec.sm_occupancy, rec.tc_util_pct, rec.capability["tc_util_pct"])
frame = records_frame(sess.records())  # pandas, one row per record (Record.to_dict())
```

A `Record` has attribute access with the portable schema's names (`GUIDE_FIELDS`: kind,
kernel_name, stream_id, start_us, end_us, the counters, memcpy, collective and NVML fields)
plus what the trace adds (`EXTRA_FIELDS`: step, rank, worker, device, grid, block,
registers, start_ns, dur_ns, dur_us), and `capability`: field -> why it is null (or how it
was measured). It is also a read-only mapping with the trace's own keys (`FIELDS` and
`capabilities`: name, stream, start_ns, dur_ns, ...), so `rec["name"]` keeps working.
start_us and end_us are epoch microseconds (start_ns / 1e3, (start_ns + dur_ns) / 1e3) as
floats, exact to 0.25 µs at today's epoch; start_ns and dur_ns are exact.

A record carries where and when the device work ran, its launch shape, and the portable
kernel counters of METRICS.md ("Kernel counters"). Anything unknown is None, and the record's
`capabilities` dict says why, keyed by field:

- `unavailable:no-ncu` — hardware counters need Nsight Compute (`tessera-prof counters RUN
  -- PROGRAM` or `tessera-prof import-ncu`); where the run has Nsight Compute counters
  matched with this kernel they are filled in, and their capability says how:
  `measured` (this launch was profiled) or `measured:same-kernel-instance` (another launch of
  the same kernel name, grid and block was profiled and stands for this one);
- `estimated:...` — `sm_occupancy` from Kineto's `est. achieved occupancy %` (an estimate
  from the launch configuration, not a measurement);
- `n/a:...` — the field does not apply (memcpy fields of a kernel, collective fields of a
  memcpy);
- `unavailable:...` — other reasons (no NVML samples, no `bytes` arg, ...).

Field definitions:

- name, kind (`kernel`, `collective`, `memcpy`, `memset`), step, rank, worker, device,
  stream, start_ns (epoch ns), dur_ns;
- grid, block: lists of 3 ints from the trace args; registers: registers per thread;
- memcpy_dir: the direction in the memcpy's name (`HtoD`, `DtoH`, `DtoD`, `HtoH`, `PtoP`);
  memcpy_gbps = `bytes` arg / dur_ns (GB/s = 1e9 bytes/s);
- collective_type, collective_bytes, collective_overlap_pct: from the collectives analysis
  (`backend.collectives.collective_kernels`: type from `Collective name`, bytes = max(In, Out
  msg nelems) x dtype size, overlap with compute kernels on other streams of the device);
- power_w, temp_c, throttle_reason: the NVML sample of the kernel's device nearest in time to
  the kernel's start, among the samples of its step (samples are `sample_interval_ms` apart,
  so the value is at most half an interval old or early; on a tie the earlier sample);
  throttle_reason names the set bits of NVML's clock-event-reason bitmask ("none" when no
  bit is set).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from tessera_tb.trace.kernel_counters import MATCH_CAPABILITY, MEASURED
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import KIND, StepData

RECORD_KINDS = ("kernel", "collective", "memcpy", "memset")
NCU_COUNTERS = (
    "warp_divergence_pct",
    "inst_issue_eff_pct",
    "dram_read_gbps",
    "dram_write_gbps",
    "l2_hit_rate",
    "smem_bank_conflicts",
    "tc_util_pct",
    "alu_util_pct",
    "cp_async_inflight",
)
FIELDS = (
    "name",
    "kind",
    "step",
    "rank",
    "worker",
    "device",
    "stream",
    "start_ns",
    "dur_ns",
    "grid",
    "block",
    "registers",
    "sm_occupancy",
    *NCU_COUNTERS,
    "memcpy_dir",
    "memcpy_gbps",
    "collective_type",
    "collective_bytes",
    "collective_overlap_pct",
    "power_w",
    "temp_c",
    "throttle_reason",
)
GUIDE_FIELDS = (
    "kind",
    "kernel_name",
    "stream_id",
    "start_us",
    "end_us",
    "sm_occupancy",
    *NCU_COUNTERS,
    "memcpy_dir",
    "memcpy_gbps",
    "collective_type",
    "collective_bytes",
    "collective_overlap_pct",
    "power_w",
    "temp_c",
    "throttle_reason",
)
EXTRA_FIELDS = (
    "step", "rank", "worker", "device", "grid", "block", "registers", "start_ns", "dur_ns",
    "dur_us",
)  # fmt: skip
# Portable-schema name -> how it is computed from the trace's own keys.
_DERIVED = {
    "kernel_name": lambda d: d["name"],
    "stream_id": lambda d: d["stream"],
    "start_us": lambda d: d["start_ns"] / 1e3,
    "end_us": lambda d: (d["start_ns"] + d["dur_ns"]) / 1e3,
    "dur_us": lambda d: d["dur_ns"] / 1e3,
    "capability": lambda d: d["capabilities"],
}
NO_NCU = "unavailable:no-ncu"


class Record(Mapping):
    """One portable record: attributes with the portable schema's names, a read-only mapping
    with the trace's keys (module docstring). Unknown values are None, never 0."""

    __slots__ = ("_d",)

    def __init__(self, fields: dict):
        object.__setattr__(self, "_d", fields)

    def __getattr__(self, name: str):
        d = object.__getattribute__(self, "_d")
        if name in d:
            return d[name]
        derive = _DERIVED.get(name)
        if derive is None:
            raise AttributeError(f"record has no field {name!r}")
        return derive(d)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("records are read-only")

    def __getitem__(self, key: str):
        d = self._d
        if key in d:
            return d[key]
        if key in _DERIVED:
            return _DERIVED[key](d)
        raise KeyError(key)

    def __iter__(self):
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __dir__(self):
        return sorted(set(GUIDE_FIELDS) | set(EXTRA_FIELDS) | {"capability", "name", "stream"})

    def __repr__(self) -> str:
        d = self._d
        return (
            f"Record(kind={d['kind']!r}, kernel_name={d['name']!r}, step={d['step']}, "
            f"worker={d['worker']!r}, start_us={d['start_ns'] / 1e3:.3f}, "
            f"dur_us={d['dur_ns'] / 1e3:.3f})"
        )

    def to_dict(self) -> dict:
        """The portable schema's fields, then the trace's extras, then `capability`."""
        out = {f: getattr(self, f) for f in GUIDE_FIELDS}
        out.update((f, getattr(self, f)) for f in EXTRA_FIELDS)
        out["capability"] = dict(self._d["capabilities"])
        return out


def records_frame(records: Iterable[Record]):
    """A pandas DataFrame with one row per record (`Record.to_dict()` columns); unknown
    values are None/NaN."""
    import pandas as pd

    rows = [r.to_dict() for r in records]
    columns = [*GUIDE_FIELDS, *EXTRA_FIELDS, "capability"]
    return pd.DataFrame(rows, columns=columns)


_HOW = "_capability"  # key of a linked kernel's measured/same-instance tag in its counters
# NVML clock event (throttle) reason bits, nvml.h `nvmlClocksEventReason*`.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_MEMCPY_DIR = re.compile(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD|AtoA|AtoH|HtoA)\b")


def throttle_names(mask: float) -> str | None:
    """`sw_power_cap|hw_slowdown` from an NVML bitmask; "none" for 0; None for NaN."""
    if not np.isfinite(mask):
        return None
    bits = int(mask)
    if bits == 0:
        return "none"
    names = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
    rest = bits & ~sum(THROTTLE_BITS)
    if rest:
        names.append(f"0x{rest:x}")
    return "|".join(names)


def _attr(step: StepData, key: str, rows: np.ndarray) -> list:
    s = step.attr(key)
    if s.empty:
        return [None] * rows.size
    s = s[~s.index.duplicated()]
    return [None if _missing(v) else v for v in s.reindex(rows).tolist()]


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and not np.isfinite(v))


def _dims(v) -> list[int] | None:
    if v is None:
        return None
    try:
        out = json.loads(v) if isinstance(v, str) else v
    except ValueError:
        return None
    return [int(x) for x in out] if isinstance(out, list) else None


def _sample_at(step: StepData, device: int, name: str, t_ns: np.ndarray) -> np.ndarray | None:
    """The counter's sample nearest to each time (the earlier one on a tie); None if the step
    has no such counter for the device."""
    series = [c for c in step.counters if c.name == name and c.device == device]
    if not series or np.asarray(series[0].ts_ns).size == 0:
        return None
    c = series[0]
    ts = np.asarray(c.ts_ns, dtype=np.int64)
    order = np.argsort(ts, kind="stable")
    ts, values = ts[order], np.asarray(c.values, dtype=np.float64)[order]
    after = np.clip(np.searchsorted(ts, t_ns, side="left"), 0, ts.size - 1)
    before = np.clip(after - 1, 0, ts.size - 1)
    pick = np.where(np.abs(t_ns - ts[before]) <= np.abs(ts[after] - t_ns), before, after)
    return values[pick]


def _ncu_links(run: Run, worker: str):
    try:
        from tessera_tb.backend.counter_join import linked_kernels, worker_profiles
    except ImportError:
        return None, None
    profile = worker_profiles(run, [worker]).get(worker)
    return profile, linked_kernels


def _collectives(run: Run, worker: str, steps: list[int]) -> dict[tuple[int, int], dict]:
    try:
        from tessera_tb.backend.collectives import collective_kernels
    except ImportError:
        return {}
    k = collective_kernels(run, workers=[worker], steps=steps)
    out = {}
    for rec in k[["step", "row", "collective_type", "size_bytes", "overlap_pct"]].to_dict(
        "records"
    ):
        out[(int(rec["step"]), int(rec["row"]))] = rec
    return out


def step_records(
    step: StepData,
    *,
    worker: str,
    rank: int,
    profile=None,
    linked_kernels=None,
    collectives: dict | None = None,
) -> list[Record]:
    """The records of one step (see the module docstring)."""
    ev = step.events
    codes = np.array([KIND[k] for k in RECORD_KINDS], dtype=np.uint8)
    rows = np.flatnonzero(np.isin(ev["kind"], codes))
    if rows.size == 0:
        return []
    tracks = step.tracks
    track = ev["track_id"][rows]
    device = np.array([tracks[t].device for t in track], dtype=np.int64)
    stream = np.array([tracks[t].stream for t in track], dtype=np.int64)
    names = step.string_values(ev["name_id"][rows]).tolist()
    kinds = [RECORD_KINDS[list(codes).index(k)] for k in ev["kind"][rows].tolist()]
    start = ev["start_ns"][rows]
    dur = ev["dur_ns"][rows]
    grid = _attr(step, "grid", rows)
    block = _attr(step, "block", rows)
    regs = _attr(step, "registers per thread", rows)
    occ = _attr(step, "est. achieved occupancy %", rows)
    nbytes = _attr(step, "bytes", rows)

    # Nsight Compute counters matched with these kernels, when the run has them.
    ncu: dict[int, dict] = {}
    ncu_caps: dict[str, str] = {}
    if profile is not None and linked_kernels is not None:
        idx, linked_rows = linked_kernels(profile, step)
        for name in ("sm_occupancy", *NCU_COUNTERS):
            metric = profile.metrics.get(name)
            ncu_caps[name] = metric.capability if metric is not None else NO_NCU
        for i, r in zip(idx.tolist(), linked_rows.tolist()):
            ncu[r] = {n: profile.values(n)[i] for n in ("sm_occupancy", *NCU_COUNTERS)}
            ncu[r][_HOW] = MATCH_CAPABILITY.get(int(profile.match[i]), MEASURED)

    nvml = {}
    for d in np.unique(device).tolist():
        sel = device == d
        for name in ("power_w", "temp_c", "throttle_reasons"):
            values = _sample_at(step, d, name, start[sel])
            if values is not None:
                nvml.setdefault(name, np.full(rows.size, np.nan))[sel] = values
    has_nvml = {d: any(c.device == d and c.source == "nvml" for c in step.counters)
                for d in np.unique(device).tolist()}  # fmt: skip

    out = []
    for i, row in enumerate(rows.tolist()):
        kind = kinds[i]
        caps: dict[str, str] = {}
        rec = {
            "name": names[i],
            "kind": kind,
            "step": step.step,
            "rank": rank,
            "worker": worker,
            "device": int(device[i]),
            "stream": int(stream[i]),
            "start_ns": int(start[i]),
            "dur_ns": int(dur[i]),
            "grid": _dims(grid[i]),
            "block": _dims(block[i]),
            "registers": int(regs[i]) if regs[i] is not None else None,
        }
        is_kernel = kind in ("kernel", "collective")
        for f in ("grid", "block", "registers"):
            if rec[f] is None:
                caps[f] = (
                    "unavailable:not in the trace args"
                    if is_kernel
                    else f"n/a:not a kernel ({kind})"
                )
        measured = ncu.get(row)
        if measured is not None and np.isfinite(measured["sm_occupancy"]):
            rec["sm_occupancy"] = float(measured["sm_occupancy"])
            caps["sm_occupancy"] = measured[_HOW]
        elif occ[i] is not None:
            rec["sm_occupancy"] = float(occ[i])
            caps["sm_occupancy"] = "estimated:Kineto est. achieved occupancy % (launch config)"
        else:
            rec["sm_occupancy"] = None
            caps["sm_occupancy"] = (
                ncu_caps.get("sm_occupancy", NO_NCU) if is_kernel else f"n/a:not a kernel ({kind})"
            )
        for name in NCU_COUNTERS:
            value = measured.get(name) if measured is not None else None
            if value is not None and np.isfinite(value):
                rec[name] = float(value)
                caps[name] = measured[_HOW]
            else:
                rec[name] = None
                if not is_kernel:
                    caps[name] = f"n/a:not a kernel ({kind})"
                elif measured is not None:
                    caps[name] = ncu_caps.get(name, NO_NCU)
                else:
                    caps[name] = NO_NCU
        if kind == "memcpy":
            m = _MEMCPY_DIR.search(names[i])
            rec["memcpy_dir"] = m.group(1) if m else None
            if m is None:
                caps["memcpy_dir"] = "unavailable:no direction in the memcpy name"
            if nbytes[i] is not None and dur[i] > 0:
                rec["memcpy_gbps"] = float(nbytes[i]) / float(dur[i])
            else:
                rec["memcpy_gbps"] = None
                caps["memcpy_gbps"] = "unavailable:no bytes arg or zero duration"
        else:
            rec["memcpy_dir"] = rec["memcpy_gbps"] = None
            caps["memcpy_dir"] = caps["memcpy_gbps"] = f"n/a:not a memcpy ({kind})"
        coll = (collectives or {}).get((step.step, row)) if kind == "collective" else None
        if coll is not None:
            rec["collective_type"] = coll["collective_type"] or None
            rec["collective_bytes"] = _num(coll["size_bytes"], int)
            rec["collective_overlap_pct"] = _num(coll["overlap_pct"], float)
            for f in ("collective_type", "collective_bytes", "collective_overlap_pct"):
                if rec[f] is None:
                    caps[f] = "unavailable:missing NCCL args (Collective name, msg nelems, dtype)"
        else:
            for f in ("collective_type", "collective_bytes", "collective_overlap_pct"):
                rec[f] = None
                caps[f] = (
                    f"n/a:not a collective ({kind})"
                    if kind != "collective"
                    else "unavailable:no collectives analysis"
                )
        for field, counter in (("power_w", "power_w"), ("temp_c", "temp_c")):
            v = nvml.get(counter)
            rec[field] = float(v[i]) if v is not None and np.isfinite(v[i]) else None
        t = nvml.get("throttle_reasons")
        rec["throttle_reason"] = throttle_names(t[i]) if t is not None else None
        for f in ("power_w", "temp_c", "throttle_reason"):
            if rec[f] is None:
                caps[f] = (
                    "unavailable:NVML could not read this counter on the device"
                    if has_nvml.get(int(device[i]))
                    else "unavailable:no NVML samples in the step (activity 'power' off, no "
                    "driver, or a step shorter than the sampling interval)"
                )
        rec["capabilities"] = caps
        out.append(Record(rec))
    return out


def _num(v, cast):
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return cast(f) if np.isfinite(f) else None


def kernel_records(
    run: Run, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> Iterator[Record]:
    """Records of the selected workers and steps, step by step (one step file in memory)."""
    from tessera_tb.backend.selection import resolve_steps, resolve_workers

    chosen = set(resolve_steps(run, steps))
    for worker in resolve_workers(run, workers):
        info = run.worker(worker)
        worker_steps = [s for s in info.steps if s in chosen]
        profile, linker = _ncu_links(run, worker)
        collectives = _collectives(run, worker, worker_steps)
        for s in worker_steps:
            yield from step_records(
                run.load_step(worker, s),
                worker=worker,
                rank=int(info.meta.rank),
                profile=profile,
                linked_kernels=linker,
                collectives=collectives,
            )
