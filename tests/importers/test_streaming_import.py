"""Import reads a trace as a stream: gunzipped and scanned piece by piece, never the whole
text at once. Cutting the text anywhere changes nothing: the scanner's columns equal a
whole-text scan's on every shared trace, and an imported run is the same byte for byte.
Damage in the middle of a large file fails the import and leaves nothing behind."""

from __future__ import annotations

import gzip
import os
import re
import threading

import pytest

from tessera_tb.importers import kineto_decode, kineto_import
from tessera_tb.trace.errors import TraceFormatError
from tests.conftest import (
    SHARED_TRACES,
    assert_same_files,
    file_contents,
    needs_scanner,
    shared_trace_files,
    trace_id,
)

pytestmark = needs_scanner()

DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")


def _small_pieces(monkeypatch, read: int = 4093, text: int = 8191) -> None:
    """Odd piece sizes: cuts fall inside strings, numbers, escapes and keys."""
    monkeypatch.setattr(kineto_decode, "READ_CHUNK", read)
    monkeypatch.setattr(kineto_decode, "TEXT_CHUNK", text)


def _same_columns(a: dict, b: dict) -> None:
    assert a["strings"] == b["strings"]  # the same ids, in the same order
    for key in a:
        if key in ("strings", "top", "top_text"):
            continue
        if isinstance(a[key], (int, tuple, list)):
            assert a[key] == b[key], key
        else:  # bytearrays, or numpy arrays where two scanners read the text
            assert bytes(a[key]) == bytes(b[key]), key


def test_a_text_of_one_piece_is_read_without_a_thread(monkeypatch, started_threads):
    """A text no longer than the first piece (the two small shared traces) is read in the
    calling thread, to the same columns as the whole-text scan; a longer one (below the
    split) is read ahead in one thread."""
    monkeypatch.setenv("TESSERA_PURE_PYTHON", "0")
    small = [p for p in shared_trace_files() if len(kineto_decode.read_bytes(p)) <= (1 << 20)]
    assert len(small) >= 2
    for path in small:
        trace = kineto_decode.read_trace(path)
        _same_columns(
            trace.scan, kineto_decode._kineto_scan.scan_events(kineto_decode.read_bytes(path))
        )
    assert started_threads == []
    sizes = {p: len(kineto_decode.read_bytes(p)) for p in shared_trace_files()}
    kineto_decode.read_trace(next(p for p, n in sizes.items() if (1 << 20) < n < (16 << 20)))
    assert started_threads == ["tessera-gunzip"]


@pytest.mark.parametrize("path", shared_trace_files(), ids=trace_id)
def test_streamed_scan_equals_the_whole_text_scan(path, monkeypatch):
    monkeypatch.setenv("TESSERA_PURE_PYTHON", "0")
    text = kineto_decode.read_bytes(path)
    whole = kineto_decode._kineto_scan.scan_events(text)
    _small_pieces(monkeypatch)
    pieces = list(kineto_decode.iter_text(path))
    assert len(pieces) > 1 and max(map(len, pieces)) <= 8191 and b"".join(pieces) == text
    trace = kineto_decode.read_trace(path)
    assert trace.scan is not None and trace.json_bytes == len(text)
    _same_columns(trace.scan, whole)
    assert trace.meta == kineto_decode._pure(path, text).meta
    # Window 0: every event is read at once, and the one a piece's end cuts is undone.
    scanner = kineto_decode._kineto_scan.Scanner(window=0)
    for piece in pieces:
        scanner.feed(piece)
    _same_columns(scanner.finish(), whole)


def test_the_scanner_keeps_only_the_cut_event_between_pieces():
    path = os.path.join(DDP, sorted(os.listdir(DDP))[-1])
    text = gzip.decompress(open(path, "rb").read())
    scanner = kineto_decode._kineto_scan.Scanner()
    kept = [scanner.feed(text[i : i + 65536]) for i in range(0, len(text), 65536)]
    longest_event = 8192  # these traces' events are a few hundred bytes, at most a few KB
    assert 0 < max(kept) < longest_event
    _same_columns(scanner.finish(), kineto_decode._kineto_scan.scan_events(text))


def test_pieces_larger_than_the_join_are_read_in_place_with_the_same_columns():
    """Pieces of 100 KB to 1.5 MB: the scanner joins only a piece's first bytes (twice the
    window, at least 64 KiB) to the cut unit it keeps, and reads the rest of the piece where
    it lies. In a copy with events of 200 KB (a long name) spread through the text, a cut
    unit outlasts the join and the whole piece is joined instead (until the window has grown
    past the pieces). Both texts, with every window: the columns of one pass."""
    import random

    scan = kineto_decode._kineto_scan
    rng = random.Random(20261126)
    path = os.path.join(DDP, sorted(f for f in os.listdir(DDP) if f.endswith(".gz"))[0])
    plain = gzip.decompress(open(path, "rb").read())
    starts = [m.start() for m in re.finditer(rb"\n  \{", plain)]
    event = b'\n  {"ph": "i", "name": "' + b"x" * 200_000 + b'", "ts": 1, "pid": 1, "tid": 1},'
    with_long = plain
    for at in sorted(rng.sample(starts[10:-10], 6), reverse=True):
        with_long = with_long[:at] + event + with_long[at:]
    for text in (plain, with_long):
        whole = scan.scan_events(text)
        for window in (0, 300, 64 << 10, 1 << 20):
            scanner = scan.Scanner(window=window)
            i = 0
            while i < len(text):
                n = rng.randrange(100_000, 1_500_000)
                scanner.feed(text[i : i + n])
                i += n
            _same_columns(scanner.finish(), whole)
    # The first long event cut by a piece's end, 150 KB of it still to come: more than the
    # next piece's join (64 KiB), so that piece is joined whole.
    at = next(a for a in starts if a > 250_000)
    cut = plain[:at] + event + plain[at:]
    scanner = scan.Scanner(window=300)
    kept = [scanner.feed(cut[i : i + 300_000]) for i in range(0, len(cut), 300_000)]
    assert kept[0] > 40_000 and kept[1] < 40_000  # the long event cut, then read
    _same_columns(scanner.finish(), scan.scan_events(cut))


def test_a_run_imported_in_small_pieces_is_the_same_byte_for_byte(tmp_path, monkeypatch):
    kineto_import.import_traces([DDP], str(tmp_path / "a"), "run")
    _small_pieces(monkeypatch)
    kineto_import.import_traces([DDP], str(tmp_path / "b"), "run")
    a, b = file_contents(tmp_path / "a" / "run"), file_contents(tmp_path / "b" / "run")
    # TensorBoard's event files are named by the wall clock; the run's own files are not.
    a, b = ({k: v for k, v in d.items() if "tfevents" not in k} for d in (a, b))
    assert len(a) > 4
    assert_same_files(a, b)


def _big_gzip(copies: int = 12) -> tuple[bytes, bytes]:
    """A valid trace of many MB (the DDP rank's events repeated), gzipped: (text, file)."""
    path = os.path.join(DDP, sorted(f for f in os.listdir(DDP) if f.endswith(".gz"))[0])
    text = gzip.decompress(open(path, "rb").read())
    head, sep, rest = text.partition(b'"traceEvents": [')
    events, close, tail = rest.rpartition(b"]")
    events = events.strip().rstrip(b",")
    big = head + sep + b",\n".join([events] * copies) + close + tail
    return big, gzip.compress(big, compresslevel=1)


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damage_in_the_middle_of_a_large_stream_leaves_nothing(damage, tmp_path, monkeypatch):
    # The whole-file reader (test_bounded_import.py covers the bounded-memory one).
    monkeypatch.setenv("TESSERA_IMPORT_STREAM", "never")
    text, packed = _big_gzip()
    assert len(text) > 50e6
    if damage == "truncated":
        packed = packed[: len(packed) * 2 // 3]
    else:  # bytes changed two thirds in: the deflate data or its CRC check fails there
        at = len(packed) * 2 // 3
        packed = packed[:at] + bytes(b ^ 0x5A for b in packed[at : at + 64]) + packed[at + 64 :]
    traces = tmp_path / "traces"
    traces.mkdir()
    bad = traces / "rank0.1.pt.trace.json.gz"
    bad.write_bytes(packed)
    logdir = tmp_path / "logdir"
    kineto_import.import_traces([DDP], str(logdir), "run")  # an existing run to keep
    before = file_contents(logdir / "run")
    seen = []
    real_text = kineto_decode.iter_text

    def counting(path):  # the pieces read, by one scanner or two
        for piece in real_text(path):
            seen.append(len(piece))
            yield piece

    monkeypatch.setattr(kineto_decode, "iter_text", counting)
    with pytest.raises(kineto_import.ImportFailed) as err:
        kineto_import.import_traces([str(bad)], str(logdir), "run", overwrite=True)
    message = str(err.value)
    assert str(bad) in message and "\n" not in message
    assert ("truncated gzip" in message) if damage == "truncated" else ("corrupt gzip" in message)
    # It failed in the middle: many pieces were scanned before the damage was met.
    assert sum(seen) > len(text) / 3
    assert_same_files(file_contents(logdir / "run"), before)
    assert sorted(os.listdir(logdir)) == ["run"]
    # The gunzip thread stopped with the import.
    assert not [t for t in threading.enumerate() if t.name == "tessera-gunzip"]


def test_multi_member_gzip_and_zero_padding_read_as_one_text(tmp_path, monkeypatch):
    path = os.path.join(DDP, sorted(f for f in os.listdir(DDP) if f.endswith(".gz"))[0])
    text = gzip.decompress(open(path, "rb").read())
    third = len(text) // 3
    packed = b"".join(gzip.compress(text[i : i + third]) for i in range(0, len(text), third))
    f = tmp_path / "rank0.1.pt.trace.json.gz"
    f.write_bytes(packed + b"\0" * 1000)
    _small_pieces(monkeypatch)
    assert b"".join(kineto_decode.iter_text(str(f))) == text
    trace = kineto_decode.read_trace(str(f))
    assert trace.scan is not None
    _same_columns(trace.scan, kineto_decode._kineto_scan.scan_events(text))


@pytest.mark.parametrize("inflate", ["isal", "zlib"])
def test_either_inflate_reads_members_and_padding_and_names_damage(tmp_path, monkeypatch, inflate):
    """ISA-L's IgzipDecompressor where isal is installed, zlib's (behind the same interface)
    where it is not: the same text from several members and zero padding, and the same
    errors for a member's damaged checksum, a cut last member and data after the padding."""
    if inflate == "zlib":
        monkeypatch.setattr(kineto_decode, "igzip_lib", None)
    member = kineto_decode._gzip_member()
    assert type(member).__name__ == ("IgzipDecompressor" if inflate == "isal" else "_ZlibMember")
    path = os.path.join(DDP, sorted(f for f in os.listdir(DDP) if f.endswith(".gz"))[0])
    text = gzip.decompress(open(path, "rb").read())
    half = len(text) // 2
    first, second = gzip.compress(text[:half]), gzip.compress(text[half:])
    _small_pieces(monkeypatch)
    f = tmp_path / "rank0.1.pt.trace.json.gz"

    def read(packed: bytes) -> bytes:
        f.write_bytes(packed)
        return b"".join(kineto_decode.iter_text(str(f)))

    assert read(first + second + b"\0" * 5000) == text
    damaged = bytearray(first + second)
    damaged[len(first) - 8] ^= 0xFF  # the first member's CRC
    with pytest.raises(TraceFormatError, match="corrupt gzip"):
        read(bytes(damaged))
    with pytest.raises(TraceFormatError, match="truncated gzip"):
        read(first + second[:-5])
    with pytest.raises(TraceFormatError, match="corrupt gzip"):
        read(first + b"\0" * 5000 + b"x")


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"   ",
        b'{"schemaVersion": 1}',
        b'{"traceEvents": [{"ph": "X"}]',
        b'{"traceEvents": [{"ph": "X"}], "a": [1, 2}',
        b'{"traceEvents": []} []',
        b'[{"ph": "X"}, ',
        b'{"traceEvents": [{"ph": "X", "args": {"a": 1, "a": 2}}]}',
    ],
)
def test_the_streamed_scanner_declines_what_the_whole_text_scan_declines(text):
    scan = kineto_decode._kineto_scan
    with pytest.raises(scan.Unsupported):
        scan.scan_events(text)
    scanner = scan.Scanner()
    with pytest.raises(scan.Unsupported):
        for i in range(len(text)):
            scanner.feed(text[i : i + 1])
        scanner.finish()


def test_streamed_and_whole_text_scans_agree_on_damaged_real_text():
    """Real text with bytes changed or cut, fed in random pieces: both scans decline, or
    both read the same columns."""
    import random

    scan = kineto_decode._kineto_scan
    rng = random.Random(20261125)
    path = os.path.join(DDP, sorted(f for f in os.listdir(DDP) if f.endswith(".gz"))[0])
    text = gzip.decompress(open(path, "rb").read())
    outcomes = {"same": 0, "declined": 0}
    for _ in range(150):
        start = text.index(b"\n  {", rng.randrange(len(text) // 2))  # Kineto's event starts
        events = text[start : start + 20000]
        events = events[: events.rindex(b"\n  }") + 4]
        damaged = bytearray(b'{"traceEvents": [' + events + b"]}")
        for _ in range(rng.randrange(0, 3)):
            pos = rng.randrange(len(damaged))
            damaged[pos] = rng.choice(b'{}[]",:\\0123456789.eE-+tfnu \n')
        damaged = bytes(damaged)
        try:
            whole = scan.scan_events(damaged)
        except scan.Unsupported:
            whole = None
        scanner = scan.Scanner(window=rng.choice([0, 300, 1 << 20]))
        try:
            i = 0
            while i < len(damaged):
                n = rng.randrange(1, 700)
                scanner.feed(damaged[i : i + n])
                i += n
            streamed = scanner.finish()
        except scan.Unsupported:
            streamed = None
        assert (whole is None) == (streamed is None)
        if whole is None:
            outcomes["declined"] += 1
        else:
            _same_columns(streamed, whole)
            outcomes["same"] += 1
    assert outcomes["same"] > 10 and outcomes["declined"] > 5
