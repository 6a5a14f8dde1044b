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
import queue
import re
import threading
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import numpy as np

from tessera_tb.importers.arrays import distinct
from tessera_tb.importers.background import two_cpus
from tessera_tb.trace.columns import DEFLATE_ERRORS
from tessera_tb.trace.columns import deflate_module as deflate
from tessera_tb.trace.errors import TraceFormatError

T = TypeVar("T")


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
    from isal import igzip_lib
except ImportError:  # a platform without isal's wheels: zlib's inflate (_ZlibMember)
    igzip_lib = None

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

    _released: tuple[int, set[str]] | None = field(default=None, repr=False)

    @property
    def event_count(self) -> int:
        if self._released is not None:
            return self._released[0]
        return self.scan["n"] if self.scan is not None else len(self.raw_events)

    def first_categories(self, count: int = 5000) -> set[str]:
        """The categories of the first `count` events (at most 5000 once the columns are
        released)."""
        if self._released is not None:
            return self._released[1]
        if self.scan is not None:
            cats = distinct(np.frombuffer(self.scan["cat"], dtype=np.int32)[:count])
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

    def release_scan(self) -> dict[str, Any] | None:
        """Hand over the scanner's columns, dropping them here: once the span's columns are
        built from them they are dead weight, a sixth of the text's size, while the steps
        are built. The event count and first categories stay readable."""
        scan = self.scan
        if scan is not None:
            self._released = (scan["n"], self.first_categories(5000))
            self.scan = None
        return scan

    @property
    def events(self) -> list[RawEvent]:
        """Every event decoded at once (small traces, tests)."""
        return [e for _, chunk in self.iter_chunks() for e in chunk]


# The trace is read this many bytes of compressed file at a time, and each read is inflated
# into text in pieces of at most TEXT_CHUNK bytes: the scanner holds one piece (and the cut
# event at its end) at a time, never the whole text.
READ_CHUNK = 1 << 20
TEXT_CHUNK = 8 << 20
# The first piece is smaller: reading starts sooner, and where two scanners share the text
# (kineto_split_scan) the second starts after it.
FIRST_TEXT_CHUNK = 1 << 20


def iter_text(path: str) -> Iterator[bytes]:
    """The file's JSON text in pieces of at most TEXT_CHUNK bytes, gunzipped when it is gzip
    (by its magic bytes, not its name; several members are concatenated, trailing zero bytes
    ignored). Raises TraceFormatError naming the file on a read error or a truncated or
    corrupt gzip stream, at the piece where the damage is."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read ({exc.strerror or exc})") from None
    with f:
        try:
            data = f.read(READ_CHUNK)
            if data[:2] != b"\x1f\x8b":
                while data:
                    yield data
                    data = f.read(TEXT_CHUNK)
                return
            yield from _gunzip_pieces(f, data)
        except OSError as exc:
            raise TraceFormatError(path, f"cannot read ({exc.strerror or exc})") from None
        except EOFError:
            raise TraceFormatError(
                path, "truncated gzip file (ends before the stream does)"
            ) from None
        except DEFLATE_ERRORS as exc:
            raise TraceFormatError(path, f"corrupt gzip data ({exc})") from None


class _ZlibMember:
    """zlib's gzip inflate with the interface of isal's IgzipDecompressor (and bz2's): it
    keeps the input a call did not use, and takes more only when it says so."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(wbits=31)
        self._tail = b""

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    @property
    def needs_input(self) -> bool:
        return not self._tail

    def decompress(self, data: bytes, limit: int) -> bytes:
        out = self._d.decompress(self._tail + data if self._tail else data, limit)
        # At a member's end the rest of the input is in unused_data (zlib leaves a copy
        # in unconsumed_tail too).
        self._tail = b"" if self._d.eof else self._d.unconsumed_tail
        return out


def _gzip_member():
    """A decompressor for one gzip member, which checks its CRC and length as it ends.
    ISA-L's puts each piece in a buffer of the piece's size from the start; its zlib-like
    decompressobj grows one from 16 KB by doubling, copying as it goes."""
    if igzip_lib is not None:
        return igzip_lib.IgzipDecompressor(flag=igzip_lib.DECOMP_GZIP)
    return _ZlibMember()


def _gunzip_pieces(f, data: bytes) -> Iterator[bytes]:
    """Inflate gzip members from `data` and then the rest of file `f`, piece by piece."""
    d = _gzip_member()
    limit = min(FIRST_TEXT_CHUNK, TEXT_CHUNK)
    while True:
        if d.eof:  # a member ended: zero padding, or another member
            data = d.unused_data + data or f.read(READ_CHUNK)
            if not data:
                return
            if not data.strip(b"\x00"):  # zero padding: the rest of the file must be too
                while more := f.read(READ_CHUNK):
                    if more.strip(b"\x00"):
                        raise zlib.error("data after the zero padding of the last member")
                return
            d = _gzip_member()
        elif d.needs_input and not data:
            data = f.read(READ_CHUNK)
            if not data:
                raise EOFError("compressed file ended before the end-of-stream marker")
        out = d.decompress(data, limit)
        data = b""
        limit = TEXT_CHUNK
        if out:
            yield out


def read_bytes(path: str) -> bytes:
    """The file's whole JSON text, gunzipped when it is gzip (the pure-Python path). One
    inflate into one buffer: joining streamed pieces would hold the text twice."""
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


def _prefetched(pieces: Iterator[T], depth: int = 2, name: str = "tessera-gunzip") -> Iterator[T]:
    """The same pieces, read and inflated ahead in a thread: gunzip and file reads release
    the GIL, so they overlap the scanner (which releases it too) on a second core. At most
    `depth` pieces wait, so memory stays bounded. Any iterator of items other than None
    goes (the bounded import's batches are scanned ahead so too); a generator is closed in
    that thread when it stops, so one that prefetches in turn stops its own thread."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for piece in pieces:
                if stop.is_set():
                    return
                q.put((piece, None))
            q.put((None, None))
        except BaseException as exc:  # handed to the reading thread, raised there
            q.put((None, exc))
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            piece, exc = q.get()
            if exc is not None:
                raise exc
            if piece is None:
                return
            yield piece
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
        thread.join()


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


def _scan(pieces: Iterable[bytes]) -> tuple[dict[str, Any] | None, int]:
    """The scanner's columns of a trace's text given in pieces, and the text's length in
    bytes; None for the columns where the pure-Python path must read it (the scanner is off
    or declines). Only the columns, the string table and one piece are held at a time."""
    if not scanner_available():
        return None, 0
    scanner = _kineto_scan.Scanner()
    size = 0
    try:
        for piece in pieces:
            size += len(piece)
            scanner.feed(piece)
        return scanner.finish(), size
    except _kineto_scan.Unsupported:
        return None, size


def _scanned(path: str, scan: dict[str, Any], json_bytes: int) -> RawTrace:
    """A RawTrace of the scanner's columns; the other top-level members decoded."""
    strings = scan["strings"]
    text = scan["top_text"]
    spans = memoryview(scan["top"]).cast("q").tolist()
    with _json_errors(path):
        meta = {
            strings[k]: _ANY.decode(text[a:b])
            for k, a, b in zip(spans[::3], spans[1::3], spans[2::3])
        }
    return _checked(
        RawTrace(path=path, events_text=b"", meta=meta, json_bytes=json_bytes, scan=scan)
    )


def _checked(trace: RawTrace) -> RawTrace:
    version = trace.meta.get("schemaVersion", 1)
    if not isinstance(version, int) or version > KINETO_SCHEMA_MAX:
        raise TraceFormatError(
            trace.path,
            f"schemaVersion {version} is newer than the Kineto trace formats this importer "
            f"reads (up to {KINETO_SCHEMA_MAX}): upgrade tessera-profiler",
        )
    return trace


def decode(path: str, data: bytes) -> RawTrace:
    """Split the JSON text of a trace file into its metadata and its events (scanned into
    columns by the C scanner where it can, else split into undecoded entries)."""
    if _FIRST_NON_SPACE.search(data) is None:  # no stripped copy of a large text
        raise TraceFormatError(path, "empty file, expected a JSON trace")
    with gc_paused():
        scan, _ = _scan([data])
        if scan is not None:
            return _scanned(path, scan, len(data))
        return _pure(path, data)


def _pure(path: str, data: bytes) -> RawTrace:
    """The pure-Python path: msgspec splits the top level and the events, undecoded."""
    first = _FIRST_NON_SPACE.search(data)
    if first is None:
        raise TraceFormatError(path, "empty file, expected a JSON trace")
    with gc_paused(), _json_errors(path):
        if first.group() == b"[":
            top: dict[str, Any] = {}
            events_text: bytes | msgspec.Raw = data
        else:
            top = _TOP.decode(data)
            if "traceEvents" not in top:
                raise TraceFormatError(path, "JSON has no 'traceEvents' list: not a trace")
            events_text = top.pop("traceEvents")
        raw_events = _split_events(path, events_text)
        meta = {k: _ANY.decode(v) for k, v in top.items()}
    return _checked(
        RawTrace(
            path=path,
            events_text=events_text,
            meta=meta,
            json_bytes=len(data),
            _raw_events=raw_events,
        )
    )


# A text larger than this is read by two scanners at once (kineto_split_scan) where there
# are two CPUs: below it the second thread and the merge cost more than they save.
SPLIT_ABOVE_BYTES = 16 << 20


def worth_splitting(text_bytes: int) -> bool:
    return text_bytes > SPLIT_ABOVE_BYTES and two_cpus()


def read_trace(path: str) -> RawTrace:
    """A trace file read as a stream: gunzipped piece by piece in a thread while the C
    scanner reads the pieces into columns, so the whole text is never held (memory grows
    with the columns, about a sixth of the text); past SPLIT_ABOVE_BYTES two scanners read
    it (kineto_split_scan), one where they decline. Where the scanner is off or declines,
    the pure-Python path reads the whole text."""
    with gc_paused():
        if scanner_available():
            from tessera_tb.importers import kineto_stream

            text_bytes = kineto_stream.text_bytes_estimate(path)
            if worth_splitting(text_bytes):
                from tessera_tb.importers import kineto_split_scan

                split = kineto_split_scan.scan_split(
                    _prefetched(iter_text(path)), _kineto_scan, text_bytes
                )
                if split is not None:
                    return _scanned(path, *split)
            # A text of one piece has nothing to read ahead: no thread for it.
            pieces = iter_text(path)
            if text_bytes > FIRST_TEXT_CHUNK:
                pieces = _prefetched(pieces)
            try:
                scan, size = _scan(pieces)
            finally:
                pieces.close()  # a scanner that declined leaves it unfinished: stop its thread
            if scan is not None:
                return _scanned(path, scan, size)
    return _pure(path, read_bytes(path))
