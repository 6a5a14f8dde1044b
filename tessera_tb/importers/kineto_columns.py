"""Decoded Kineto events -> numpy columns, one batch of events at a time.

Each batch (`RawTrace.iter_chunks`) is turned into columns and sparse typed attribute parts
and then dropped, so the Python objects of only one batch are alive at once. Arguments are
flattened with C-level iteration (every key and value of every `args` dict in one pass) and
grouped by key with a sort, not visited key by key per event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import msgspec
import numpy as np

from tessera_tb.importers.kineto_decode import RawEvent, RawTrace, gc_paused
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.step import FLOW_PHASES, Attr, canonical_order

# Arguments promoted to event columns rather than kept as attributes.
CORRELATION_KEYS = frozenset({"correlation"})
EXTERNAL_ID_KEYS = frozenset({"External id", "external id"})
_PROMOTED = CORRELATION_KEYS | EXTERNAL_ID_KEYS

_SLICE_PHASES = ("X", "i", "I")
_FLOW_PHASES = tuple(FLOW_PHASES)
_JSON = msgspec.json.Encoder()
_EMPTY: dict = {}


class StringTable:
    """Interns strings: the same text gets the same id within one worker's import."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {"": 0}
        self.strings: list[str] = [""]

    def intern(self, value: str) -> int:
        j = self.ids.get(value)
        if j is None:
            j = self.ids[value] = len(self.strings)
            self.strings.append(value)
        return j

    def intern_many(self, values) -> np.ndarray:
        """Ids of many strings: hashes them in C, interns each distinct one once."""
        if len(values) == 0:
            return np.zeros(0, dtype=np.int32)
        codes, uniques = factorize(values)
        lookup = np.fromiter((self.intern(u) for u in uniques), dtype=np.int32, count=len(uniques))
        return lookup[codes]


def factorize(values) -> tuple[np.ndarray, list]:
    """(codes, uniques) of hashable values in order of first appearance, like pd.factorize
    without its missing-value checks: one C-level pass to find the distinct values and one
    to look each value up."""
    seen = dict.fromkeys(values)
    for code, value in enumerate(seen):
        seen[value] = code
    codes = np.fromiter(map(seen.__getitem__, values), dtype=np.int64, count=len(values))
    return codes, list(seen)


def _object_array(values) -> np.ndarray:
    # np.array() would turn lists inside the values into extra dimensions.
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    return np.fromiter(values, dtype=object, count=len(values))


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """Microseconds (Kineto's float ts/dur, 3 decimals) -> integer ns without float rounding loss.

    Multiplying an absolute epoch-µs timestamp (~1.7e15) by 1000 would lose precision in
    float64; splitting off the whole microseconds keeps every nanosecond the JSON holds.
    """
    whole = np.floor(us)
    frac_ns = np.rint((us - whole) * 1000.0).astype(np.int64)
    return whole.astype(np.int64) * 1000 + frac_ns


def int_or_zero(v: Any) -> int:
    """An id argument as an int; 0 ("none", as in Kineto) for anything that is not one."""
    if isinstance(v, bool) or v is None:
        return 0
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return 0
    return int(v) if isinstance(v, float) and v.is_integer() else 0


class Tracks:
    """Maps (pid, tid) as the source spells them onto track ids; "25738" and 25738 are one."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], int] = {}
        self.keys: list[tuple[str, str]] = []

    def id_of(self, key: tuple[str, str]) -> int:
        """The track id of a (pid, tid) text pair, a new one if it is new."""
        j = self.by_key.get(key)
        if j is None:
            j = self.by_key[key] = len(self.keys)
            self.keys.append(key)
        return j

    def ids(self, pids: list, tids: list) -> np.ndarray:
        if not pids:
            return np.zeros(0, dtype=np.int32)
        codes, uniques = factorize(list(zip(pids, tids)))
        lookup = np.fromiter(
            (self.id_of((str(p), str(t))) for p, t in uniques), dtype=np.int32, count=len(uniques)
        )
        return lookup[codes]


@dataclass
class _AttrPart:
    rows: np.ndarray
    type: str  # int64 / float64 / bool / string / json
    values: np.ndarray


@dataclass
class SpanColumns:
    """Every slice (ph X/i) and flow point of one trace file, as columns."""

    index: np.ndarray  # position of each slice in traceEvents (for error messages)
    start_ns: np.ndarray
    dur_ns: np.ndarray
    is_x: np.ndarray
    name_id: np.ndarray
    cat_id: np.ndarray
    track_id: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    attrs: list[Attr]
    flows: dict[str, np.ndarray]
    meta_events: list[RawEvent]
    tracks: Tracks
    skipped_phases: dict[str, int] = field(default_factory=dict)
    # The rows in the file's canonical order (step.canonical_order), being sorted in a
    # thread (a Background) while the rest is built; None: span_of_columns sorts them.
    order_job: Any = None

    @property
    def count(self) -> int:
        return int(self.start_ns.size)


def canonical_rows(track_id, start_ns, dur_ns, external_id) -> np.ndarray:
    """A span's rows in the file's canonical order (step.canonical_order: by track, start,
    longer first, lower External id)."""
    return canonical_order(
        {"track_id": track_id, "start_ns": start_ns, "dur_ns": dur_ns, "external_id": external_id}
    )


class _Accumulator:
    def __init__(self, path: str, strings: StringTable, base_ns: int) -> None:
        self.path = path
        self.strings = strings
        self.base_ns = base_ns
        self.tracks = Tracks()
        self.cols: dict[str, list[np.ndarray]] = {}
        self.flow_cols: dict[str, list[np.ndarray]] = {}
        self.attr_parts: dict[str, list[_AttrPart]] = {}
        self.meta_events: list[RawEvent] = []
        self.skipped: dict[str, int] = {}
        self.n_slices = 0

    def _put(self, target: dict, **arrays: np.ndarray) -> None:
        for k, v in arrays.items():
            target.setdefault(k, []).append(v)

    def add(self, offset: int, events: list[RawEvent]) -> None:
        ph = [e.ph for e in events]
        codes, phases = factorize(ph)
        slice_codes = [i for i, p in enumerate(phases) if p in _SLICE_PHASES]
        flow_codes = [i for i, p in enumerate(phases) if p in _FLOW_PHASES]
        for i, p in enumerate(phases):
            if p not in _SLICE_PHASES and p not in _FLOW_PHASES and p != "M":
                self.skipped[p] = self.skipped.get(p, 0) + int((codes == i).sum())
        meta_code = next((i for i, p in enumerate(phases) if p == "M"), None)
        if meta_code is not None:
            self.meta_events.extend(events[i] for i in np.flatnonzero(codes == meta_code))
        self._add_slices(offset, events, np.flatnonzero(np.isin(codes, slice_codes)), codes, phases)
        self._add_flows(offset, events, np.flatnonzero(np.isin(codes, flow_codes)))

    def _add_slices(self, offset, events, idx, codes, phases) -> None:
        evs = [events[i] for i in idx.tolist()]
        n = len(evs)
        if not n:
            return
        x_code = next((i for i, p in enumerate(phases) if p == "X"), -1)
        is_x = codes[idx] == x_code
        ts = np.array([e.ts for e in evs], dtype=np.float64)
        check_finite(self.path, ts, idx + offset, "ts")
        dur = np.array([e.dur for e in evs], dtype=np.float64)
        dur[~is_x] = 0.0
        check_finite(self.path, dur, idx + offset, "dur")
        if (dur < 0).any():
            i = int(idx[np.flatnonzero(dur < 0)[0]]) + offset
            raise TraceFormatError(self.path, f"traceEvents[{i}] has a negative 'dur'")
        rows = np.arange(self.n_slices, self.n_slices + n, dtype=np.int32)
        correlation = np.zeros(n, dtype=np.int64)
        external_id = np.zeros(n, dtype=np.int64)
        self._add_args([e.args for e in evs], rows, correlation, external_id)
        self._put(
            self.cols,
            index=idx.astype(np.int64) + offset,
            start_ns=self.base_ns + us_to_ns(ts),
            dur_ns=us_to_ns(dur),
            is_x=is_x,
            name_id=self.strings.intern_many([e.name for e in evs]),
            cat_id=self.strings.intern_many([e.cat for e in evs]),
            track_id=self.tracks.ids([e.pid for e in evs], [e.tid for e in evs]),
            correlation=correlation,
            external_id=external_id,
        )
        self.n_slices += n

    def _add_args(self, args_list, rows, correlation, external_id) -> None:
        dicts = [a or _EMPTY for a in args_list]
        lens = np.fromiter(map(len, dicts), dtype=np.int64, count=len(dicts))
        if not lens.any():
            return
        keys = list(chain.from_iterable(dicts))
        values = _object_array(list(chain.from_iterable(map(dict.values, dicts))))
        arg_rows = np.repeat(rows, lens)
        key_codes, key_names = factorize(keys)
        order = np.argsort(key_codes.astype(np.int32), kind="stable")
        bounds = np.searchsorted(key_codes[order], np.arange(len(key_names) + 1))
        for k, key in enumerate(key_names):
            sel = order[bounds[k] : bounds[k + 1]]
            r, v = arg_rows[sel], values[sel]
            types = set(map(type, v))
            if type(None) in types:  # a null argument is kept as absent
                keep = np.not_equal(v, None)
                r, v = r[keep], v[keep]
                types.discard(type(None))
                if not v.size:
                    continue
            if key in _PROMOTED:
                target = correlation if key in CORRELATION_KEYS else external_id
                local = r - rows[0]
                if types == {int}:
                    target[local] = v.astype(np.int64)
                else:
                    target[local] = [int_or_zero(x) for x in v]
                continue
            self.attr_parts.setdefault(key, []).append(self._typed_part(r, v, types))

    def _typed_part(self, rows: np.ndarray, v: np.ndarray, types: set) -> _AttrPart:
        if types == {bool}:
            return _AttrPart(rows, "bool", v.astype(np.uint8))
        if types == {int}:
            try:
                return _AttrPart(rows, "int64", v.astype(np.int64))
            except OverflowError:
                pass  # beyond int64: kept exactly as JSON text
        elif types <= {int, float}:
            return _AttrPart(rows, "float64", v.astype(np.float64))
        if types == {str}:
            return _AttrPart(rows, "string", self.strings.intern_many(v))
        return _AttrPart(rows, "json", intern_json(self.strings, v))

    def _add_flows(self, offset, events, idx) -> None:
        pts = [events[i] for i in idx.tolist()]
        if not pts:
            return
        ts = np.array([p.ts for p in pts], dtype=np.float64)
        check_finite(self.path, ts, idx + offset, "ts")
        self._put(
            self.flow_cols,
            flow_id=np.fromiter((int_or_zero(p.id) for p in pts), np.int64, count=len(pts)),
            cat_id=self.strings.intern_many([p.cat for p in pts]),
            phase=np.fromiter((FLOW_PHASES[p.ph] for p in pts), np.uint8, count=len(pts)),
            track_id=self.tracks.ids([p.pid for p in pts], [p.tid for p in pts]),
            ts_ns=self.base_ns + us_to_ns(ts),
        )

    def finish(self) -> SpanColumns:
        dtypes = {
            "index": np.int64,
            "start_ns": np.int64,
            "dur_ns": np.int64,
            "is_x": bool,
            "name_id": np.int32,
            "cat_id": np.int32,
            "track_id": np.int32,
            "correlation": np.int64,
            "external_id": np.int64,
        }
        cols = {
            k: np.concatenate(self.cols[k]) if k in self.cols else np.zeros(0, dt)
            for k, dt in dtypes.items()
        }
        flow_dtypes = {
            "flow_id": np.int64,
            "cat_id": np.int32,
            "phase": np.uint8,
            "track_id": np.int32,
            "ts_ns": np.int64,
        }
        flows = {
            k: np.concatenate(self.flow_cols[k]) if k in self.flow_cols else np.zeros(0, dt)
            for k, dt in flow_dtypes.items()
        }
        flows["row"] = np.full(flows["flow_id"].size, -1, dtype=np.int32)
        attrs = [
            _merge_parts(key, parts, self.strings) for key, parts in sorted(self.attr_parts.items())
        ]
        return SpanColumns(
            attrs=attrs,
            flows=flows,
            meta_events=self.meta_events,
            tracks=self.tracks,
            skipped_phases=self.skipped,
            **cols,
        )


def _merge_parts(key: str, parts: list[_AttrPart], strings: StringTable) -> Attr:
    """One attribute column from its per-batch parts; a key whose values differ in type
    across parts (AMD's "stream": "0x0" on runtime calls, 0 on kernels) becomes JSON."""
    if len(parts) == 1:
        return Attr(key, parts[0].type, parts[0].rows, parts[0].values)
    rows = np.concatenate([p.rows for p in parts])
    types = {p.type for p in parts}
    if len(types) == 1:
        kind = types.pop()
        return Attr(key, kind, rows, np.concatenate([p.values for p in parts]))
    if types == {"int64", "float64"}:
        return Attr(
            key, "float64", rows, np.concatenate([p.values.astype(np.float64) for p in parts])
        )
    texts: list[str] = []
    for p in parts:
        if p.type in ("string", "json"):
            strs = [strings.strings[i] for i in p.values.tolist()]
            texts.extend(strs if p.type == "json" else map(_json_text, strs))
        elif p.type == "bool":
            texts.extend("true" if b else "false" for b in p.values.tolist())
        else:
            texts.extend(map(_json_text, p.values.tolist()))
    return Attr(key, "json", rows, strings.intern_many(texts))


def check_finite(path: str, values: np.ndarray, index: np.ndarray, name: str) -> None:
    """A TraceFormatError naming the first event whose `name` (ts, dur) is missing or not a
    finite number."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise TraceFormatError(
            path,
            f"traceEvents[{int(index[bad[0]])}] has no numeric {name!r} ({bad.size} such events)",
        )


def intern_json(strings: StringTable, values) -> np.ndarray:
    """Ids of the compact JSON texts of values (lists, mixed types): encoded in C, hashed
    as bytes, and decoded to str once per distinct text (shapes repeat a lot)."""
    codes, uniques = factorize(list(map(_JSON.encode, values)))
    lookup = np.fromiter(
        (strings.intern(u.decode()) for u in uniques), dtype=np.int32, count=len(uniques)
    )
    return lookup[codes]


def _json_text(value: Any) -> str:
    return _JSON.encode(value).decode()


def span_columns(trace: RawTrace, strings: StringTable, base_ns: int) -> SpanColumns:
    """Every slice and flow point of a trace as columns, from RawEvent batches (the
    pure-Python path; kineto_scanned reads the C scanner's columns)."""
    acc = _Accumulator(trace.path, strings, base_ns)
    with gc_paused():
        for offset, events in trace.iter_chunks():
            acc.add(offset, events)
            del events
        return acc.finish()
