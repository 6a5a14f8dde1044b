"""The C scanner's columns (`_kineto_scan.scan_events`) -> SpanColumns.

The same SpanColumns that `kineto_columns` builds from decoded RawEvent batches, with the
same rules (which phases are slices and flows, promoted id arguments, one typed column per
argument key, nulls kept as absent), but from flat arrays: per-event work is numpy, and
Python touches only distinct strings, distinct argument keys and the rare irregular value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from tessera_tb.importers.arrays import distinct
from tessera_tb.importers.background import Background
from tessera_tb.importers.kineto_columns import (
    _FLOW_PHASES,
    _PROMOTED,
    _SLICE_PHASES,
    CORRELATION_KEYS,
    SpanColumns,
    StringTable,
    Tracks,
    _AttrPart,
    _merge_parts,
    canonical_rows,
    check_finite,
    int_or_zero,
    intern_json,
    us_to_ns,
)
from tessera_tb.importers.kineto_decode import RawEvent
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.step import FLOW_PHASES

# Argument type codes of _kineto_scan.c.
T_NULL, T_FALSE, T_TRUE, T_INT, T_FLOAT, T_STR, T_RAW, T_BIGINT = range(8)
_ANY = msgspec.json.Decoder()
_JSON = msgspec.json.Encoder()


class _Ids:
    """Maps the scanner's per-file string ids onto the worker's StringTable ids, interning
    each distinct string once, when first needed."""

    def __init__(self, file_strings: list[str], strings: StringTable) -> None:
        self.file_strings = file_strings
        self.strings = strings
        self.lookup = np.full(len(file_strings), -1, dtype=np.int32)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        mapped = self.lookup[ids]
        new = mapped < 0
        if new.any():
            for i in distinct(ids[new]).tolist():
                self.lookup[i] = self.strings.intern(self.file_strings[i])
            mapped = self.lookup[ids]
        return mapped


@dataclass
class FileContext:
    """What a part of a trace file (one batch of its steps, `kineto_stream`) takes from the
    whole file, so its columns are those the whole file's would hold for its events: the
    file's tracks (in the file's order), its metadata events, and each argument key's type
    codes over the whole file (one bit per code, by the key's number in `arg_key_sid`)."""

    tracks: Tracks
    meta_events: list[RawEvent]
    key_bits: list[int]


def scanned_span_columns(
    scan: dict[str, Any],
    path: str,
    strings: StringTable,
    base_ns: int,
    context: FileContext | None = None,
) -> SpanColumns:
    """SpanColumns of the scanner's columns `scan` of trace file `path` (or of a part of it,
    with the whole file's `context`)."""
    text: list[str] = scan["strings"]

    def col(name: str, dtype) -> np.ndarray:
        return np.frombuffer(scan[name], dtype=dtype)

    ph = col("ph", np.int32)
    phase_count = np.bincount(ph, minlength=len(text))
    phase_ids = np.flatnonzero(phase_count).tolist()
    phase = {i: text[i] for i in phase_ids}
    slice_ids = [i for i in phase_ids if phase[i] in _SLICE_PHASES]
    flow_ids = [i for i in phase_ids if phase[i] in _FLOW_PHASES]
    skipped = {
        phase[i]: int(phase_count[i])
        for i in phase_ids
        if phase[i] not in _SLICE_PHASES and phase[i] not in _FLOW_PHASES and phase[i] != "M"
    }
    meta_ids = [i for i in phase_ids if phase[i] == "M"]

    ids = _Ids(text, strings)
    tracks = Tracks() if context is None else context.tracks
    pid, tid = col("pid", np.int32), col("tid", np.int32)
    cat, name = col("cat", np.int32), col("name", np.int32)
    ts_us, dur_us = col("ts", np.float64), col("dur", np.float64)

    # Each event's class by a lookup on its phase's string id: 1 slice, 2 flow point.
    phase_class = np.zeros(len(text), dtype=np.uint8)
    phase_class[slice_ids] = 1
    phase_class[flow_ids] = 2
    event_class = phase_class[ph]
    idx = np.flatnonzero(event_class == 1)
    n = idx.size
    correlation = np.zeros(n, dtype=np.int64)
    external_id = np.zeros(n, dtype=np.int64)
    key_bits = None if context is None else context.key_bits
    # The arguments are typed beside the event columns below (numpy releases the GIL), in a
    # second thread on a large file, from as soon as the slices are known. Only they intern
    # strings until they are done: the worker's string table gets the same order either way
    # (arguments, flows, names, cats).
    args_job = Background(_attr_parts, scan, idx, ids, text, correlation, external_id, key_bits)
    args_job.run_or_start(n)
    try:
        # Errors of the metadata and of the slices' times come before the arguments' (as
        # when these were checked before the arguments were read).
        if context is None:
            meta_rows = np.flatnonzero(ph == meta_ids[0]) if meta_ids else np.zeros(0, np.int64)
            meta_events = _meta_events(scan, meta_rows, text, pid, tid, name)
        else:
            meta_events = context.meta_events
        x_id = next((i for i in phase_ids if phase[i] == "X"), -1)
        is_x = ph[idx] == x_id
        ts = ts_us[idx]
        check_finite(path, ts, idx, "ts")
        dur = np.where(is_x, dur_us[idx], 0.0)
        check_finite(path, dur, idx, "dur")
        if (dur < 0).any():
            i = int(idx[np.flatnonzero(dur < 0)[0]])
            raise TraceFormatError(path, f"traceEvents[{i}] has a negative 'dur'")
    except BaseException:
        args_job.join()
        raise
    # The slices' times in ns, in a third thread while the tracks and flows are read here:
    # the two CPUs stay busy while the arguments are typed and after.
    times = Background(_slice_times, ts, dur, base_ns)
    times.run_or_start(n)
    try:
        # Tracks in order of first appearance: those of slices, then those only flows use.
        track_id = _track_ids(tracks, text, pid[idx], tid[idx])
        fidx = np.flatnonzero(event_class == 2)
        fts = ts_us[fidx]
        check_finite(path, fts, fidx, "ts")
        flow_id = col("id_val", np.int64)[fidx].copy()
        id_sid = col("id_sid", np.int32)[fidx]
        for j in np.flatnonzero(id_sid >= 0).tolist():
            flow_id[j] = int_or_zero(text[id_sid[j]])
        phase_code = np.zeros(len(text), dtype=np.uint8)
        for i in flow_ids:
            phase_code[i] = FLOW_PHASES[phase[i]]
        flow_track_id = _track_ids(tracks, text, pid[fidx], tid[fidx])
        flow_ts_ns = base_ns + us_to_ns(fts)
        index = idx.astype(np.int64)
    except BaseException:
        times.join()
        args_job.result()  # the arguments' error first, as when they were read first
        raise
    start_ns, dur_ns = times.result()
    attr_parts = args_job.result()
    # The rows' canonical order is sorted in a thread of its own from here, while the names,
    # categories and arguments are numbered below and the kinds read (span_of_columns).
    order_job = Background(canonical_rows, track_id, start_ns, dur_ns, external_id)
    order_job.run_or_start(n)
    try:
        flows = {
            "flow_id": flow_id,
            "cat_id": ids(cat[fidx]),
            "phase": phase_code[ph[fidx]],
            "track_id": flow_track_id,
            "ts_ns": flow_ts_ns,
            "row": np.full(fidx.size, -1, dtype=np.int32),
        }
        return SpanColumns(
            index=index,
            start_ns=start_ns,
            dur_ns=dur_ns,
            is_x=is_x,
            name_id=ids(name[idx]),
            cat_id=ids(cat[idx]),
            track_id=track_id,
            correlation=correlation,
            external_id=external_id,
            attrs=[_merge_parts(key, [part], strings) for key, part in sorted(attr_parts.items())],
            flows=flows,
            meta_events=meta_events,
            tracks=tracks,
            skipped_phases=skipped,
            order_job=order_job,
        )
    except BaseException:
        order_job.join()
        raise


def _slice_times(ts: np.ndarray, dur: np.ndarray, base_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """The slices' start (epoch ns) and duration (ns)."""
    return base_ns + us_to_ns(ts), us_to_ns(dur)


def _meta_events(scan, rows: np.ndarray, text: list[str], pid, tid, name) -> list[RawEvent]:
    """The metadata events (ph M: thread and process names, sort indices) as RawEvents,
    built from the columns: their arguments are rows of the argument table like any other."""
    if not rows.size:
        return []
    is_meta = np.zeros(scan["n"], dtype=bool)
    is_meta[rows] = True
    arg_ev = np.frombuffer(scan["arg_ev"], dtype=np.int32)
    sel = np.flatnonzero(is_meta[arg_ev])
    key_sid = np.frombuffer(scan["arg_key_sid"], dtype=np.int32)
    bounds = np.frombuffer(scan["arg_key_start"], dtype=np.int64)
    keys = key_sid[np.searchsorted(bounds, sel, side="right") - 1]
    values = _python_values(
        np.frombuffer(scan["arg_type"], dtype=np.uint8)[sel],
        np.frombuffer(scan["arg_val"], dtype=np.int64)[sel],
        text,
    )
    args: dict[int, dict[str, Any]] = {}
    for event, key, value in zip(arg_ev[sel].tolist(), keys.tolist(), values.tolist()):
        args.setdefault(event, {})[text[key]] = value
    return [
        RawEvent(ph="M", name=text[name[i]], pid=text[pid[i]], tid=text[tid[i]], args=args.get(i))
        for i in rows.tolist()
    ]


def _track_ids(tracks: Tracks, text: list[str], pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Track ids of (pid, tid) string-id pairs, new tracks in order of first appearance."""
    if pid.size == 0:
        return np.zeros(0, dtype=np.int32)
    pair = (pid.astype(np.int64) << 32) | tid.astype(np.int64)
    # The distinct pairs in order of first appearance. A thread's events come in runs, and
    # a pair first appears at the head of a run: the heads are sorted, not every event.
    heads = np.flatnonzero(pair[1:] != pair[:-1]) + 1
    heads = np.concatenate([np.zeros(1, dtype=heads.dtype), heads])
    uniq, first = np.unique(pair[heads], return_index=True)
    order = np.argsort(first)
    lookup = np.empty(uniq.size, dtype=np.int32)
    for i, p in zip(order.tolist(), uniq[order].tolist()):
        lookup[i] = tracks.id_of((text[p >> 32], text[p & 0xFFFFFFFF]))
    per_run = lookup[np.searchsorted(uniq, pair[heads])]
    return np.repeat(per_run, np.diff(heads, append=pair.size))


def _attr_parts(
    scan: dict[str, Any],
    idx: np.ndarray,
    ids: _Ids,
    text: list[str],
    correlation: np.ndarray,
    external_id: np.ndarray,
    key_bits: list[int] | None = None,
) -> dict[str, _AttrPart]:
    """One typed part per argument key of the slices; fills the promoted id columns. The
    type codes of each key are those of `scan` or, given, `key_bits` (the whole file's)."""
    row_of = np.full(scan["n"], -1, dtype=np.int32)
    row_of[idx] = np.arange(idx.size, dtype=np.int32)
    rows = row_of[np.frombuffer(scan["arg_ev"], dtype=np.int32)]
    types = np.frombuffer(scan["arg_type"], dtype=np.uint8)
    values = np.frombuffer(scan["arg_val"], dtype=np.int64)
    key_sid = np.frombuffer(scan["arg_key_sid"], dtype=np.int32).tolist()
    bounds_arr = np.frombuffer(scan["arg_key_start"], dtype=np.int64)
    bounds = bounds_arr.tolist()
    keep = (rows >= 0) & (types != T_NULL)  # args of slices only; a null is kept as absent
    # Per key, in one pass each: the type codes among its kept arguments (a bit each), and
    # whether it has any argument to drop.
    starts = bounds_arr[:-1][np.diff(bounds_arr) > 0]
    type_bits = np.where(keep, np.left_shift(np.uint8(1), types), np.uint8(0))  # codes < 8
    bits_of = dict.fromkeys(range(len(key_sid)), 0)
    drop_of = dict(bits_of)
    if starts.size:
        nonempty = np.flatnonzero(np.diff(bounds_arr) > 0).tolist()
        bits_of.update(zip(nonempty, np.bitwise_or.reduceat(type_bits, starts).tolist()))
        drop_of.update(zip(nonempty, (~np.logical_and.reduceat(keep, starts)).tolist()))
    canon = _canonical_json(types, values, keep, ids, text)
    parts: dict[str, _AttrPart] = {}
    for k, sid in enumerate(key_sid):
        bits = bits_of[k] if key_bits is None else key_bits[k]
        if not bits:
            continue  # no argument of a slice, or only nulls
        lo, hi = bounds[k], bounds[k + 1]
        r, t, v = rows[lo:hi], types[lo:hi], values[lo:hi]
        if drop_of[k]:
            sel = keep[lo:hi]
            r, t, v = r[sel], t[sel], v[sel]
        key = text[sid]
        present = {code for code in range(8) if bits >> code & 1}
        if key in _PROMOTED:
            target = correlation if key in CORRELATION_KEYS else external_id
            if present == {T_INT}:
                target[r] = v
            else:
                target[r] = [int_or_zero(x) for x in _python_values(t, v, text)]
            continue
        parts[key] = _typed_part(r, t, v, present, ids, text, canon)
    return parts


def _canonical_json(types, values, keep, ids: _Ids, text: list[str]) -> np.ndarray:
    """For each string id that is the text of a list or object argument, the worker's string
    id of its compact JSON (as msgspec encodes it: no spaces, numbers re-spelled), all in one
    decode; -1 elsewhere. Shapes and strides repeat a lot, so there are few distinct texts."""
    canon = np.full(len(text), -1, dtype=np.int32)
    raw = values[keep & (types == T_RAW)]
    if raw.size:
        distinct = np.flatnonzero(np.bincount(raw, minlength=len(text)))
        decoded = _ANY.decode("[" + ",".join([text[i] for i in distinct.tolist()]) + "]")
        texts = [_JSON.encode(value).decode() for value in decoded]
        canon[distinct] = ids.strings.intern_many(texts)
    return canon


def _typed_part(
    rows, t, v, present: set, ids: _Ids, text: list[str], canon: np.ndarray
) -> _AttrPart:
    """The column type rules of kineto_columns._typed_part, on type codes."""
    if present <= {T_FALSE, T_TRUE}:
        return _AttrPart(rows, "bool", (t == T_TRUE).astype(np.uint8))
    if present == {T_INT}:
        return _AttrPart(rows, "int64", v.copy())
    if T_FLOAT in present and present <= {T_INT, T_FLOAT, T_BIGINT}:
        out = v.view(np.float64).copy()
        ints = t == T_INT
        out[ints] = v[ints].astype(np.float64)
        for j in np.flatnonzero(t == T_BIGINT).tolist():
            out[j] = float(int(text[v[j]]))
        return _AttrPart(rows, "float64", out)
    if present == {T_STR}:
        return _AttrPart(rows, "string", ids(v.astype(np.int32)))
    if present == {T_RAW}:  # lists and objects (shapes, strides)
        return _AttrPart(rows, "json", canon[v])
    return _AttrPart(rows, "json", intern_json(ids.strings, _python_values(t, v, text)))


def _python_values(t: np.ndarray, v: np.ndarray, text: list[str]) -> np.ndarray:
    """The arguments as the Python values msgspec would decode (the rare mixed-type keys)."""
    floats = v.view(np.float64)
    out = np.empty(t.size, dtype=object)
    for j, (code, value) in enumerate(zip(t.tolist(), v.tolist())):
        if code == T_NULL:
            out[j] = None
        elif code == T_FALSE or code == T_TRUE:
            out[j] = code == T_TRUE
        elif code == T_INT:
            out[j] = value
        elif code == T_FLOAT:
            out[j] = float(floats[j])
        elif code == T_STR:
            out[j] = text[value]
        elif code == T_RAW:
            out[j] = _ANY.decode(text[value])
        else:
            out[j] = int(text[value])
    return out
