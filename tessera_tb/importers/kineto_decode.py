"""Read a PyTorch profiler (Kineto) trace file into typed records, fast.

Handles `.json` and `.json.gz`, the current format (lower-case categories,
`baseTimeNanoseconds`, relative `ts`), the 2022 transitional one and the pre-2022 one
(absolute `ts`, string tids). Every problem is a TraceFormatError naming the file.

Two ways to read the events, with the same results:
- the C scanner (`_kineto_scan`, built at install when a C compiler is present) reads the
  whole trace text once, its events into columns, with no Python object per event;
- the pure-Python path decodes events into `RawEvent` structs with msgspec, a batch at a
  time. It is used when the scanner is not built, when TESSERA_PURE_PYTHON=1, and for input
  the scanner declines (malformed events among them: this path names the problem).
"""

from __future__ import annotations

import gc
import gzip
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from tessera_tb.trace.columns import DEFLATE_ERRORS
from tessera_tb.trace.columns import deflate_module as deflate
from tessera_tb.trace.errors import TraceFormatError


class RawEvent(msgspec.Struct):
    """One entry of `traceEvents`, as the Chrome trace format spells it."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    id: int | str | None = None
    s: str = ""
    bp: str = ""
    args: dict[str, Any] | None = None


_FIRST_NON_SPACE = re.compile(rb"[^ \t\r\n\f\v]")

# Kineto has written schemaVersion 1 since its first release (2021 traces included).
KINETO_SCHEMA_MAX = 1

_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[RawEvent])
_ANY = msgspec.json.Decoder()

try:
    from tessera_tb.importers import _kineto_scan
except ImportError:  # built without a C compiler: the pure-Python path reads everything
    _kineto_scan = None


def scanner_available() -> bool:
    """Whether the C scanner is built and not switched off (TESSERA_PURE_PYTHON=1)."""
    return _kineto_scan is not None and os.environ.get("TESSERA_PURE_PYTHON", "") in ("", "0")


# Events are decoded into Python objects this many at a time and turned into columns
# before the next batch, so peak memory holds the JSON text plus one batch of objects
# rather than every event as an object (bench/ingest.py measures the peak).
CHUNK_EVENTS = 8192


@contextmanager
def gc_paused():
    """Pause the garbage collector: decoding allocates millions of objects that all
    survive, and the collector would walk them over and over for nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class RawTrace:
    path: str
    events_text: bytes | msgspec.Raw | memoryview  # the JSON text of traceEvents
    meta: dict[str, Any]  # every top-level key but traceEvents
    json_bytes: int
    scan: dict[str, Any] | None = None  # the C scanner's columns, when it read the events
    _raw_events: list[msgspec.Raw] | None = field(default=None, repr=False)

    @property
    def raw_events(self) -> list[msgspec.Raw]:
        """Each entry of traceEvents, undecoded (split on first use)."""
        if self._raw_events is None:
            self._raw_events = _split_events(self.path, self.events_text)
        return self._raw_events

    @property
    def event_count(self) -> int:
        return self.scan["n"] if self.scan is not None else len(self.raw_events)

    def first_categories(self, count: int) -> set[str]:
        """The categories of the first `count` events."""
        if self.scan is not None:
            cats = np.unique(np.frombuffer(self.scan["cat"], dtype=np.int32)[:count])
            return {self.scan["strings"][c] for c in cats.tolist()}
        for _, events in self.iter_chunks(size=count):
            return {e.cat for e in events}
        return set()

    def iter_chunks(self, size: int | None = None) -> Iterator[tuple[int, list[RawEvent]]]:
        """(index of the first event, decoded events) for consecutive batches of events."""
        size = size or CHUNK_EVENTS
        for offset in range(0, len(self.raw_events), size):
            batch = self.raw_events[offset : offset + size]
            with gc_paused():
                try:
                    events = _EVENTS.decode(b"[" + b",".join(batch) + b"]")
                except msgspec.ValidationError as exc:
                    raise TraceFormatError(self.path, _describe_validation(exc, offset)) from None
                except UnicodeDecodeError as exc:
                    raise TraceFormatError(self.path, _not_utf8(exc)) from None
            yield offset, events

    @property
    def events(self) -> list[RawEvent]:
        """Every event decoded at once (small traces, tests)."""
        return [e for _, chunk in self.iter_chunks() for e in chunk]


def read_bytes(path: str) -> bytes:
    """The file's JSON text, gunzipped when it is gzip (by its magic bytes, not its name)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = _gunzip(data)
        except EOFError:
            raise TraceFormatError(
                path, "truncated gzip file (ends before the stream does)"
            ) from None
        except (OSError, *DEFLATE_ERRORS) as exc:
            raise TraceFormatError(path, f"corrupt gzip data ({exc})") from None
    return data


def _gunzip(data: bytes) -> bytes:
    """gzip.decompress, faster for the usual single-member file: zlib checks the CRC and
    length in C while inflating, instead of a second pass over the output."""
    d = deflate.decompressobj(wbits=31)
    out = d.decompress(data)
    if not d.eof:
        raise EOFError("compressed file ended before the end-of-stream marker")
    if d.unused_data.strip(b"\x00"):
        return gzip.decompress(data)  # several gzip members: let gzip concatenate them
    return out


def _describe_validation(exc: msgspec.ValidationError, offset: int = 0) -> str:
    msg = str(exc)
    # msgspec says "... - at `$[12].ts`"; name the event by its index in traceEvents.
    if " - at `$[" in msg:
        head, _, where = msg.partition(" - at `$[")
        index, _, rest = where.partition("]")
        field = rest.strip("`").lstrip(".") or "event"
        return f"traceEvents[{int(index) + offset}] field {field!r}: {head}"
    return msg


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not valid UTF-8 text ({exc.reason} at byte {exc.start} of a string)"


@contextmanager
def _json_errors(path: str):
    """msgspec's errors on a trace's JSON text, as TraceFormatErrors naming the file."""
    try:
        yield
    except msgspec.ValidationError as exc:
        raise TraceFormatError(path, f"'traceEvents' is not a list of events ({exc})") from None
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, f"not valid JSON ({exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, _not_utf8(exc)) from None


def _split_events(path: str, events_text: bytes | msgspec.Raw) -> list[msgspec.Raw]:
    with gc_paused(), _json_errors(path):
        return _RAW_LIST.decode(events_text)


def _scan(data: bytes) -> dict[str, Any] | None:
    """The scanner's columns of a whole trace text, or None where the pure-Python path must
    read it."""
    if not scanner_available():
        return None
    try:
        return _kineto_scan.scan_events(data)
    except _kineto_scan.Unsupported:
        return None


def decode(path: str, data: bytes) -> RawTrace:
    """Split the JSON text of a trace file into its metadata and its events (scanned into
    columns by the C scanner where it can, else split into undecoded entries)."""
    first = _FIRST_NON_SPACE.search(data)  # no stripped copy of a large text
    if first is None:
        raise TraceFormatError(path, "empty file, expected a JSON trace")
    with gc_paused():
        # The scanner reads the whole text in one pass, the top level included; where it
        # declines, msgspec splits the top level and the pure-Python path reads the events.
        scan = _scan(data)
        with _json_errors(path):
            if scan is not None:
                view = memoryview(data)
                strings = scan["strings"]
                spans = memoryview(scan["top"]).cast("q").tolist()
                top: dict[str, Any] = {
                    strings[k]: view[a:b] for k, a, b in zip(spans[::3], spans[1::3], spans[2::3])
                }
                events_start, events_end = scan["events_range"]
                events_text: bytes | msgspec.Raw | memoryview = view[events_start:events_end]
            elif first.group() == b"[":
                top = {}
                events_text = data
            else:
                top = _TOP.decode(data)
                if "traceEvents" not in top:
                    raise TraceFormatError(path, "JSON has no 'traceEvents' list: not a trace")
                events_text = top.pop("traceEvents")
            raw_events = None if scan is not None else _split_events(path, events_text)
            meta = {k: _ANY.decode(v) for k, v in top.items()}
    version = meta.get("schemaVersion", 1)
    if not isinstance(version, int) or version > KINETO_SCHEMA_MAX:
        raise TraceFormatError(
            path,
            f"schemaVersion {version} is newer than the Kineto trace formats this importer "
            f"reads (up to {KINETO_SCHEMA_MAX}): upgrade tessera-profiler",
        )
    return RawTrace(
        path=path,
        events_text=events_text,
        meta=meta,
        json_bytes=len(data),
        scan=scan,
        _raw_events=raw_events,
    )


def read_trace(path: str) -> RawTrace:
    return decode(path, read_bytes(path))
