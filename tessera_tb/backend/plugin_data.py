"""What the plugin's routes answer, as plain functions testable without a server.

Each function takes a `RunIndex`, a `RunEntry` or a `Run` plus a parsed selection, calls the
analysis functions of `tessera_tb.backend` (never recomputing a metric here) and returns a
JSON-ready dict. Tables travel column-wise: `{"columns": [...], "data": [[col 0], [col 1], ...]}`
(`table_payload`). `encode_json` turns numpy values into Python natives and NaN/inf into null.

Parameters from requests are resolved against what the index discovered (`resolve_run`,
`parse_workers`, `parse_steps`); a bad one raises `tensorboard.errors.NotFoundError` or
`InvalidArgumentError`, which TensorBoard answers as a 404/400 with a one-line message.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec
import numpy as np
import pandas as pd
from tensorboard import errors

from tessera_tb.backend.run_index import CachedRun, RunEntry, RunIndex
from tessera_tb.backend.selection import steady_state_step
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.reader import Run
from tessera_tb.trace.step import Attr, StepData

# JSON ------------------------------------------------------------------------------------------


def _column_values(values: np.ndarray | pd.Series) -> list:
    """One column as a list of Python natives; NaN, inf and NA become None."""
    arr = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
    if arr.dtype.kind == "f":
        out = arr.astype(object)
        out[~np.isfinite(arr)] = None
        return out.tolist()
    if arr.dtype.kind in "iub":
        return arr.tolist()
    if arr.dtype.kind == "M":
        return [None if pd.isna(v) else str(v) for v in arr]
    return [_native(v) for v in arr.tolist()]


def table_payload(df: pd.DataFrame, max_rows: int | None = None) -> dict:
    """A DataFrame as {"columns", "data" (one list per column), "total_rows"}.

    `max_rows` keeps the first rows only (the frame is already sorted by the analysis).
    """
    total = len(df)
    if max_rows is not None:
        df = df.iloc[:max_rows]
    return {
        "columns": [str(c) for c in df.columns],
        "data": [_column_values(df[c]) for c in df.columns],
        "total_rows": total,
    }


def _native(value):
    """A value of any payload as JSON-ready Python (recursively)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, pd.DataFrame):
        return table_payload(value)
    if isinstance(value, (pd.Series, np.ndarray)):
        return _column_values(value)
    if isinstance(value, dict):
        return {str(k): _native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_native(v) for v in value]
    if value is pd.NA or value is pd.NaT:
        return None
    return str(value)


def encode_json(payload) -> bytes:
    """UTF-8 JSON of `payload` with numpy values as natives and NaN/inf as null."""
    return json.dumps(_native(payload), allow_nan=False, separators=(",", ":")).encode()


# Parameters ------------------------------------------------------------------------------------

_STEP_RANGE = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")


def resolve_run(index: RunIndex, name: str | None) -> RunEntry:
    """The discovered run with exactly this name; NotFoundError otherwise."""
    if not name:
        raise errors.InvalidArgumentError("missing parameter: run")
    try:
        entry = index.entry(name)
    except KeyError:
        raise errors.NotFoundError(f"no run named {name!r}") from None
    if entry.run is None:
        raise errors.NotFoundError(f"run {name!r} cannot be read: {entry.error}")
    return entry


def parse_workers(run: Run, spec: str | None) -> list[str]:
    """Workers of a selection spec, in rank order.

    Spec forms: empty (every worker), `rank0,rank1` (names), `ranks:0-3,6` (by rank),
    `host:NAME` (every worker on a host), `pg:NAME` (the ranks of a process group).
    """
    workers = run.workers
    if not spec:
        return sorted(workers, key=lambda w: (workers[w].rank, w))
    kind, _, value = spec.partition(":")
    if kind == "ranks" and value:
        ranks = set(_parse_int_ranges(value, "ranks"))
        chosen = [w for w, info in workers.items() if info.rank in ranks]
    elif kind == "host" and value:
        chosen = [w for w, info in workers.items() if info.meta.host == value]
    elif kind == "pg" and value:
        members = {
            r
            for info in workers.values()
            for pg in info.meta.process_groups
            if pg.name == value or pg.desc == value
            for r in pg.ranks
        }
        chosen = [w for w, info in workers.items() if info.rank in members]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        for n in names:
            if n not in workers:
                raise errors.NotFoundError(f"run has no worker {n!r}")
        chosen = list(dict.fromkeys(names))
    if not chosen:
        raise errors.NotFoundError(f"no worker matches {spec!r}")
    return sorted(chosen, key=lambda w: (workers[w].rank, w))


def _parse_int_ranges(text: str, what: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        m = _STEP_RANGE.match(part)
        if not m:
            raise errors.InvalidArgumentError(f"bad {what} {text!r}: use e.g. 4-6,9")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi - lo > 1_000_000:
            raise errors.InvalidArgumentError(f"bad {what} range {part!r}")
        out.extend(range(lo, hi + 1))
    return out


def parse_steps(run: Run, workers: Iterable[str], spec: str | None) -> list[int]:
    """Steps of a selection spec (`4-6,9`; empty = every step of the chosen workers).

    Every step named must exist on at least one chosen worker (NotFoundError otherwise);
    a range keeps only the steps that exist.
    """
    available = sorted({s for w in workers for s in run.worker(w).steps})
    if not spec:
        return available
    have = set(available)
    wanted = _parse_int_ranges(spec, "steps")
    chosen = sorted(s for s in set(wanted) if s in have)
    singles = [int(p) for p in spec.split(",") if p.strip().lstrip("-").isdigit()]
    missing = [s for s in singles if s not in have]
    if missing or not chosen:
        raise errors.NotFoundError(f"no step(s) {missing or spec} in this selection")
    return chosen


def parse_step(run: Run, worker: str, spec: str | None) -> int:
    """One step of one worker; the steady-state step when `spec` is empty."""
    if not spec:
        return steady_state_step(run, worker)
    try:
        step = int(spec)
    except ValueError:
        raise errors.InvalidArgumentError(f"bad step {spec!r}") from None
    if step not in run.worker(worker).steps:
        raise errors.NotFoundError(f"worker {worker!r} has no step {step}")
    return step


def parse_int(value: str | None, default: int, lo: int, hi: int, what: str) -> int:
    if value in (None, ""):
        return default
    try:
        n = int(value)
    except ValueError:
        raise errors.InvalidArgumentError(f"bad {what} {value!r}") from None
    if not lo <= n <= hi:
        raise errors.InvalidArgumentError(f"{what} must be within {lo}..{hi}")
    return n


# Runs, workers, steps ---------------------------------------------------------------------------


def runs_listing(index: RunIndex) -> dict:
    """Every discovered run with its workers, steps and errors (nothing is loaded).

    A run, worker or step that cannot be read carries an `error` and the rest is listed as
    usual. Steps carry their span (`start_ns`, `end_ns`, epoch ns), `dur_ms` and
    `event_count` from the worker's step index. `logdir_error` says why a logdir URL could not
    be listed (null when it could, and for a local logdir).
    """
    entries = index.entries()
    return {
        "runs": [_run_listing(index, entries[name]) for name in sorted(entries)],
        "logdir_error": index.logdir_error,
    }


def runs_json(index: RunIndex) -> bytes:
    """`runs_listing` encoded, cached until a run changes or a step file fails to load (a
    run of a thousand ranks lists each worker's steps: worth keeping)."""
    entries = index.entries()
    key = (
        "runs",
        tuple((n, e.signature, e.error) for n, e in sorted(entries.items())),
        index.step_errors_key(),
        index.logdir_error,
    )
    return index.cached_result(key, lambda: encode_json(runs_listing(index)))


def header_json(index: RunIndex, entry: RunEntry) -> bytes:
    """`run_header` encoded, cached per run signature."""
    key = ("header", entry.name, entry.signature)
    return index.cached_result(key, lambda: encode_json(run_header(index, entry)))


def _run_listing(index: RunIndex, entry: RunEntry) -> dict:
    item: dict = {"name": entry.name, "error": entry.error, "workers": []}
    for worker, problem in sorted(entry.worker_errors.items()):
        item["workers"].append({"name": worker, "error": problem, "steps": []})
    if entry.run is None:
        return item
    run = entry.run
    bad = index.known_step_errors(entry)
    for w in parse_workers(run, None):
        info = run.workers[w]
        meta = info.meta
        item["workers"].append(
            {
                "name": w,
                "rank": meta.rank,
                "world_size": meta.world_size,
                "host": meta.host,
                "error": None,
                "process_groups": [_process_group(pg) for pg in meta.process_groups],
                "steps": [
                    {
                        "step": e.step,
                        "start_ns": e.start_ns,
                        "end_ns": e.end_ns,
                        "dur_ms": (e.end_ns - e.start_ns) / 1e6,
                        "event_count": e.event_count,
                        "error": bad.get((w, e.step)),
                    }
                    for e in meta.steps
                ],
            }
        )
    item["workers"].sort(key=lambda x: (x.get("rank", 1 << 30), x["name"]))
    first = next((w for w in parse_workers(run, None) if run.workers[w].steps), None)
    item["default_step"] = steady_state_step(run, first) if first else None
    item["default_steps"] = default_steps(run, first) if first else None
    return item


# A process group's rank list is listed in full up to this many ranks; a larger one only as
# ranges (`ranks_text`), so the listing of a 1,024-rank run is not a million numbers.
LISTED_GROUP_RANKS = 64


def _process_group(pg) -> dict:
    """A process group in the runs listing: name, desc, size, ranks (null past
    LISTED_GROUP_RANKS) and ranks_text ("0-1023" ranges)."""
    # Every worker of a run lists the same groups: each is made once, keyed by its bytes.
    return dict(_process_group_of(pg.SerializeToString(deterministic=True), LISTED_GROUP_RANKS))


@functools.lru_cache(maxsize=4096)
def _process_group_of(pg_bytes: bytes, listed: int) -> tuple:
    pg = pb.ProcessGroup.FromString(pg_bytes)
    ranks = list(pg.ranks)
    return (
        ("name", pg.name),
        ("desc", pg.desc),
        ("size", pg.size),
        ("ranks", ranks if len(ranks) <= listed else None),
        ("ranks_text", _ranges_text(ranks)),
    )


def _ranges_text(values: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts: list[list[int]] = []
    for v in sorted(set(values)):
        if parts and parts[-1][1] == v - 1:
            parts[-1][1] = v
        else:
            parts.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


DEFAULT_STEP_RANGE = 8


def default_steps(run: Run, worker: str) -> str:
    """The step range a view opens with: every step when the worker has at most
    DEFAULT_STEP_RANGE, else that many consecutive steps from the steady-state step (so the
    first view of a long run reads a bounded number of step files)."""
    steps = run.worker(worker).steps
    if len(steps) > DEFAULT_STEP_RANGE:
        i = steps.index(steady_state_step(run, worker))
        i = max(0, min(i, len(steps) - DEFAULT_STEP_RANGE))
        steps = steps[i : i + DEFAULT_STEP_RANGE]
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def _devices_used(run, worker: str) -> set[int] | None:
    """Ids of the devices `worker`'s steady-state step ran GPU work on; None when that is not
    known (no steps, an unreadable step, or no GPU track: then every listed device counts)."""
    if not run.workers[worker].steps:
        return None
    try:
        step = run.load_step(worker, steady_state_step(run, worker))
    except Exception:  # a corrupt step: the header still answers
        return None
    used = {t.device for t in step.tracks if t.kind == "device_stream" and t.device >= 0}
    return used or None


def run_header(index: RunIndex, entry: RunEntry) -> dict:
    """GPU model, clocks, framework versions and what data is missing and why.

    Devices are counted per model over distinct (host, device id) of all workers, counting
    only the devices a worker ran GPU work on (its steady-state step's device streams): a
    trace lists every GPU the process could see (`deviceProperties`), one per worker used.
    Clocks are the medians of the NVML `sm_clock_mhz` / `mem_clock_mhz` counter tracks in the first
    worker's steady-state step
    (null when NVML was not sampled; `missing` then says why). `missing` lists every
    capability (WorkerMeta and Step) whose status is not `ok`, with its reason and workers.
    """
    run = entry.run
    assert run is not None
    workers = parse_workers(run, None)
    models: dict[tuple, int] = {}
    seen: set[tuple[str, int]] = set()
    for w in workers:
        meta = run.workers[w].meta
        used = _devices_used(run, w)
        for d in meta.devices:
            if used is not None and d.id not in used:  # listed by the source, never ran on
                continue
            if (meta.host, d.id) in seen:  # workers of one host list the same devices
                continue
            seen.add((meta.host, d.id))
            key = (d.name, d.num_sms, d.total_global_mem_bytes, d.compute_major, d.compute_minor)
            models[key] = models.get(key, 0) + 1
    devices = [
        {
            "name": name,
            "count": n,
            "num_sms": sms,
            "memory_bytes": mem,
            "compute_capability": f"{major}.{minor}",
        }
        for (name, sms, mem, major, minor), n in models.items()
    ]
    first = workers[0]
    meta = run.workers[first].meta
    missing: dict[tuple[str, str, str], list[str]] = {}
    for w in workers:
        for c in run.workers[w].meta.capabilities:
            if c.status != "ok":
                missing.setdefault((c.name, c.status, c.reason), []).append(w)
    clocks = {"sm_clock_mhz": None, "mem_clock_mhz": None, "source": None}
    if run.workers[first].steps:
        step_no = steady_state_step(run, first)
        try:
            step = run.load_step(first, step_no)
        except Exception as exc:  # a corrupt step: the header still answers
            missing.setdefault(("clocks", "unavailable", str(exc)), []).append(first)
        else:
            for c in step.capabilities:
                if c.status != "ok":
                    missing.setdefault((c.name, c.status, c.reason), []).append(first)
            for c in step.counters:
                if c.name in ("sm_clock_mhz", "mem_clock_mhz") and c.values.size:
                    finite = c.values[np.isfinite(c.values)]
                    if finite.size:
                        clocks[c.name] = float(np.median(finite))
                        clocks["source"] = f"NVML median, {first} step {step_no}"
    return {
        "run": entry.name,
        "num_workers": len(workers),
        "world_size": meta.world_size,
        "backend": meta.backend,
        "devices": devices,
        "clocks": clocks,
        "versions": dict(sorted(meta.versions.items())),
        "source_format": meta.source_format,
        "origin": meta.origin,
        "capabilities": [
            {"name": c.name, "status": c.status, "reason": c.reason} for c in meta.capabilities
        ],
        "missing": [
            {"name": name, "status": status, "reason": reason, "workers": ws}
            for (name, status, reason), ws in missing.items()
        ],
        "worker_errors": entry.worker_errors,
    }


# Views ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The parsed selection of a request: workers (rank order), steps, one step, extras."""

    workers: tuple[str, ...]
    steps: tuple[int, ...]
    params: tuple[tuple[str, str], ...]

    def param(self, key: str, default: str | None = None) -> str | None:
        return dict(self.params).get(key, default)


@dataclass(frozen=True)
class View:
    """A route's data function and the query keys (beyond run/workers/steps) it reads.

    `reads(run, sel)`: the workers whose step files the view reads (default: every selected
    worker); only those are checked for unreadable step files first. A view answering from
    the run's derived index, or capped to a few ranks, reads fewer."""

    compute: Callable[[Run, Selection], dict]
    params: tuple[str, ...] = ()
    reads: Callable[[Run, Selection], list[str]] | None = None


VIEWS: dict[str, View] = {}


def view(name: str, params: tuple[str, ...] = (), reads=None):
    """Register a data function as the view `name` (the route `/name`)."""

    def register(fn: Callable[[Run, Selection], dict]):
        VIEWS[name] = View(fn, params, reads)
        return fn

    return register


def _selection(index: RunIndex, spec: View, args) -> tuple[RunEntry, Selection]:
    entry = resolve_run(index, args.get("run"))
    run = entry.run
    workers = parse_workers(run, args.get("workers"))
    steps = parse_steps(run, workers, args.get("steps"))
    params = tuple((k, args.get(k, "")) for k in spec.params)
    return entry, Selection(tuple(workers), tuple(steps), params)


def view_payload(index: RunIndex, name: str, args) -> dict:
    """The view's answer as a dict (DataFrames not yet encoded), with `errors` listing the
    (worker, step) files of the selection that could not be read and were left out."""
    spec = VIEWS.get(name)
    if spec is None:
        raise errors.NotFoundError(f"no view {name!r}")
    entry, sel = _selection(index, spec, args)
    reads = spec.reads(entry.run, sel) if spec.reads is not None else list(sel.workers)
    run, bad = index.usable_run(entry, reads, list(sel.steps))
    readable = {s for w in (reads or sel.workers) for s in run.worker(w).steps}
    steps = tuple(s for s in sel.steps if s in readable)
    errs = [{"worker": w, "step": s, "error": e} for (w, s), e in sorted(bad.items())]
    if not steps:
        raise errors.NotFoundError(
            "no readable step in the selection: "
            + "; ".join(f"{e['worker']} step {e['step']}: {e['error']}" for e in errs)
        )
    try:
        payload = spec.compute(run, Selection(sel.workers, steps, sel.params))
    except TraceFormatError as exc:  # a corrupt file outside the step files (kernel counters)
        raise errors.NotFoundError(f"{name} cannot be shown: {exc.problem}") from None
    payload["errors"] = errs
    payload["selection"] = {"workers": list(sel.workers), "steps": list(steps)}
    return payload


# A view's JSON carries at most this many rows per table (`total_rows` says how many there are),
# except the tables it names in `whole_tables` (curves); its CSV download carries them all.
MAX_TABLE_ROWS = 2000


def view_json(index: RunIndex, name: str, args) -> bytes:
    """`view_payload` encoded as JSON, cached per run signature and parameters."""
    spec = VIEWS.get(name)
    if spec is None:
        raise errors.NotFoundError(f"no view {name!r}")
    entry, sel = _selection(index, spec, args)
    key = (name, entry.name, entry.signature, sel)

    return index.cached_result(key, lambda: _encoded(view_payload(index, name, args)))


def _encoded(payload: dict) -> bytes:
    """A view payload's JSON: each table column-wise, at most MAX_TABLE_ROWS rows except the
    tables named in `whole_tables`."""
    whole = set(payload.pop("whole_tables", ()))
    payload["tables"] = {
        k: table_payload(df, None if k in whole else MAX_TABLE_ROWS)
        for k, df in payload.get("tables", {}).items()
    }
    return encode_json(payload)


def standalone_view(run: Run, name: str, args: dict[str, str] | None = None) -> dict:
    """A view's answer for a run opened outside the plugin (the offline HTML report): the same
    data function, selection parsing and table encoding as the route, as JSON-ready Python.
    `args` holds the route's query parameters (workers, steps and the view's own)."""
    spec = VIEWS.get(name)
    if spec is None:
        raise errors.NotFoundError(f"no view {name!r}")
    args = args or {}
    workers = parse_workers(run, args.get("workers"))
    steps = parse_steps(run, workers, args.get("steps"))
    params = tuple((k, str(args.get(k, ""))) for k in spec.params)
    payload = spec.compute(run, Selection(tuple(workers), tuple(steps), params))
    payload["errors"] = []
    payload["selection"] = {"workers": workers, "steps": steps}
    return json.loads(_encoded(payload))


def _compute(fn: Callable[[], pd.DataFrame | dict]):
    """Run an analysis; its ValueError (a bad sort column, k, metric) becomes a 400."""
    try:
        return fn()
    except ValueError as exc:
        raise errors.InvalidArgumentError(str(exc)) from None


# Top-k tables (backend/topk.py) -------------------------------------------------------------------

TOPK_TABLES = ("operators", "kernels")


@view("topk", params=("table", "k", "sort", "q", "by_shape"))
def topk_view(run: Run, sel: Selection) -> dict:
    """Operators (`topk.op_table`) or kernels (`topk.kernel_table`) of the selection, the top
    `k` by `sort` plus an "(other)" row; `q` filters names (case-insensitive substring)."""
    from tessera_tb.backend import topk

    table = sel.param("table") or "operators"
    if table not in TOPK_TABLES:
        raise errors.InvalidArgumentError(f"table must be one of {', '.join(TOPK_TABLES)}")
    k = parse_int(sel.param("k"), 20, 1, 100_000, "k")
    sort = sel.param("sort") or None
    search = sel.param("q") or None
    workers, steps = list(sel.workers), list(sel.steps)
    if table == "operators":
        by_shape = sel.param("by_shape") in ("1", "true")
        df = _compute(
            lambda: topk.op_table(
                run, workers, steps, by_input_dims=by_shape, sort=sort, k=k, search=search
            )
        )
    else:
        df = _compute(
            lambda: topk.kernel_table(
                run, workers, steps, sort=sort or "total_dur_ns", k=k, search=search
            )
        )
    return {"table": table, "k": k, "sort": sort, "tables": {table: df}}


# Downloads ----------------------------------------------------------------------------------------

_FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_CSV_FORMULA_START = ("=", "+", "@", "\t", "\r")


def download_name(*parts: object, suffix: str) -> str:
    """A file name made of `parts` with only [A-Za-z0-9._-] (names come from users)."""
    text = "_".join(_FILENAME_UNSAFE.sub("_", str(p)).strip("._") for p in parts if str(p))
    return (text or "tessera")[:180] + suffix


def table_csv(index: RunIndex, args) -> tuple[bytes, str]:
    """One table of a view as CSV: `view` and `table` name it, the other parameters are the
    view's. Text cells that a spreadsheet would run as a formula get a leading quote."""
    name = args.get("view", "")
    table = args.get("table", "")
    payload = compare_payload(index, args) if name == "compare" else view_payload(index, name, args)
    tables = payload.get("tables", {})
    if table not in tables:
        raise errors.NotFoundError(
            f"view {name!r} has no table {table!r}; it has {', '.join(sorted(tables)) or 'none'}"
        )
    df = tables[table].copy()
    for c in df.columns:
        if df[c].dtype == object or pd.api.types.is_string_dtype(df[c]):
            text = df[c].astype(object).where(df[c].notna(), "").astype(str)
            risky = text.str.startswith(_CSV_FORMULA_START)
            df[c] = df[c].where(~risky, "'" + text)
    body = df.to_csv(index=False).encode()
    return body, download_name(args.get("run"), name, table, suffix=".csv")


def step_window(step: StepData, lo_ns: int, hi_ns: int) -> StepData:
    """The events of `step` that overlap [lo_ns, hi_ns) (instants: lo_ns <= ts < hi_ns), with
    their attributes, flow points and the counter samples inside the window. Row references
    to events left out become -1 (no reference)."""
    ev = step.events
    start, dur = ev["start_ns"], ev["dur_ns"]
    keep = ((start < hi_ns) & (start + dur > lo_ns)) | ((dur == 0) & (start >= lo_ns))
    keep &= start < hi_ns
    rows = np.flatnonzero(keep)
    new_row = np.full(step.num_events, -1, dtype=np.int32)
    new_row[rows] = np.arange(rows.size, dtype=np.int32)

    def remap(refs: np.ndarray) -> np.ndarray:
        return np.where(refs >= 0, new_row[np.maximum(refs, 0)], -1).astype(np.int32)

    events = {k: v[rows] for k, v in ev.items()}
    events["parent"] = remap(events["parent"])
    events["launch"] = remap(events["launch"])
    attrs = []
    for a in step.attrs:
        m = keep[a.rows]
        attrs.append(Attr(a.key, a.type, new_row[a.rows[m]], a.values[m]))
    flows = {}
    if step.flows:
        frow = step.flows["row"]
        kept = (frow >= 0) & keep[np.maximum(frow, 0)] if frow.size else frow.astype(bool)
        flows = {k: v[kept] for k, v in step.flows.items()}
        flows["row"] = new_row[flows["row"]]
    counters = []
    for c in step.counters:
        m = (c.ts_ns >= lo_ns) & (c.ts_ns < hi_ns)
        counters.append(dataclasses.replace(c, ts_ns=c.ts_ns[m], values=c.values[m]))
    return dataclasses.replace(step, events=events, attrs=attrs, flows=flows, counters=counters)


def chrome_trace(index: RunIndex, args) -> tuple[bytes, str]:
    """The selected workers' steps, cut to the window [t0, t1) (ns offsets from
    `timeline_origin_ns`; default: the whole steps), as one Chrome/Perfetto trace JSON
    (`exporters.chrome_trace`)."""
    from tessera_tb.exporters.chrome_trace import chrome_trace as to_chrome_trace

    entry = resolve_run(index, args.get("run"))
    workers = parse_workers(entry.run, args.get("workers") or args.get("worker"))
    steps = parse_steps(entry.run, workers, args.get("steps"))
    run, _ = index.usable_run(entry, workers, steps)
    origin, end = timeline_origin_ns(run, steps)
    t0 = parse_int(args.get("t0"), 0, -(10**15), 10**15, "t0")
    t1 = parse_int(args.get("t1"), end - origin, -(10**15), 10**15, "t1")
    if t1 <= t0:
        raise errors.InvalidArgumentError("t1 must be after t0")
    parts = [
        step_window(run.load_step(w, s), origin + t0, origin + t1)
        for w in workers
        for s in steps
        if s in run.worker(w).steps
    ]
    if not parts:
        raise errors.NotFoundError("no readable step in the selection")
    name = workers[0] if len(workers) == 1 else None
    body = msgspec.json.encode(to_chrome_trace(parts, process_name=name))
    label = f"steps{steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step{steps[0]}"
    return body, download_name(args.get("run"), label, suffix=".trace.json")


# Overview (backend/breakdown.py, summary.py, findings.py) -----------------------------------------


# The overview reads the step files of at most this many selected ranks (the straggler ranks
# of the derived index first, then by rank); it says so when it leaves ranks out.
OVERVIEW_MAX_WORKERS = 4


def _overview_workers(run: Run, sel: Selection) -> list[str]:
    """The selected workers whose step files the overview reads (see OVERVIEW_MAX_WORKERS)."""
    if len(sel.workers) <= OVERVIEW_MAX_WORKERS:
        return list(sel.workers)
    first: list[str] = []
    summary = _summary_for(run, sel)
    if summary is not None:
        strag = summary.tables["stragglers"]
        strag = strag[(strag["n_straggler"] > 0) & strag["worker"].isin(sel.workers)]
        first = strag.sort_values("others_wait_ns", ascending=False)["worker"].head(4).tolist()
    chosen = set(first)
    for w in sel.workers:
        if len(chosen) >= OVERVIEW_MAX_WORKERS:
            break
        chosen.add(w)
    return [w for w in sel.workers if w in chosen]


@view("overview", reads=_overview_workers)
def overview_view(run: Run, sel: Selection) -> dict:
    """Step time breakdown per (worker, step) (`breakdown.step_time_breakdown`), the per-step
    summary (`summary.step_summary`: GPU busy, tensor-core %, occupancy), the per-worker
    summary over the range (`summary.summary`), findings (`findings.findings`) and step-time
    distribution (`summary.step_time_distribution`).

    Past OVERVIEW_MAX_WORKERS selected ranks, the tables read from step files cover the
    ranks `_overview_workers` picks (`capped` says which), while the step-time distribution
    and, where the run's derived index answers (`_summary_for`), the rank x step table
    (`rank_step`: step and collective times of every selected rank) and the straggler
    findings (`findings.straggler_findings`) cover every selected rank."""
    from tessera_tb.backend import breakdown, findings, summary

    workers, steps = _overview_workers(run, sel), list(sel.steps)
    per_step = summary.step_summary(run, workers, steps)
    index = _summary_for(run, sel) if len(run.workers) >= LARGE_RUN_WORKERS else None
    # With the index, straggler findings come from it (instances matched over every rank).
    found = findings.findings(run, workers, steps, collective_stragglers=index is None)
    extra: dict = {}
    if index is not None:
        rs = index.tables["rank_step"]
        rs = rs[rs["worker"].isin(sel.workers) & rs["step"].isin(steps)]
        from_index = findings.index_straggler_findings(
            index.tables, list(sel.workers), steps, run.name
        )
        found = pd.concat([from_index, found], ignore_index=True).sort_values(
            ["win_ms_per_step", "worker"], ascending=[False, True], kind="stable"
        )
        extra["rank_step"] = rs.drop(columns=["host"]).reset_index(drop=True)
    found["steps"] = [list(s) for s in found["steps"]]
    capped = None
    if len(workers) < len(sel.workers):
        capped = {
            "shown": workers,
            "of": len(sel.workers),
            "note": (
                f"per-step tables and step findings cover {len(workers)} of the "
                f"{len(sel.workers)} selected ranks (the stragglers first, then by rank); "
                "select a rank range, host or process group to see others"
            ),
        }
    return {
        "capped": capped,
        "whole_tables": ["rank_step"] if "rank_step" in extra else [],
        "categories": list(breakdown.CATEGORIES),
        "tables": {
            **extra,
            "breakdown": breakdown.step_time_breakdown(run, workers, steps),
            "step_summary": per_step,
            "summary": summary.summary(run, workers, steps),
            "findings": found,
            "step_times": summary.step_time_distribution(run, list(sel.workers)),
        },
    }


# Timeline (backend/timeline.py) -------------------------------------------------------------------

TIMELINE_MAX_ITEMS = 20_000
TIMELINE_MAX_BYTES = 2_000_000


def _timeline_index(run: Run, worker: str, step: int):
    from tessera_tb.backend.timeline import TimelineIndex

    if isinstance(run, CachedRun):
        return run.step_derived(worker, step, "timeline_index", TimelineIndex.build)
    return TimelineIndex.build(run.load_step(worker, step))


def timeline_origin_ns(run: Run, steps: Iterable[int]) -> tuple[int, int]:
    """(origin, end) of a timeline over `steps`, epoch ns from the step indexes: the earliest
    start of the first step over every worker of the run (so every rank's window shares one
    time axis) and the latest end of the last step."""
    wanted = set(steps)
    spans = [
        (e.start_ns, e.end_ns)
        for info in run.workers.values()
        for e in info.meta.steps
        if e.step in wanted
    ]
    return min(s for s, _ in spans), max(e for _, e in spans)


# The timeline draws at most this many of the selected ranks (one request each).
TIMELINE_MAX_WORKERS = 16


def _timeline_reads(run: Run, sel: Selection) -> list[str]:
    worker = sel.param("worker") or sel.workers[0]
    return [worker] if worker in sel.workers else list(sel.workers[:1])


@view(
    "timeline",
    params=("worker", "t0", "t1", "max_items", "resolution_ns", "q"),
    reads=_timeline_reads,
)
def timeline_view(run: Run, sel: Selection) -> dict:
    """One worker's window of the selected (consecutive) steps (`timeline.timeline_window`).

    `t0`/`t1` are ns offsets from the run's origin for these steps (`timeline_origin_ns`, sent
    back as `origin_ns`, a string: epoch ns do not fit a browser's numbers); the answer's own
    offsets are from its `origin_ns` too, re-based here (`shift_ns` = 0 after re-basing).
    The answer never exceeds TIMELINE_MAX_BYTES: `max_items` is halved until it fits.
    """
    from tessera_tb.backend.timeline import timeline_window

    worker = sel.param("worker") or sel.workers[0]
    if worker not in sel.workers:
        raise errors.NotFoundError(f"worker {worker!r} is not in the selection")
    steps = [s for s in sel.steps if s in run.worker(worker).steps]
    if not steps:
        raise errors.NotFoundError(f"worker {worker!r} has none of the selected steps")
    origin, end = timeline_origin_ns(run, sel.steps)
    t0 = parse_int(sel.param("t0"), 0, -(10**15), 10**15, "t0")
    t1 = parse_int(sel.param("t1"), end - origin, -(10**15), 10**15, "t1")
    if t1 <= t0:
        raise errors.InvalidArgumentError("t1 must be after t0")
    max_items = parse_int(sel.param("max_items"), 4000, 1, TIMELINE_MAX_ITEMS, "max_items")
    resolution = parse_int(sel.param("resolution_ns"), 0, 0, 10**12, "resolution_ns") or None
    indexes = [_timeline_index(run, worker, s) for s in steps]
    while True:
        answer = _compute(
            lambda n=max_items: timeline_window(
                indexes,
                start_ns=origin + t0,
                end_ns=origin + t1,
                resolution_ns=resolution,
                max_items=n,
                search=sel.param("q") or None,
            )
        )
        size = len(encode_json(answer))
        if size <= TIMELINE_MAX_BYTES or max_items <= 100:
            break
        max_items //= 2
    shift = answer["origin_ns"] - origin
    for key in ("start_ns", "end_ns"):
        answer[key] += shift
    for table in ("events", "summaries"):
        for key in ("start_ns", "end_ns"):
            if key in answer[table]:
                answer[table][key] = [v + shift for v in answer[table][key]]
    for f in ("from_ns", "to_ns"):
        answer["flows"][f] = [v + shift for v in answer["flows"].get(f, [])]
    for s in answer["steps"]:
        s["start_ns"] += shift
        s["end_ns"] += shift
    for c in answer["counters"]:
        c["t_ns"] = [v + shift for v in c["t_ns"]]
    shown = list(sel.workers[:TIMELINE_MAX_WORKERS])
    answer.update(
        worker=worker,
        shown_workers=shown,
        workers_note=(
            f"the timeline draws the first {len(shown)} of the {len(sel.workers)} selected "
            "ranks; select a rank range, host or process group to see others"
            if len(shown) < len(sel.workers)
            else None
        ),
        origin_ns=str(origin),
        extent_ns=end - origin,
        max_items=max_items,
        response_bytes=size,
    )
    return answer


@view("event", params=("worker", "step", "row"))
def event_view(run: Run, sel: Selection) -> dict:
    """Everything about one event (`timeline.event_detail`); epoch-ns times also as text."""
    from tessera_tb.backend.timeline import event_detail

    worker = sel.param("worker") or sel.workers[0]
    if worker not in sel.workers:
        raise errors.NotFoundError(f"worker {worker!r} is not in the selection")
    step = parse_step(run, worker, sel.param("step"))
    row = parse_int(sel.param("row"), -1, 0, 2**31, "row")
    try:
        detail = event_detail(_timeline_index(run, worker, step), row)
    except IndexError as exc:
        raise errors.NotFoundError(str(exc)) from None
    detail["worker"] = worker
    detail["start_epoch_ns"] = str(detail["start_ns"])
    return detail


# Collectives (backend/collectives.py) -------------------------------------------------------------

COLLECTIVE_METRICS = ("busbw", "wait", "overlap", "count")


def _heatmap_payload(frame: pd.DataFrame) -> dict:
    return {
        "value_column": frame.attrs.get("value_column"),
        "rows": [_native(v) for v in frame.index.tolist()],
        "columns": [_native(v) for v in frame.columns.tolist()],
        "z": [_column_values(frame.iloc[i].to_numpy(dtype=float)) for i in range(len(frame))],
    }


# From this many workers on, the cross-rank views answer from the run's derived index for any
# selection (backend/cross_rank.py): a subset's instances are matched over the whole run.
# Smaller runs use it when the selection is the whole run (then the answer is the same).
LARGE_RUN_WORKERS = 64


def _summary_for(run: Run, sel: Selection, min_bytes: int = 0):
    """The run's derived index when this view may answer from it (see LARGE_RUN_WORKERS),
    else None."""
    if min_bytes or not isinstance(run, CachedRun) or run.signature is None:
        return None
    whole = len(sel.workers) == len(run.workers) and set(sel.steps) == set(run.steps)
    if not whole and len(run.workers) < LARGE_RUN_WORKERS:
        return None
    return run.run_summary()


def _collectives_reads(run: Run, sel: Selection) -> list[str]:
    min_bytes = sel.param("min_bytes") or ""
    if min_bytes in ("", "0") and _summary_for(run, sel) is not None:
        return []
    return list(sel.workers)


@view("collectives", params=("metric", "min_bytes"), reads=_collectives_reads)
def collectives_view(run: Run, sel: Selection) -> dict:
    """Heatmaps type x size bucket and rank x step coloured by `metric` (busbw, wait, overlap
    or count; `collectives.collective_heatmap`) and their long tables, instances, stragglers
    and mismatches, from one `collectives.analyze_collectives` pass, or from the run's
    derived index (`collectives_from_summary`)."""
    from tessera_tb.backend import collectives

    metric = sel.param("metric") or "busbw"
    if metric not in COLLECTIVE_METRICS:
        raise errors.InvalidArgumentError(f"metric must be one of {', '.join(COLLECTIVE_METRICS)}")
    min_bytes = parse_int(sel.param("min_bytes"), 0, 0, 2**62, "min_bytes")
    summary = _summary_for(run, sel, min_bytes)
    if summary is not None:
        return collectives_from_summary(run, summary, sel, metric)
    a = collectives.analyze_collectives(run, list(sel.workers), list(sel.steps), min_bytes)
    heat = {
        by: _heatmap_payload(
            _compute(lambda by=by: collectives.collective_heatmap(None, by, metric, analysis=a))
        )
        for by in ("type_size", "rank_step")
    }
    return {
        "metric": metric,
        "num_kernels": len(a.kernels),
        "heatmaps": heat,
        "tables": {
            "type_size": collectives.collective_type_size_table(a),
            "rank_step": collectives.collective_rank_step_table(a),
            "instances": a.instances,
            "stragglers": collectives.stragglers(None, analysis=a),
            "mismatches": a.mismatches,
        },
    }


def collectives_from_summary(run: Run, summary, sel: Selection, metric: str) -> dict:
    """The collectives view from the run's derived index, without reading a step file: the
    rank x step rows and the straggler counts of the selected workers and steps; instances
    and mismatches of the selected steps; the type x size table of the whole run. Instances
    are matched over every rank of the run (`index` in the answer says so)."""
    from tessera_tb.backend import collectives

    t = summary.tables
    rs = t["rank_step"]
    rs = rs[rs["worker"].isin(sel.workers) & rs["step"].isin(sel.steps)]
    rank_step = rs[rs["n_kernels"] > 0][
        ["worker", "rank", "step", "n_kernels", "collective_ns", "wait_ns", "transfer_ns"]
        + ["busbw_gbps", "overlap_pct"]
    ].sort_values(["worker", "rank", "step"], ignore_index=True)
    counts = rs[rs["n_instances"] > 0].assign(wait_ns=rs["wait_ns"].fillna(0).astype("int64"))
    whole = len(sel.workers) == len(run.workers) and set(sel.steps) == set(run.steps)
    strag = (
        t["stragglers"]
        if whole
        else collectives.stragglers_from_counts(
            counts[["worker", "rank", "n_instances", "n_straggler", "wait_ns", "others_wait_ns"]]
        )
    )
    instances = t["instances"][t["instances"]["step"].isin(sel.steps)].reset_index(drop=True)
    mismatches = t["mismatches"][t["mismatches"]["step"].isin(sel.steps)].reset_index(drop=True)
    heat = {
        "type_size": _heatmap_payload(
            _compute(lambda: collectives.heatmap_of_table(t["type_size"], "type_size", metric))
        ),
        "rank_step": _heatmap_payload(
            _compute(lambda: collectives.heatmap_of_table(rank_step, "rank_step", metric))
        ),
    }
    return {
        "metric": metric,
        "num_kernels": int(rs["n_kernels"].sum()),
        "heatmaps": heat,
        "index": {
            "workers": len(run.workers),
            "note": (
                f"from the run's derived index: instances matched over all {len(run.workers)} "
                "ranks; the type x size table covers the whole run"
            ),
        },
        "tables": {
            "type_size": t["type_size"],
            "rank_step": rank_step,
            "instances": instances,
            "stragglers": strag,
            "mismatches": mismatches,
        },
    }


# Memory (backend/memory.py) -----------------------------------------------------------------------


def _with_offsets(df: pd.DataFrame, origin_ns: int, columns: Iterable[str]) -> pd.DataFrame:
    """Add `<name>_from_origin_ns` (ns since `origin_ns`, exact in a browser) beside each
    epoch-ns column `<name>_ns`."""
    df = df.copy()
    for c in columns:
        if c in df.columns:
            df[c.removesuffix("_ns") + "_from_origin_ns"] = df[c] - origin_ns
    return df


def _memory_max_items(text: str | None) -> int:
    from tessera_tb.backend.memory import DEFAULT_MAX_POINTS

    n = int(text) if text else DEFAULT_MAX_POINTS
    if not 4 <= n <= 100_000:
        raise ValueError(f"max_items must be 4 to 100000, not {n}")
    return n


@view("memory", params=("max_items",))
def memory_view(run: Run, sel: Selection) -> dict:
    """Allocated/reserved curves per (worker, device) (`memory.memory_timeline`) with level
    of detail (`memory.curve_level_of_detail`: at most `max_items` rows, default the
    timeline's 5000; `curve_rows` and `resolution_ns` say what was merged), the peak with its
    op and stack (`memory.memory_peaks`) and the allocation table (`memory.allocation_table`,
    largest first). Epoch times also as offsets from the origin of the selected steps
    (`timeline_origin_ns`)."""
    from tessera_tb.backend import memory

    workers, steps = list(sel.workers), list(sel.steps)
    origin, end = timeline_origin_ns(run, steps)
    max_items = _compute(lambda: _memory_max_items(sel.param("max_items")))
    full = memory.memory_timeline(run, workers, steps)
    drawn, res = memory.curve_level_of_detail(full, origin, end, max_items)
    curves = _with_offsets(drawn, origin, ["ts_ns"])
    peaks = _with_offsets(memory.memory_peaks(run, workers, steps), origin, ["peak_ts_ns"])
    allocs = memory.allocation_table(run, workers, steps)
    allocs = _with_offsets(allocs, origin, ["alloc_ts_ns", "free_ts_ns"])
    allocs = allocs.sort_values("size_bytes", ascending=False, kind="stable")
    return {
        "origin_ns": str(origin),
        "extent_ns": end - origin,
        "curve_rows": len(full),
        "resolution_ns": res,
        "tables": {"curves": curves, "peaks": peaks, "allocations": allocs},
        "whole_tables": ["curves"],
    }


# Roofline (backend/roofline.py, devices.py) -------------------------------------------------------

MEASURED_SOURCES = ("measured", "partial", "measured:cupti_range")


@view("roofline", params=("group",))
def roofline_view(run: Run, sel: Selection) -> dict:
    """Roofline points per kernel or per op (`roofline.roofline`) and the roofs of each
    distinct device of the selected workers (`roofline.roofs` of `roofline.run_peaks`).
    `measured` tells a point's FLOPs come from counters (measured, partial, CUPTI range)
    rather than shapes."""
    from tessera_tb.backend import roofline

    group = sel.param("group") or "kernel"
    workers, steps = list(sel.workers), list(sel.steps)
    points = _compute(lambda: roofline.roofline(run, workers=workers, steps=steps, group_by=group))
    points["measured"] = points["flops_source"].isin(MEASURED_SOURCES)
    roofs, seen = [], set()
    for w in workers:
        peaks = _compute(lambda w=w: roofline.run_peaks(run, w))
        if peaks.key not in seen:
            seen.add(peaks.key)
            roofs.append(roofline.roofs(peaks).assign(note=peaks.note))
    return {
        "group": group,
        "tables": {"points": points, "roofs": pd.concat(roofs, ignore_index=True)},
        "whole_tables": ["roofs"],
    }


# Stalls (backend/stalls.py) -----------------------------------------------------------------------

STALL_GROUPS = ("kernel", "op", "step", "total")


@view("stalls", params=("group",))
def stalls_view(run: Run, sel: Selection) -> dict:
    """Warp stall breakdown (`stalls.stall_breakdown`) of the matched kernels, by reason, and
    the share of each category (memory, dependency, structural) per group: the sum of its
    reasons' share_pct. Without counters: what is missing and the command that collects it."""
    from tessera_tb.backend import stalls

    group = sel.param("group") or "kernel"
    if group not in STALL_GROUPS:
        raise errors.InvalidArgumentError(f"group must be one of {', '.join(STALL_GROUPS)}")
    b = _compute(
        lambda: stalls.stall_breakdown(
            run, workers=list(sel.workers), steps=list(sel.steps), group_by=group
        )
    )
    keys = {"kernel": ["kernel_name"], "op": ["op_name"], "step": ["worker", "step"]}.get(group, [])
    tables = {"reasons": b.table}
    if b.available:
        stalled = b.table[b.table["category"] != stalls.NOT_A_STALL]
        by = keys + ["category"]
        share = stalled.groupby(by, sort=False, dropna=False)["share_pct"].sum().reset_index()
        if keys:  # groups heaviest first, by their stall warp-cycles
            weight = stalled.groupby(keys, sort=False, dropna=False)["stall_warp_cycles"].sum()
            share = share.merge(
                weight.rename("group_stall_warp_cycles").reset_index(), on=keys, how="left"
            )
            share = share.sort_values("group_stall_warp_cycles", ascending=False, kind="stable")
        else:
            share["group_stall_warp_cycles"] = stalled["stall_warp_cycles"].sum()
        tables["categories"] = share.reset_index(drop=True)
    return {
        "group": group,
        "group_keys": keys,
        "available": b.available,
        "missing_counters": b.missing_counters,
        "collect_command": b.collect_command,
        "note": b.note,
        "category_reasons": {c: list(r) for c, r in stalls.CATEGORIES.items()},
        "tables": tables,
    }


# Compare (backend/compare.py) ---------------------------------------------------------------------


def _compare_side(index: RunIndex, args, run_key: str, prefix: str):
    """(entry, workers, steps) of one side of a comparison: `<prefix>workers` and
    `<prefix>steps` select them; steps default to the run's default range (`default_steps`)."""
    entry = resolve_run(index, args.get(run_key))
    run = entry.run
    workers = parse_workers(run, args.get(prefix + "workers"))
    first = next((w for w in workers if run.worker(w).steps), None)
    if first is None:
        raise errors.NotFoundError(f"run {entry.name!r} has no steps in this selection")
    spec = args.get(prefix + "steps") or default_steps(run, first)
    return entry, workers, parse_steps(run, workers, spec)


def compare_payload(index: RunIndex, args) -> dict:
    """Run B (`run`, selected by `workers`/`steps`) against the baseline A (`baseline`,
    selected by `baseline_workers`/`baseline_steps`): every table of
    `compare.compare_runs` (DataFrames), `slowdown_pct` (B's median step vs A's), and the
    step files of either side that could not be read (left out)."""
    from tessera_tb.backend import compare

    if not args.get("baseline"):
        raise errors.InvalidArgumentError("missing parameter: baseline")
    sides, errs = [], []
    for role, key, prefix in (("A", "baseline", "baseline_"), ("B", "run", "")):
        entry, workers, steps = _compare_side(index, args, key, prefix)
        run, bad = index.usable_run(entry, workers, steps)
        errs += [
            {"side": role, "run": entry.name, "worker": w, "step": s, "error": e}
            for (w, s), e in sorted(bad.items())
        ]
        readable = {s for w in workers for s in run.worker(w).steps}
        kept = [s for s in steps if s in readable]
        if not kept:
            raise errors.NotFoundError(f"run {entry.name!r}: no readable step in the selection")
        sides.append(compare.Side(run, workers, kept, label=entry.name))
    try:
        result = compare.compare_runs(sides[0], sides[1])
    except TraceFormatError as exc:
        raise errors.NotFoundError(f"compare cannot be shown: {exc.problem}") from None
    return {
        "baseline": sides[0].label,
        "run": sides[1].label,
        "slowdown_pct": result.slowdown_pct,
        "selection": {
            "baseline": {"workers": sides[0].workers, "steps": sides[0].steps},
            "run": {"workers": sides[1].workers, "steps": sides[1].steps},
        },
        "errors": errs,
        "tables": result.tables(),
    }


def compare_json(index: RunIndex, args) -> bytes:
    """`compare_payload` encoded as JSON, cached per both runs' signatures and parameters."""
    keys = ("run", "workers", "steps", "baseline", "baseline_workers", "baseline_steps")
    a = resolve_run(index, args.get("baseline")) if args.get("baseline") else None
    b = resolve_run(index, args.get("run"))
    key = (
        "compare",
        a.name if a else None,
        a.signature if a else None,
        b.name,
        b.signature,
        tuple(args.get(k, "") for k in keys),
    )
    return index.cached_result(key, lambda: _encoded(compare_payload(index, args)))
