"""A large trace file read in bounded memory: its steps built a few at a time.

The whole-file import (`kineto_span.stream_span`) holds every event's columns while it builds
the steps, about the size of the JSON text. Here the file is read three times over, and
only batches of events and a few small per-file tables are ever held:

1. The C scanner reads the text in pieces (`iter_text`) and hands over its columns every
   BATCH_EVENTS events (`Scanner.take`). Each batch is spilled to a scratch directory as it
   comes, after noting what the steps need from the whole file: the step markers, the
   runtime calls' correlation ids, the tracks in order of first appearance, each argument
   key's type codes, the strings each part of the import interns (in the order the whole
   file would intern them, so every step's string table comes out the same), the metadata
   events. The events are checked here, so errors name the file's first bad event.
2. Steps are decided on those tables, as the whole file would decide them; each spilled
   batch then gets the step of each event, and the events are regrouped by runs of
   consecutive steps ("parts") of at most `part_events` events.
3. Each part is built with the whole-file code (`kineto_scanned.scanned_span_columns`,
   `kineto_span.span_of_columns`) under the file's context (FileContext, StepPlan) and its
   steps handed out one at a time.

The steps equal the whole-file import's, byte for byte, with one documented exception: a
flow point binds to an enclosing slice of its own part, so a point whose enclosing slice
lies in another part (a slice that started in an earlier run of steps, or an ancestor found
by walking up the host tree across parts) is kept unbound in its own step. On the shared
traces that never happens (tests compare both imports file for file).

Without the C scanner, `_PureReader` makes the first pass's batches from the text in pieces
(msgspec decodes them), holding one piece and one batch: the pure-Python path is bounded too.

A step larger than memory allows (its events' estimated footprint, STEP_BYTES_PER_EVENT per
event, over what the machine has free) stops the import with StepTooLarge, which names the
step and its size, before anything of it is built.
"""

from __future__ import annotations

import itertools
import os
import queue
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import numpy as np

from tessera_tb.importers import kineto_decode
from tessera_tb.importers.arrays import distinct
from tessera_tb.importers.background import Background, two_cpus
from tessera_tb.importers.kineto_columns import (
    _FLOW_PHASES,
    _PROMOTED,
    _SLICE_PHASES,
    CORRELATION_KEYS,
    StringTable,
    Tracks,
    check_finite,
    int_or_zero,
    intern_json,
    us_to_ns,
)
from tessera_tb.importers.kineto_decode import RawEvent
from tessera_tb.importers.kineto_scanned import (
    T_BIGINT,
    T_FALSE,
    T_FLOAT,
    T_INT,
    T_NULL,
    T_RAW,
    T_STR,
    T_TRUE,
    FileContext,
    _python_values,
    scanned_span_columns,
)
from tessera_tb.importers.kineto_span import (
    _CAT_KIND,
    _IS_DEVICE_TRACK,
    _STEP_CATS,
    _STEP_NAME,
    SpanStream,
    StepPlan,
    span_of_columns,
    track_infos_from,
)
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.step import IS_DEVICE_WORK, IS_LAUNCH, KIND, StepData

T = TypeVar("T")

# Events per batch of the first pass (about 20 MB of scanner columns).
BATCH_EVENTS = 1 << 17
# Events per part of the third pass (about 50 MB while its steps are built; two parts are
# held, one built while the other's steps are written). Parts of 262,144 events were no
# faster and peaked at 259 MB on the 5.85 GB copy, against 193 MB.
PART_EVENTS = 1 << 17
# A progress line per this much JSON read.
PROGRESS_BYTES = 1 << 30
# Peak bytes per event while a step is built (measured: ~310 on the shared traces' copies).
STEP_BYTES_PER_EVENT = 400
_ANY = msgspec.json.Decoder()
_EVENT_COLUMNS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id_val", "id_sid")
_COLUMN_TYPES = {
    "ph": np.int32,
    "cat": np.int32,
    "name": np.int32,
    "pid": np.int32,
    "tid": np.int32,
    "ts": np.float64,
    "dur": np.float64,
    "id_val": np.int64,
    "id_sid": np.int32,
    "arg_ev": np.int32,
    "arg_key": np.int32,
    "arg_type": np.uint8,
    "arg_val": np.int64,
}


class _Deleter:
    """Scratch files removed in a thread of its own. Removing a file that was written back
    to disk waits some 20 ms for the file system on ext4 (1 ms of CPU): done in the passes,
    it held them up (5.5 s of the 5.85 GB copy's 22 s second pass, in one thread)."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def remove(self, path: str) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tessera-scratch", daemon=True
                )
                self._thread.start()
        self._queue.put(path)

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                os.unlink(path)
            except OSError:  # gone already; what is left goes with the directory
                pass

    def finish(self) -> None:
        """Wait until every file given is removed."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()


class StepTooLarge(TraceFormatError):
    """One step holds more events than memory allows building at once."""


class StreamUnsupported(Exception):
    """The C scanner declines the file (or is not built): the whole-file reader takes it."""


# Files whose JSON text is larger than this are read by this module (`import_traces`);
# TESSERA_IMPORT_STREAM=always|never overrides.
STREAM_ABOVE_BYTES = 256 << 20


def text_bytes_estimate(path: str) -> int:
    """The JSON text's size: a plain file's size, or a gzip file's trailer (ISIZE, the
    size mod 4 GiB; a trailer smaller than the file itself means past 4 GiB)."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(-4, os.SEEK_END)
            isize = int.from_bytes(f.read(4), "little")
    except OSError:
        return size
    # The trailer wraps past 4 GiB; deflate packs at most ~1032 bytes into one, so a file
    # under 4 MiB cannot hold that much, and a smaller trailer there is incompressible text.
    return isize if isize >= size or size < 4 << 20 else isize + (1 << 32)


# Peak memory of the whole-file reader per byte of JSON (measured: ~1.1).
WHOLE_BYTES_PER_TEXT_BYTE = 1.5


def should_stream(path: str) -> bool:
    """Whether `import_traces` reads `path` with this module (bounded memory): above
    STREAM_ABOVE_BYTES of JSON, or where the whole-file reader would not fit in the free
    memory."""
    mode = os.environ.get("TESSERA_IMPORT_STREAM", "auto").lower()
    if mode in ("never", "0", "off"):
        return False
    if mode in ("always", "1", "on"):
        return True
    text = text_bytes_estimate(path)
    return text > STREAM_ABOVE_BYTES or text * WHOLE_BYTES_PER_TEXT_BYTE > available_memory_bytes()


def available_memory_bytes() -> int:
    """Memory this process may still take: the smaller of the machine's available memory and
    what its cgroup allows beyond its current use."""
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            room = int(limit) - used
            free = room if free is None else min(free, room)
        break
    return free if free is not None else 1 << 62


@dataclass
class _Spilled:
    """Arrays written back to back into one scratch file, and where each one is."""

    path: str
    index: dict[str, tuple[np.dtype, int, int]]  # name -> (dtype, offset, count)


def _spill(path: str, arrays: dict[str, np.ndarray]) -> _Spilled:
    index = {}
    offset = 0
    with open(path, "wb") as f:
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            f.write(memoryview(arr).cast("B"))
            index[name] = (arr.dtype, offset, arr.size)
            offset += arr.nbytes
    return _Spilled(path, index)


def _unspill(sp: _Spilled, names=None) -> dict[str, np.ndarray]:
    out = {}
    with open(sp.path, "rb") as f:
        for name in names or sp.index:
            dtype, offset, count = sp.index[name]
            f.seek(offset)
            out[name] = np.fromfile(f, dtype=dtype, count=count)
    return out


@dataclass
class _Batch:
    """One spilled batch: where its columns are, and its event range."""

    cols: _Spilled
    first: int
    n: int
    step: _Spilled | None = None


@dataclass
class _StringUse:
    """Which of the file's strings each step of the whole-file interning touches."""

    raw: list[np.ndarray] = field(default_factory=list)  # T_RAW argument values (string ids)
    by_key: list[np.ndarray] = field(default_factory=list)  # key << 32 | string id (T_STR)
    flow_cats: list[np.ndarray] = field(default_factory=list)
    names: list[np.ndarray] = field(default_factory=list)
    cats: list[np.ndarray] = field(default_factory=list)


class _FirstPass:
    """The whole-file tables, gathered batch by batch."""

    def __init__(self, path: str, spill_dir: str) -> None:
        self.path = path
        self.spill_dir = spill_dir
        self.text: list[str] = []
        self.key_sids = np.zeros(0, dtype=np.int32)
        self.key_bits: list[int] = []
        self.phase_class = np.zeros(0, dtype=np.uint8)  # per string id: 1 slice, 2 flow, 3 M
        self.cat_kind = np.zeros(0, dtype=np.uint8)
        self.is_memory_name = np.zeros(0, dtype=bool)
        self.is_step_cat = np.zeros(0, dtype=bool)
        self.step_number: dict[int, int] = {}  # name string id -> N of ProfilerStep#N
        self.is_x = np.zeros(0, dtype=bool)
        self.batches: list[_Batch] = []
        self.uses = _StringUse()
        self.slice_tracks: dict[int, None] = {}  # pid << 32 | tid string ids, first seen first
        self.flow_tracks: dict[int, None] = {}
        self.has_device: dict[int, bool] = {}
        self.has_host: dict[int, bool] = {}
        self.first_device: dict[int, tuple[int, int, int, int, int]] = {}  # pair -> arg codes
        self.meta_events: list[RawEvent] = []
        self.skipped: dict[str, int] = {}
        self.markers: list[tuple[int, int, float, float]] = []  # (N, row, ts, dur)
        self._launch: dict[str, np.ndarray] = {}
        self.slices = 0
        self.first_categories: set[str] = set()
        self.min_start_ns: int | None = None
        self.max_end_ns: int | None = None

    # ------------------------------------------------------------------ string lookups

    def _grow(self, new: list[str]) -> None:
        start = len(self.text)
        self.text.extend(new)
        n = len(self.text)

        def grown(arr, dtype):
            out = np.zeros(n, dtype=dtype)
            out[: arr.size] = arr
            return out

        self.phase_class = grown(self.phase_class, np.uint8)
        self.cat_kind = grown(self.cat_kind, np.uint8)
        self.is_memory_name = grown(self.is_memory_name, bool)
        self.is_step_cat = grown(self.is_step_cat, bool)
        self.is_x = grown(self.is_x, bool)
        for i in range(start, n):
            t = self.text[i]
            if t in _SLICE_PHASES:
                self.phase_class[i] = 1
            elif t in _FLOW_PHASES:
                self.phase_class[i] = 2
            elif t == "M":
                self.phase_class[i] = 3
            self.cat_kind[i] = KIND[_CAT_KIND.get(t.lower(), "other")]
            self.is_memory_name[i] = t == "[memory]"
            self.is_x[i] = t == "X"
            self.is_step_cat[i] = t.lower() in _STEP_CATS
            m = _STEP_NAME.match(t)
            if m:
                self.step_number[i] = int(m.group(1))

    # ------------------------------------------------------------------ one batch

    def add(self, batch: dict[str, Any]) -> None:
        self._grow(batch["strings"])
        self.key_sids = np.frombuffer(batch["arg_key_sid"], dtype=np.int32).copy()
        self.key_bits.extend([0] * (self.key_sids.size - len(self.key_bits)))
        first, n = int(batch["first"]), int(batch["n"])
        if n == 0:
            return
        cols = {k: np.frombuffer(batch[k], dtype=_COLUMN_TYPES[k]) for k in _COLUMN_TYPES}
        self._note(cols, first, n)
        path = os.path.join(self.spill_dir, f"batch_{len(self.batches):06d}")
        self.batches.append(_Batch(_spill(path, {**cols, **self._launch}), first, n))

    def _note(self, c: dict[str, np.ndarray], first: int, n: int) -> None:
        path, text = self.path, self.text
        if first < 5000:
            self.first_categories.update(text[i] for i in distinct(c["cat"][: 5000 - first]))
        ph_class = self.phase_class[c["ph"]]
        rows = np.arange(first, first + n, dtype=np.int64)
        sl = np.flatnonzero(ph_class == 1)
        fl = np.flatnonzero(ph_class == 2)
        # Checks, in file order, as the whole-file columns make them.
        is_x = self.is_x[c["ph"]]
        ts = c["ts"][sl]
        check_finite(path, ts, rows[sl], "ts")
        dur = np.where(is_x[sl], c["dur"][sl], 0.0)
        check_finite(path, dur, rows[sl], "dur")
        if (dur < 0).any():
            i = int(rows[sl][np.flatnonzero(dur < 0)[0]])
            raise TraceFormatError(path, f"traceEvents[{i}] has a negative 'dur'")
        check_finite(path, c["ts"][fl], rows[fl], "ts")
        other = np.flatnonzero(ph_class == 0)
        if other.size:
            for sid, count in zip(*np.unique(c["ph"][other], return_counts=True)):
                self.skipped[text[sid]] = self.skipped.get(text[sid], 0) + int(count)

        # Arguments of slices (what the whole file's columns keep).
        ev_local = c["arg_ev"].astype(np.int64) - first
        a_type, a_key, a_val = c["arg_type"], c["arg_key"], c["arg_val"]
        keep = (ph_class[ev_local] == 1) if ev_local.size else np.zeros(0, bool)
        keep &= a_type != T_NULL
        if keep.any():
            code = distinct(a_key[keep].astype(np.int64) * 8 + a_type[keep])
            for k, t in zip((code // 8).tolist(), (code % 8).tolist()):
                self.key_bits[k] |= 1 << t
            raw = keep & (a_type == T_RAW)
            if raw.any():
                self.uses.raw.append(distinct(a_val[raw]))
            st = keep & (a_type == T_STR)
            if st.any():
                self.uses.by_key.append(distinct((a_key[st].astype(np.int64) << 32) | a_val[st]))

        # Kinds of the slices, as far as launches and tracks need them.
        kind = self.cat_kind[c["cat"][sl]].copy()
        x = is_x[sl]
        kind[self.is_memory_name[c["name"][sl]] & ~x] = KIND["memory"]
        kind[(~x) & (kind == KIND["other"])] = KIND["mark"]
        marker = x & self.is_step_cat[c["cat"][sl]]
        for j in np.flatnonzero(marker).tolist():
            num = self.step_number.get(int(c["name"][sl[j]]))
            if num is not None:
                self.markers.append((num, int(rows[sl[j]]), float(ts[j]), float(dur[j])))
                kind[j] = KIND["annotation"]
        corr = _promoted(c, ev_local, keep, sl, n, text, self.key_sids, CORRELATION_KEYS)
        launch = IS_LAUNCH[kind] & (corr != 0)
        # Launch calls are spilled with the batch (they are a fifth of a trace's events).
        self._launch = {"launch_corr": corr[launch], "launch_ts": ts[launch]}
        self.uses.names.append(distinct(c["name"][sl]))
        self.uses.cats.append(distinct(c["cat"][sl]))
        self.uses.flow_cats.append(distinct(c["cat"][fl]))
        self.slices += int(sl.size)
        if sl.size:
            start = us_to_ns(ts)
            end = start + us_to_ns(dur)
            lo, hi = int(start.min()), int(end.max())
            self.min_start_ns = lo if self.min_start_ns is None else min(self.min_start_ns, lo)
            self.max_end_ns = hi if self.max_end_ns is None else max(self.max_end_ns, hi)

        # Tracks, in order of first appearance; what kind of events each holds.
        pair = (c["pid"].astype(np.int64) << 32) | c["tid"].astype(np.int64)
        for p in dict.fromkeys(pair[sl].tolist()):
            self.slice_tracks.setdefault(p, None)
        for p in dict.fromkeys(pair[fl].tolist()):
            self.flow_tracks.setdefault(p, None)
        device_like = _IS_DEVICE_TRACK[kind]
        host_like = ~device_like & (kind != KIND["trace_span"]) & (kind != KIND["other"])
        for p in distinct(pair[sl][host_like]).tolist():
            self.has_host[p] = True
        dev_rows = sl[device_like]
        if dev_rows.size:
            dev_pairs = pair[dev_rows]
            uniq, at = np.unique(dev_pairs, return_index=True)
            for p, j in zip(uniq.tolist(), at.tolist()):
                self.has_device[p] = True
                if p not in self.first_device:
                    self.first_device[p] = self._device_args(c, ev_local, int(dev_rows[j]))

        # Metadata events (thread names and sort order), with all their arguments.
        meta = np.flatnonzero(ph_class == 3)
        if meta.size:
            is_meta = np.zeros(n, dtype=bool)
            is_meta[meta] = True
            sel = np.flatnonzero(is_meta[ev_local]) if ev_local.size else np.zeros(0, np.int64)
            values = _python_values(a_type[sel], a_val[sel], text)
            args: dict[int, dict[str, Any]] = {}
            for e, k, v in zip(ev_local[sel].tolist(), a_key[sel].tolist(), values.tolist()):
                args.setdefault(e, {})[text[self.key_sids[k]]] = v
            for i in meta.tolist():
                self.meta_events.append(
                    RawEvent(
                        ph="M",
                        name=text[c["name"][i]],
                        pid=text[c["pid"][i]],
                        tid=text[c["tid"][i]],
                        args=args.get(i),
                    )
                )

    def _device_args(self, c, ev_local: np.ndarray, row: int) -> tuple:
        """(device key, type, value, stream key, type, value)-ish codes of a device event's
        `device` and `stream` arguments: (key number, type, value) each, -1 when absent."""
        out = []
        for wanted in ("device", "stream"):
            got = (-1, T_NULL, 0)
            for j in np.flatnonzero(ev_local == row).tolist():
                k = int(c["arg_key"][j])
                if self.text[self.key_sids[k]] == wanted and c["arg_type"][j] != T_NULL:
                    got = (k, int(c["arg_type"][j]), int(c["arg_val"][j]))
            out.append(got)
        return tuple(out)


def _promoted(c, ev_local, keep, sl, n, text, key_sids, keys) -> np.ndarray:
    """A promoted id argument (correlation) of each slice of a batch, as the whole-file
    columns make it: kept arguments of the keys `keys`, later keys' values winning."""
    out_all = np.zeros(n, dtype=np.int64)
    key_num = [k for k in range(key_sids.size) if text[key_sids[k]] in keys]
    for k in key_num:
        sel = np.flatnonzero(keep & (c["arg_key"] == k))
        if not sel.size:
            continue
        t, v = c["arg_type"][sel], c["arg_val"][sel]
        if (t == T_INT).all():
            out_all[ev_local[sel]] = v
        else:
            out_all[ev_local[sel]] = [int_or_zero(x) for x in _python_values(t, v, text)]
    return out_all[sl]


@dataclass
class _Plan:
    """Steps of the whole file."""

    numbers: np.ndarray
    host_start: np.ndarray
    span_start: np.ndarray
    span_end: np.ndarray
    launch_corr: np.ndarray  # sorted, distinct
    launch_step: np.ndarray


class StreamedFile:
    """One trace file read in bounded memory; `steps()` hands out its steps one at a time.

    `meta` (the top-level members), `json_bytes`, `event_count`, `warnings` and `tracks` are
    known once the object is made; the scratch directory is removed when `steps()` ends or
    the object is closed."""

    def __init__(
        self,
        path: str,
        strings: StringTable,
        span_index: int,
        scratch_parent: str,
        part_events: int | None = None,
        batch_events: int | None = None,
        memory_bytes: int | None = None,
        progress=None,
    ) -> None:
        part_events = PART_EVENTS if part_events is None else part_events
        batch_events = BATCH_EVENTS if batch_events is None else batch_events
        from tessera_tb.trace import run_placement

        self.path = path
        self.strings = strings
        self.span_index = span_index
        self.part_events = max(1, part_events)
        self.memory_bytes = memory_bytes
        self._progress = progress or (lambda _msg: None)
        self._next_report = PROGRESS_BYTES
        self.warnings: list[str] = []
        self.spill_dir = run_placement.make_staging_dir(scratch_parent, "spill")
        self._deleter = _Deleter()
        try:
            self._first = _FirstPass(path, self.spill_dir)
            self.meta, self.json_bytes = self._read(batch_events)
            self._progress(
                f"{os.path.basename(path)}: {self.json_bytes / 1e6:,.0f} MB of JSON read, "
                f"{sum(b.n for b in self._first.batches):,} events spilled; grouping them by step"
            )
            self.base_ns = int(self.meta.get("baseTimeNanoseconds") or 0)
            self._intern()
            self._tracks()
            self._plan = self._decide_steps()
            self.parts = self._assign()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ pass 1

    def _read(self, batch_events: int) -> tuple[dict[str, Any], int]:
        if not kineto_decode.scanner_available():
            reader = self.pure_reader = _PureReader(self.path)
            for batch in reader.batches(PURE_BATCH_EVENTS):
                self._first.add(batch)
                self._report(reader.size)
            return self._finish_meta(reader.meta, reader.size)
        first = self._first
        size = 0
        taken_strings = 0
        rest: dict[str, Any] = {}
        # The scanner reads in a thread of its own (it releases the GIL) while this one
        # notes and spills the batch before: on two cores the 120x copy's first pass took
        # 1.1 s instead of 1.7 s. One batch waits at most, so memory holds three: the one
        # noted here, the one waiting and the one being read.
        batches = _scanned_batches(self.path, batch_events, self._report)
        try:
            for batch, read in kineto_decode._prefetched(batches, 1, "tessera-scan"):
                if "top" in batch:  # finish()'s columns, the last item
                    rest, size = batch, read
                    continue
                taken_strings += len(batch["strings"])
                first.add(batch)
        except kineto_decode._kineto_scan.Unsupported as exc:
            raise StreamUnsupported(str(exc)) from None
        if len(rest["ph"]):
            # The last events came out of finish(): take them from its grouped columns.
            first.add(_ungrouped(rest, sum(b.n for b in first.batches), taken_strings))
        strings = rest["strings"]
        first.text[len(first.text) :] = strings[len(first.text) :]
        text = rest["top_text"]
        spans = memoryview(rest["top"]).cast("q").tolist()
        try:
            meta = {
                strings[k]: _ANY.decode(text[a:b])
                for k, a, b in zip(spans[::3], spans[1::3], spans[2::3])
            }
        except msgspec.DecodeError as exc:
            raise TraceFormatError(self.path, f"not valid JSON ({exc})") from None
        return self._finish_meta(meta, size)

    def _report(self, size: int) -> None:
        """A progress line every PROGRESS_BYTES of JSON read (called by the thread that
        reads; the events spilled by then are counted)."""
        if size >= self._next_report:
            self._next_report = (size // PROGRESS_BYTES + 1) * PROGRESS_BYTES
            events = sum(b.n for b in self._first.batches)
            self._progress(
                f"{os.path.basename(self.path)}: {size / 1e6:,.0f} MB of JSON read, "
                f"{events:,} events spilled"
            )

    def _finish_meta(self, meta: dict[str, Any], size: int) -> tuple[dict[str, Any], int]:
        first = self._first
        if first.skipped:
            self.warnings.append(
                f"{self.path}: events of phase(s) {first.skipped} are not part of the Kineto "
                "format; skipped"
            )
        kineto_decode._checked(
            kineto_decode.RawTrace(path=self.path, events_text=b"", meta=meta, json_bytes=size)
        )
        return meta, size

    # ------------------------------------------------------------------ whole-file tables

    def _intern(self) -> None:
        """Intern the file's strings in the order the whole-file columns intern them
        (kineto_scanned.scanned_span_columns): canonical JSON of list arguments, each key's
        string values (or JSON texts of mixed keys), flow categories, slice names, slice
        categories. Every step's string table then lists its strings in the same order."""
        f, text, strings = self._first, self._first.text, self.strings
        u = f.uses
        raw = _distinct(u.raw)
        if raw.size:
            decoded = _ANY.decode("[" + ",".join([text[i] for i in raw.tolist()]) + "]")
            strings.intern_many([msgspec.json.encode(v).decode() for v in decoded])
        by_key = _distinct(u.by_key)
        keys_of = by_key >> 32
        for k, sid in enumerate(f.key_sids.tolist()):
            bits = f.key_bits[k]
            if not bits or text[sid] in _PROMOTED:
                continue
            present = {code for code in range(8) if bits >> code & 1}
            if present == {T_STR}:
                for i in (by_key[keys_of == k] & 0xFFFFFFFF).tolist():
                    strings.intern(text[i])
            elif not (
                present <= {1, 2}
                or present == {T_INT}
                or (T_FLOAT in present and present <= {T_INT, T_FLOAT, T_BIGINT})
                or present == {T_RAW}
            ):
                intern_json(strings, self._mixed_values(k))
        for group in (u.flow_cats, u.names, u.cats):
            for i in _distinct(group).tolist():
                strings.intern(text[i])
        self._string_count = len(text)

    def _mixed_values(self, k: int) -> list:
        """The kept values of argument key `k`, in file order (a key of mixed types)."""
        f = self._first
        out: list = []
        for b in f.batches:
            z = _unspill(b.cols, ("ph", "arg_ev", "arg_key", "arg_type", "arg_val"))
            ev = z["arg_ev"].astype(np.int64) - b.first
            ph_class = f.phase_class[z["ph"]]
            t = z["arg_type"]
            sel = (z["arg_key"] == k) & (t != T_NULL) & (ph_class[ev] == 1)
            out.extend(_python_values(t[sel], z["arg_val"][sel], f.text).tolist())
        return out

    def _tracks(self) -> None:
        f, text = self._first, self._first.text
        self.track_table = Tracks()
        pairs = list(f.slice_tracks) + [p for p in f.flow_tracks if p not in f.slice_tracks]
        for p in pairs:
            self.track_table.id_of((text[p >> 32], text[p & 0xFFFFFFFF]))
        self.track_of_pair = {p: i for i, p in enumerate(pairs)}
        n = len(pairs)
        has_device = np.zeros(n, dtype=bool)
        has_host = np.zeros(n, dtype=bool)
        device_of: dict[int, int | None] = {}
        stream_of: dict[int, int | None] = {}
        for p, i in self.track_of_pair.items():
            has_device[i] = f.has_device.get(p, False)
            has_host[i] = f.has_host.get(p, False)
            if p in f.first_device:
                device_of[i], stream_of[i] = (self._int_arg(c) for c in f.first_device[p])
        self.tracks = track_infos_from(
            self.track_table, has_device, has_host, device_of, stream_of, f.meta_events
        )

    def _int_arg(self, code: tuple[int, int, int]) -> int | None:
        """An argument's value when its key is an int64 column over the whole file."""
        k, t, v = code
        if k < 0 or self._first.key_bits[k] != 1 << T_INT:
            return None
        return int(v) if t == T_INT else None

    def _decide_steps(self) -> _Plan:
        f, base = self._first, self.base_ns
        if f.markers:
            nums = np.array([m[0] for m in f.markers], dtype=np.int64)
            start = base + us_to_ns(np.array([m[2] for m in f.markers]))
            dur = us_to_ns(np.array([m[3] for m in f.markers]))
            order = np.argsort(start, kind="stable")
            nums, start, dur = nums[order], start[order], dur[order]
            if distinct(nums).size != nums.size:
                raise TraceFormatError(
                    self.path, "two ProfilerStep events carry the same step number"
                )
            host_start, host_end = start, start + dur
        else:
            nums = np.array([self.span_index], dtype=np.int64)
            lo = base + f.min_start_ns if f.min_start_ns is not None else base
            hi = base + f.max_end_ns if f.max_end_ns is not None else base
            host_start, host_end = np.array([lo]), np.array([hi])
        # Each launch call's step, batch by batch (12 bytes a call are held, not its time).
        corrs, steps = [np.zeros(0, np.int64)], [np.zeros(0, np.int32)]
        for b in f.batches:
            z = _unspill(b.cols, ("launch_corr", "launch_ts"))
            corrs.append(z["launch_corr"])
            step = self._host_step(host_start, base + us_to_ns(z["launch_ts"]))
            steps.append(step.astype(np.int32))
        corr, step = np.concatenate(corrs), np.concatenate(steps)
        del corrs, steps
        # The first launch call of each correlation id (the whole file links the first).
        corr, first_at = np.unique(corr, return_index=True)
        launch_step = step[first_at]
        del step, first_at
        self._host_end = host_end
        return _Plan(nums, host_start, host_start.copy(), host_end.copy(), corr, launch_step)

    @staticmethod
    def _host_step(host_start: np.ndarray, start_ns: np.ndarray) -> np.ndarray:
        return np.clip(
            np.searchsorted(host_start, start_ns, side="right") - 1, 0, host_start.size - 1
        )

    # ------------------------------------------------------------------ pass 2

    def _event_steps(self, z, b: _Batch) -> tuple[np.ndarray, np.ndarray]:
        """(step index of each event of a batch, -1 for events that are neither slices nor
        flow points; end ns of device work, else min int64)."""
        f, plan = self._first, self._plan
        ph_class = f.phase_class[z["ph"]]
        n = b.n
        ts_ns = self.base_ns + us_to_ns(z["ts"])
        step = np.full(n, -1, dtype=np.int64)
        work_end = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        sl = np.flatnonzero(ph_class == 1)
        fl = np.flatnonzero(ph_class == 2)
        step[sl] = self._host_step(plan.host_start, ts_ns[sl])
        step[fl] = self._host_step(plan.host_start, ts_ns[fl])
        ev_local = z["arg_ev"].astype(np.int64) - b.first
        keep = (ph_class[ev_local] == 1) & (z["arg_type"] != T_NULL)
        c = {k: z[k] for k in ("arg_key", "arg_type", "arg_val")}
        corr = _promoted(c, ev_local, keep, sl, n, f.text, f.key_sids, CORRELATION_KEYS)
        kind = f.cat_kind[z["cat"][sl]]
        device = IS_DEVICE_WORK[kind] & (corr != 0)
        if device.any() and plan.launch_corr.size:
            pos = np.searchsorted(plan.launch_corr, corr[device])
            pos_c = np.minimum(pos, plan.launch_corr.size - 1)
            hit = plan.launch_corr[pos_c] == corr[device]
            rows = sl[device][hit]
            step[rows] = plan.launch_step[pos_c[hit]]
        is_x = f.is_x[z["ph"][sl]]
        work = IS_DEVICE_WORK[kind]
        dur_ns = np.where(is_x, us_to_ns(np.where(is_x, z["dur"][sl], 0.0)), 0)
        work_end[sl[work]] = (ts_ns[sl] + dur_ns)[work]
        # A flow point on a device track goes with the launch its id names (a kernel's
        # flow end sits on the kernel, whose step is its launch's).
        if fl.size and plan.launch_corr.size:
            pair = (z["pid"][fl].astype(np.int64) << 32) | z["tid"][fl].astype(np.int64)
            on_device = np.array([f.has_device.get(p, False) for p in pair.tolist()], bool)
            fid = z["id_val"][fl]
            sel = np.flatnonzero(on_device & (z["id_sid"][fl] < 0))
            if sel.size:
                pos = np.searchsorted(plan.launch_corr, fid[sel])
                pos_c = np.minimum(pos, plan.launch_corr.size - 1)
                hit = plan.launch_corr[pos_c] == fid[sel]
                step[fl[sel[hit]]] = plan.launch_step[pos_c[hit]]
        return step, work_end

    def _assign(self) -> list[tuple[int, int]]:
        """Each batch's event steps (spilled beside it) and the parts: runs of consecutive
        steps of at most part_events events (a larger step alone)."""
        plan = self._plan
        n_steps = plan.numbers.size
        counts = np.zeros(n_steps, dtype=np.int64)
        work_end = np.full(n_steps, np.iinfo(np.int64).min, dtype=np.int64)

        def assign(b: _Batch) -> tuple[np.ndarray, np.ndarray]:
            z = _unspill(b.cols, [k for k in _COLUMN_TYPES if k != "name"])
            step, wend = self._event_steps(z, b)
            del z
            b.step = _spill(b.cols.path + ".step", {"step": step})
            got = step >= 0
            ends = np.full(n_steps, np.iinfo(np.int64).min, dtype=np.int64)
            np.maximum.at(ends, step[got], wend[got])
            return np.bincount(step[got], minlength=n_steps), ends

        for batch_counts, ends in _each_batch(assign, self._first.batches):
            counts += batch_counts
            np.maximum(work_end, ends, out=work_end)
        span_end = np.maximum(self._host_end, work_end)
        span_start = plan.host_start.copy()
        for i in range(1, n_steps):
            span_start[i] = max(plan.host_start[i], span_end[i - 1])
            span_end[i] = max(span_end[i], span_start[i])
        plan.span_start, plan.span_end = span_start, span_end
        self.step_events = counts
        room = self.memory_bytes if self.memory_bytes is not None else available_memory_bytes()
        biggest = int(np.argmax(counts)) if n_steps else 0
        if n_steps and counts[biggest] * STEP_BYTES_PER_EVENT > room:
            share = self.json_bytes * counts[biggest] / max(1, counts.sum())
            raise StepTooLarge(
                self.path,
                f"step {int(plan.numbers[biggest])} holds {int(counts[biggest]):,} events "
                f"(about {share / 1e6:,.0f} MB of the trace's JSON); building it takes about "
                f"{counts[biggest] * STEP_BYTES_PER_EVENT / 1e6:,.0f} MB and "
                f"{room / 1e6:,.0f} MB are free: import it on a machine with more memory, "
                "or profile fewer iterations per step",
            )
        parts: list[tuple[int, int]] = []
        lo, total = 0, 0
        for i in range(n_steps):
            if i > lo and total + counts[i] > self.part_events:
                parts.append((lo, i))
                lo, total = i, 0
            total += int(counts[i])
        if n_steps:
            parts.append((lo, n_steps))
        self._split_batches(parts)
        return parts

    def _split_batches(self, parts: list[tuple[int, int]]) -> None:
        """Regroup the spilled batches by part: part p's events of batch b in one file."""
        bounds = np.array([lo for lo, _ in parts] + [parts[-1][1] if parts else 0])
        self._part_files: list[list[_Spilled]] = [[] for _ in parts]

        def split(job: tuple[int, _Batch]) -> list[tuple[int, _Spilled]]:
            bi, b = job
            files = []
            step = _unspill(b.step)["step"]
            cols = _unspill(b.cols, list(_COLUMN_TYPES))
            part_of = np.searchsorted(bounds, step, side="right") - 1
            part_of[step < 0] = -1
            ev_local = cols["arg_ev"].astype(np.int64) - b.first
            arg_part = part_of[ev_local] if ev_local.size else np.zeros(0, np.int64)
            for p in distinct(part_of[part_of >= 0]).tolist():
                sel = np.flatnonzero(part_of == p)
                asel = np.flatnonzero(arg_part == p)
                out = {k: cols[k][sel] for k in _EVENT_COLUMNS}
                out.update({k: cols[k][asel] for k in ("arg_ev", "arg_key", "arg_type", "arg_val")})
                out["row"] = (b.first + sel).astype(np.int64)
                out["step"] = step[sel]
                path = os.path.join(self.spill_dir, f"part_{p:06d}_{bi:06d}")
                files.append((p, _spill(path, out)))
            del cols
            self._deleter.remove(b.cols.path)
            self._deleter.remove(b.step.path)
            return files

        for files in _each_batch(split, list(enumerate(self._first.batches))):
            for p, spilled in files:
                self._part_files[p].append(spilled)  # in batch order, as the file has them

    # ------------------------------------------------------------------ pass 3

    @property
    def event_count(self) -> int:
        return self._first.slices

    @property
    def step_count(self) -> int:
        return int(self._plan.numbers.size)

    def steps(self) -> Iterator[StepData]:
        """The file's steps in step order, one part built at a time. The next part is
        built in a thread of its own (its first step cut there too) while this part's steps
        are handed out: numpy releases the GIL for most of a part's building, so on two
        cores it overlaps the encoding of this part's steps (the third pass over the 120x
        copy took 2.18-2.53 s instead of 2.38-2.74 s). Memory holds two parts so."""
        unbound = [0, 0]
        pending: Background | None = None
        try:
            for p in range(len(self.parts)):
                steps = self._built_part(p, unbound) if pending is None else pending.result()
                pending = None
                if p + 1 < len(self.parts):
                    pending = Background(self._built_part, p + 1, unbound)
                    pending.start()
                yield from steps
                del steps
            if unbound[0]:
                self.warnings.append(
                    f"{self.path}: {unbound[0]} of {unbound[1]} flow points bind to no event"
                )
        finally:
            if pending is not None:
                pending.join()  # its part's files are read before the scratch goes
            self.close()

    def _built_part(self, p: int, unbound: list[int]) -> Iterator[StepData]:
        """Part p's steps: its span built and its first step cut (the rows of the part put
        in step order), then the rest as they are asked for."""
        lo, hi = self.parts[p]
        steps = iter(self._part_span(p, lo, hi, unbound).steps)
        first = next(steps, None)
        return steps if first is None else itertools.chain([first], steps)

    def _part_span(self, p: int, lo: int, hi: int, unbound: list[int]) -> SpanStream:
        f, plan = self._first, self._plan
        chunks = []
        for sp in self._part_files[p]:
            chunks.append(_unspill(sp))
            self._deleter.remove(sp.path)
        if chunks:
            ev = _part_rows_of_args(chunks)
            cols = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
        else:
            cols = {k: np.zeros(0, dtype=t) for k, t in _COLUMN_TYPES.items()}
            cols.update(row=np.zeros(0, np.int64), step=np.zeros(0, np.int64))
            ev = np.zeros(0, np.int64)
        del chunks
        rows = cols["row"]
        nkeys = f.key_sids.size
        keys = cols["arg_key"]
        if nkeys <= np.iinfo(np.uint16).max + 1:
            keys = keys.astype(np.uint16)  # a stable sort of 16-bit keys is a radix sort
        order = np.argsort(keys, kind="stable")
        del keys
        key_start = np.zeros(nkeys + 1, dtype=np.int64)
        key_start[1:] = np.cumsum(np.bincount(cols["arg_key"], minlength=nkeys))
        scan = {
            "strings": f.text,
            "n": int(rows.size),
            **{k: np.ascontiguousarray(cols[k]) for k in _EVENT_COLUMNS},
            "arg_ev": ev[order].astype(np.int32),
            "arg_type": cols["arg_type"][order],
            "arg_val": cols["arg_val"][order],
            "arg_key_sid": f.key_sids,
            "arg_key_start": key_start,
        }
        step_local = cols["step"] - lo
        ph_class = f.phase_class[cols["ph"]]
        context = FileContext(self.track_table, f.meta_events, f.key_bits)
        span_cols = scanned_span_columns(scan, self.path, self.strings, self.base_ns, context)
        span_cols.skipped_phases = {}
        del scan
        step_plan = StepPlan(
            step_numbers=plan.numbers[lo:hi],
            span_start=plan.span_start[lo:hi],
            span_end=plan.span_end[lo:hi],
            step_of=step_local[ph_class == 1],
            flow_step=step_local[ph_class == 2],
            tracks=self.tracks,
            unbound_flows=unbound,
        )
        return span_of_columns(
            span_cols, self.path, self.strings, self.span_index, self.base_ns, step_plan
        )

    def close(self) -> None:
        self._deleter.finish()
        shutil.rmtree(self.spill_dir, ignore_errors=True)

    def as_trace(self) -> kineto_decode.RawTrace:
        """A RawTrace of the file's top-level members (no events), for the worker's meta."""
        trace = kineto_decode.RawTrace(
            path=self.path, events_text=b"", meta=self.meta, json_bytes=self.json_bytes
        )
        trace._released = (self.event_count, self._first.first_categories)
        return trace

    def as_span(self) -> SpanStream:
        """The file as a SpanStream: its steps made as they are iterated; `warnings` gains
        the flow warning once they all were."""
        return SpanStream(
            steps=self.steps(),
            step_count=self.step_count,
            tracks=self.tracks,
            event_count=self.event_count,
            base_ns=self.base_ns,
            warnings=self.warnings,
        )


# Events per batch on the pure-Python path: its events are Python objects (about 1 KB each).
PURE_BATCH_EVENTS = 1 << 14
_EVENT_LIST = msgspec.json.Decoder(list[RawEvent])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_JSON = msgspec.json.Encoder()
# Between two events of the list: the end of one object, a comma, the start of the next.
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_INT64 = (-(1 << 63), (1 << 63) - 1)


class _PureReader:
    """The pure-Python path's batches, in the shape of `Scanner.take` (no C compiler): the
    text is read piece by piece, cut between events (msgspec checks every cut, so a cut
    inside a string is never taken) and decoded a batch at a time; strings are interned in
    the order of the fields Kineto writes (ph, cat, name, pid, tid, id, then each argument's
    key and value), as the scanner meets them. Only one piece and one batch are held."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.size = 0
        self.meta: dict[str, Any] = {}
        self.table = StringTable()  # the file's strings, as the scanner numbers them
        self.table.intern("0")
        self.handed = 0  # strings handed over with earlier batches
        self.keys: dict[int, int] = {}  # string id of an args key -> its number
        self.key_sids: list[int] = []
        self.events = 0
        self.max_text = 0  # the most text held at once, in bytes

    def batches(self, batch_events: int) -> Iterator[dict[str, Any]]:
        buf = b""
        head_done = False
        pieces = kineto_decode._prefetched(kineto_decode.iter_text(self.path))
        for piece in pieces:
            self.size += len(piece)
            buf += piece
            self.max_text = max(self.max_text, len(buf))
            if not head_done:
                start = self._head(buf)
                if start is None:
                    continue
                buf, head_done = buf[start:], True
            raw, cut, error = None, None, None
            # The last few places that look like a cut between events, latest first: one
            # inside a string (or damage) does not read, and an earlier one is tried.
            for cut in self._cuts(buf)[:8]:
                try:
                    raw = _RAW_LIST.decode(b"[" + buf[: cut + 1] + b"]")
                    break
                except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                    error = exc
            if raw is None:
                # Read on and cut at a later event; a text this long that still does not
                # read is damaged.
                if len(buf) > 256 << 20:
                    raise TraceFormatError(self.path, f"not valid JSON ({error})") from None
                continue
            yield from self._batches_of(raw, batch_events)
            buf = buf[cut + 1 :].lstrip()[1:]  # past the comma
        if not head_done:
            # No `"traceEvents": [` in the text (at most 64 MB: see _head): the whole-file
            # reader reads it and names what is wrong.
            raise StreamUnsupported("no traceEvents list")
        events_text, tail = self._split_tail(buf)
        if events_text.strip():
            yield from self._decode(events_text, batch_events)
        try:
            self.meta.update({k: _ANY.decode(v) for k, v in _MEMBERS.decode(tail).items()})
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise TraceFormatError(self.path, f"not valid JSON ({exc})") from None
        except UnicodeDecodeError as exc:
            raise TraceFormatError(self.path, kineto_decode._not_utf8(exc)) from None

    def _head(self, buf: bytes) -> int | None:
        """Where the first event starts, once the top-level members before the list are
        read (into meta); None while the text so far does not reach the list."""
        first = kineto_decode._FIRST_NON_SPACE.search(buf)
        if first is None:
            return None
        if first.group() == b"[":  # a bare list of events
            return first.end()
        m = _EVENTS_KEY.search(buf)
        if m is None:
            if len(buf) > 64 << 20:
                raise StreamUnsupported("no traceEvents list in the first 64 MB")
            return None
        before = buf[: m.start()].rstrip()
        before = before[:-1] if before.endswith(b",") else before
        try:
            members = _MEMBERS.decode(before + b"}")
            self.meta.update({k: _ANY.decode(v) for k, v in members.items()})
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            raise StreamUnsupported("the members before traceEvents do not read") from None
        return m.end()

    @staticmethod
    def _cuts(buf: bytes) -> list[int]:
        """Positions of a `}` followed by `,` and `{` (the end of an event, unless inside a
        string), latest first: those of the last MB of `buf`, else of all of it."""
        found = [m.start() for m in _BOUNDARY.finditer(buf, max(0, len(buf) - (1 << 20)))]
        if not found:
            found = [m.start() for m in _BOUNDARY.finditer(buf)]
        return [c for c in reversed(found) if c > 0]

    def _split_tail(self, buf: bytes) -> tuple[bytes, bytes]:
        """(the last events' text, the top-level members after the list as an object)."""
        end = len(buf)
        while True:
            close = buf.rfind(b"]", 0, end)
            if close < 0:
                raise TraceFormatError(self.path, "the traceEvents list does not end")
            tail = buf[close + 1 :].strip()
            if tail.startswith(b","):
                tail = b"{" + tail[1:]
            elif tail in (b"}", b""):
                tail = b"{}"
            try:
                _MEMBERS.decode(tail)
                _RAW_LIST.decode(b"[" + buf[:close] + b"]")
                return buf[:close], tail
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
                end = close

    def _decode(self, text: bytes, batch_events: int) -> Iterator[dict[str, Any]]:
        try:
            raw = _RAW_LIST.decode(b"[" + text + b"]")
        except msgspec.DecodeError as exc:
            raise TraceFormatError(self.path, f"not valid JSON ({exc})") from None
        except UnicodeDecodeError as exc:
            raise TraceFormatError(self.path, kineto_decode._not_utf8(exc)) from None
        yield from self._batches_of(raw, batch_events)

    def _batches_of(self, raw: list, batch_events: int) -> Iterator[dict[str, Any]]:
        for lo in range(0, len(raw), batch_events):
            part = raw[lo : lo + batch_events]
            try:
                events = _EVENT_LIST.decode(b"[" + b",".join(part) + b"]")
            except msgspec.ValidationError as exc:
                message = kineto_decode._describe_validation(exc, self.events + lo)
                raise TraceFormatError(self.path, message) from None
            except UnicodeDecodeError as exc:
                raise TraceFormatError(self.path, kineto_decode._not_utf8(exc)) from None
            yield self._columns(events, self.events + lo)
        self.events += len(raw)

    def _columns(self, events: list[RawEvent], first: int) -> dict[str, Any]:
        n = len(events)
        sid = self.table.intern
        ph, cat, name = (np.zeros(n, np.int32) for _ in range(3))
        pid, tid, id_sid = np.zeros(n, np.int32), np.zeros(n, np.int32), np.full(n, -1, np.int32)
        ts, dur = np.full(n, np.nan), np.full(n, np.nan)
        id_val = np.zeros(n, np.int64)
        a_ev: list[int] = []
        a_key: list[int] = []
        a_type: list[int] = []
        a_val: list[int] = []
        for i, e in enumerate(events):
            ph[i], cat[i], name[i] = sid(e.ph), sid(e.cat), sid(e.name)
            pid[i] = sid(e.pid if isinstance(e.pid, str) else str(e.pid))
            tid[i] = sid(e.tid if isinstance(e.tid, str) else str(e.tid))
            if e.ts is not None:
                ts[i] = e.ts
            if e.dur is not None:
                dur[i] = e.dur
            if isinstance(e.id, str):
                id_sid[i] = sid(e.id)
            elif e.id is not None:
                id_val[i] = e.id
            if e.args:
                for k, v in e.args.items():
                    ks = sid(k)
                    kn = self.keys.get(ks)
                    if kn is None:
                        kn = self.keys[ks] = len(self.key_sids)
                        self.key_sids.append(ks)
                    t, val = self._arg(v)
                    a_ev.append(first + i)
                    a_key.append(kn)
                    a_type.append(t)
                    a_val.append(val)
        new = self.table.strings[self.handed :]
        self.handed = len(self.table.strings)
        return {
            "first": first,
            "n": n,
            "strings": new,
            "ph": ph,
            "cat": cat,
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": ts,
            "dur": dur,
            "id_val": id_val,
            "id_sid": id_sid,
            "arg_ev": np.array(a_ev, dtype=np.int32),
            "arg_key": np.array(a_key, dtype=np.int32),
            "arg_type": np.array(a_type, dtype=np.uint8),
            "arg_val": np.array(a_val, dtype=np.int64),
            "arg_key_sid": np.array(self.key_sids, dtype=np.int32),
        }

    def _arg(self, v: Any) -> tuple[int, int]:
        """(type code, payload) of one argument value, as the scanner codes it."""
        if v is None:
            return T_NULL, 0
        if v is True:
            return T_TRUE, 0
        if v is False:
            return T_FALSE, 0
        if isinstance(v, int):
            if _INT64[0] <= v <= _INT64[1]:
                return T_INT, v
            return T_BIGINT, self.table.intern(str(v))
        if isinstance(v, float):
            return T_FLOAT, int(np.float64(v).view(np.int64))
        if isinstance(v, str):
            return T_STR, self.table.intern(v)
        return T_RAW, self.table.intern(_JSON.encode(v).decode())


def _each_batch(fn: Callable[[Any], T], items: list) -> Iterator[T]:
    """fn(item) of each item, in order; on two CPUs or more two items at once, in threads
    (numpy releases the GIL for most of a batch's work, and the spill files' reads and
    writes do too): the second pass over the 120x copy took 0.52-0.57 s instead of
    0.69-0.82 s."""
    if len(items) < 2 or not two_cpus():
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(2, thread_name_prefix="tessera-pass2")
    try:
        yield from pool.map(fn, items)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _part_rows_of_args(chunks: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The row, in a part's concatenated chunks, of each argument's event: a chunk's
    arguments name events of that chunk (file numbers, `row`), all from one batch, so a
    table over the batch's range finds them (a binary search of the part's rows for each
    argument took several times longer)."""
    out = []
    offset = 0
    for c in chunks:
        rows = c["row"]
        if rows.size:
            low = int(rows[0])
            at = np.empty(int(rows[-1]) - low + 1, dtype=np.int64)
            at[rows - low] = np.arange(offset, offset + rows.size)
            out.append(at[c["arg_ev"].astype(np.int64) - low])
        offset += rows.size
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _scanned_batches(
    path: str, batch_events: int, report: Callable[[int], None]
) -> Iterator[tuple[dict[str, Any], int]]:
    """(columns, JSON bytes read so far) of every batch of about `batch_events` events the
    C scanner takes from a file's text, then (finish()'s columns, the text's size).
    `report(bytes read)` is called after each piece of text, in the thread that reads."""
    scanner = kineto_decode._kineto_scan.Scanner()
    taken_strings = taken_events = size = 0
    for piece in kineto_decode._prefetched(kineto_decode.iter_text(path)):
        size += len(piece)
        report(size)
        scanner.feed(piece)
        # (the scanner's count takes in every event read)
        if scanner.events_read() - taken_events >= batch_events:
            batch = scanner.take(taken_strings)
            taken_strings += len(batch["strings"])
            taken_events += int(batch["n"])
            yield batch, size
    yield scanner.take(taken_strings), size
    yield scanner.finish(), size


def _distinct(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return distinct(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))


def _ungrouped(rest: dict[str, Any], first: int, taken_strings: int) -> dict[str, Any]:
    """finish()'s remaining columns (arguments grouped by key) in take()'s shape."""
    bounds = np.frombuffer(rest["arg_key_start"], dtype=np.int64)
    keys = np.repeat(np.arange(bounds.size - 1, dtype=np.int32), np.diff(bounds))
    ev = np.frombuffer(rest["arg_ev"], dtype=np.int32)
    order = np.lexsort((np.arange(ev.size), ev))  # back to event order, keys in key order
    out = {k: rest[k] for k in _EVENT_COLUMNS}
    out.update(
        first=first,
        n=len(rest["ph"]) // 4,
        strings=rest["strings"][taken_strings:],
        arg_ev=ev[order].tobytes(),
        arg_key=keys[order].tobytes(),
        arg_type=np.frombuffer(rest["arg_type"], dtype=np.uint8)[order].tobytes(),
        arg_val=np.frombuffer(rest["arg_val"], dtype=np.int64)[order].tobytes(),
        arg_key_sid=rest["arg_key_sid"],
    )
    return out
