"""A trace's text scanned by two scanners at once (kineto_split_scan) gives one scanner's
columns byte for byte, on every shared trace, whatever the piece and run sizes; a boundary
inside an event or damage in a run makes it decline, and the import then reads the file
with one scanner, to the same run or the same error."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from tessera_tb.importers import kineto_decode, kineto_split_scan
from tessera_tb.importers.kineto_import import import_traces
from tessera_tb.trace.errors import TraceFormatError
from tests.conftest import (
    SHARED_TRACES,
    assert_same_files,
    live_threads,
    needs_scanner,
    shared_trace_files,
    trace_id,
)
from tests.importers.test_parallel_import import _run_files

pytestmark = needs_scanner()

DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")
STACK = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
SCAN = kineto_decode._kineto_scan
SCAN_EVENT_COLUMNS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id_val", "id_sid")


def _text(path: str) -> bytes:
    return b"".join(kineto_decode.iter_text(path))


def _pieces(text: bytes, size: int) -> list[bytes]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _one_scanner(text: bytes) -> dict:
    scanner = SCAN.Scanner()
    scanner.feed(text)
    return scanner.finish()


def _assert_same_columns(got: dict, want: dict) -> None:
    for key, value in want.items():
        if key == "events_range":  # byte offsets of the list: not read by the importer
            continue
        g = got[key]
        if isinstance(value, (list, int)):
            assert g == value, key
        else:
            g = g.tobytes() if isinstance(g, np.ndarray) else bytes(g)
            assert g == bytes(value), key


@pytest.fixture
def small_runs(monkeypatch):
    monkeypatch.setattr(kineto_split_scan, "RUN_BYTES", 16 << 10)
    monkeypatch.setattr(kineto_split_scan, "TAIL_BYTES", 16 << 10)


@pytest.mark.parametrize("piece", [7001, 65536])
@pytest.mark.parametrize("path", shared_trace_files(), ids=trace_id)
def test_two_scanners_give_one_scanners_columns(path, piece, small_runs):
    text = _text(path)
    want = _one_scanner(text)
    for text_bytes in (None, len(text)):
        got = kineto_split_scan.scan_split(_pieces(text, piece), SCAN, text_bytes)
        if got is None:
            # Only a text too short for a run of B between its first piece and its tail.
            assert len(text) < 4 * piece + (16 << 10), (text_bytes, len(text))
            continue
        columns, size = got
        assert size == len(text)
        _assert_same_columns(columns, want)


def test_every_run_is_read_by_b_and_put_back_in_order(small_runs, monkeypatch):
    text = _text(_files(DDP)[0])
    runs = []
    merged = kineto_split_scan._merged

    def spy(order, a, b, scanner_module):
        runs.append((order.count("a"), order.count("b"), len(b.batches)))
        return merged(order, a, b, scanner_module)

    monkeypatch.setattr(kineto_split_scan, "_merged", spy)
    got, _ = kineto_split_scan.scan_split(_pieces(text, 40_000), SCAN, len(text))
    (a_cuts, b_runs, b_batches) = runs[0]
    # A ~5 MB text in 40 kB pieces: dozens of runs, each B's, each followed by one of A's.
    assert b_runs > 20 and b_batches == b_runs and a_cuts == b_runs
    _assert_same_columns(got, _one_scanner(text))


def _fed(monkeypatch) -> dict[str, int]:
    """Bytes of text each side is fed (the "[" and "," that open B's runs left out)."""
    fed = {"tessera-scan-a": 0, "tessera-scan-b": 0}
    put = kineto_split_scan._Side.put

    def spy(self, *op):
        if op[0] == "feed" and not isinstance(op[1], bytes):  # not the b"[" or b","
            fed[self._thread.name] += len(op[1])
        return put(self, *op)

    monkeypatch.setattr(kineto_split_scan._Side, "put", spy)
    return fed


@pytest.mark.parametrize("piece", [40_000, 1_000_000])
def test_each_scanner_reads_about_half_of_the_text(small_runs, monkeypatch, piece):
    """Turns are taken wherever the pieces end (several in one large piece), and A's count
    takes in the tail it reads alone: each side reads about half of the text."""
    monkeypatch.setattr(kineto_split_scan, "TAIL_BYTES", 1 << 20)  # a fifth of the text
    text = _text(_files(DDP)[0])
    fed = _fed(monkeypatch)
    got, _ = kineto_split_scan.scan_split(_pieces(text, piece), SCAN, len(text))
    a, b = fed["tessera-scan-a"], fed["tessera-scan-b"]
    # No run dropped and read again (the separators where B hands back are read by neither).
    assert 0.999 * len(text) < a + b <= len(text)
    assert abs(a - b) < 0.05 * len(text), (a, b)
    _assert_same_columns(got, _one_scanner(text))


def test_no_run_starts_or_ends_in_the_tail(small_runs, monkeypatch):
    """Members after the events list holding lists of objects (commas, newlines and braces
    that look like boundaries) are read by A: with the text's size known, no run reaches
    into its last TAIL_BYTES, so the split is not declined there. The list's last event is
    long (100 kB): no boundary follows it before the tail, and B must not look for one in
    the tail."""
    text = _text(_files(DDP)[0])
    end = text.rindex(b"]")  # the events list's end ("traceName" and others follow)
    long_event = b',\n{"ph": "i", "name": "' + b"x" * 100_000 + b'"}\n'
    members = b",\n".join(b'{"k": %d, "v": [1, 2]}' % i for i in range(400))
    text = text[:end] + long_event + b'], "after": [\n' + members + b"\n]" + text[end + 1 :]
    end += len(long_event)
    assert 8 << 10 < len(text) - end < 16 << 10  # inside the tail, longer than a piece
    fed = _fed(monkeypatch)
    got, _ = kineto_split_scan.scan_split(_pieces(text, 7001), SCAN, len(text))
    assert fed["tessera-scan-b"] > 0.4 * len(text)
    _assert_same_columns(got, _one_scanner(text))


def test_b_hands_back_before_the_tail_or_reads_on():
    """Where no boundary lies between B's place and the tail, B reads on (its run is then
    dropped at the end and read by A), rather than hand back in the tail; A starts no run
    with less than RUN_BYTES before the tail."""
    run = kineto_split_scan.RUN_BYTES
    piece = b'{"ph": "X"},\n{"name": "' + b"y" * 5000 + b'"},\n{"ph": "X"}'
    start = 1 << 20  # not the first piece
    tail_at = 3000  # inside the long event: its end, and the boundary after it, are in the tail
    last = start + tail_at
    assert kineto_split_scan._handover(piece, start, 0, 0, last, True).start() == 11
    assert kineto_split_scan._handover(piece, start, 20, 0, last, True) is None
    assert kineto_split_scan._handover(piece, start, 20, 0, None, True).start() > tail_at
    # A: the boundary at 11 (its brace at 13) is RUN_BYTES before the tail or it is not taken
    assert kineto_split_scan._handover(piece, start, 0, 0, start + run + 14, False).start() == 11
    assert kineto_split_scan._handover(piece, start, 0, 0, start + run + 13, False) is None
    assert kineto_split_scan._handover(piece, 0, 0, 0, None, False) is None  # the first piece


def _nested_trace(path: str, tmp_path) -> str:
    """A real trace written one value per line, every event's args holding a list whose
    second item is an object: a comma, a newline and a brace inside events, everywhere."""
    trace = json.loads(_text(path))
    for e in trace["traceEvents"]:
        e.setdefault("args", {})["nested"] = [0, {"k": 1}]
    out = tmp_path / "nested.pt.trace.json"
    out.write_text(json.dumps(trace, indent=1))
    return str(out)


def test_a_boundary_inside_an_event_is_declined(tmp_path, small_runs):
    text = _text(_nested_trace(_files(STACK)[0], tmp_path))
    assert kineto_split_scan.scan_split(_pieces(text, 50_000), SCAN, len(text)) is None


@pytest.fixture
def split_small(monkeypatch, small_runs):
    """read_trace splits every text, read in small pieces; `calls` records each split's
    outcome (True: merged columns used, False: declined, "raised": an error went through)."""
    monkeypatch.setattr(kineto_decode, "SPLIT_ABOVE_BYTES", 0)
    monkeypatch.setattr(kineto_decode, "READ_CHUNK", 8 << 10)
    monkeypatch.setattr(kineto_decode, "TEXT_CHUNK", 48 << 10)
    calls = []
    real = kineto_split_scan.scan_split

    def spy(*args):
        calls.append("raised")
        result = real(*args)
        calls[-1] = result is not None
        return result

    monkeypatch.setattr(kineto_split_scan, "scan_split", spy)
    return calls


def _files(directory: str) -> list[str]:
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if ".pt.trace" in f)


def test_import_with_two_scanners_writes_the_same_run(tmp_path, split_small, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(kineto_decode, "worth_splitting", lambda _size: False)
        one = _run_files(import_traces([DDP, STACK], str(tmp_path / "a"), "r", jobs=1).run_dir)
    assert split_small == []
    two = _run_files(import_traces([DDP, STACK], str(tmp_path / "b"), "r", jobs=1).run_dir)
    assert split_small == [True, True, True]  # each file's columns came from two scanners
    assert_same_files(two, one)


def test_a_declined_split_reads_the_file_with_one_scanner(tmp_path, split_small):
    path = _nested_trace(_files(STACK)[0], tmp_path)
    got = kineto_decode.read_trace(path)
    assert split_small == [False]
    want = _one_scanner(_text(path))
    _assert_same_columns(got.scan, want)


def _damaged_in_the_middle(tmp_path) -> str:
    text = bytearray(_text(_files(DDP)[0]))
    at = text.index(b'"ph"', len(text) // 2)
    text[at + 4] = ord(";")  # '"ph";' : not JSON, half-way through the events
    out = tmp_path / "damaged.pt.trace.json.gz"
    out.write_bytes(gzip.compress(bytes(text)))
    return str(out)


def test_damage_in_the_middle_gives_the_one_scanner_error(tmp_path, split_small, monkeypatch):
    path = _damaged_in_the_middle(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(kineto_decode, "worth_splitting", lambda _size: False)
        with pytest.raises(TraceFormatError) as one:
            kineto_decode.read_trace(path)
    threads = live_threads()
    with pytest.raises(TraceFormatError) as two:
        kineto_decode.read_trace(path)
    assert split_small == [False]  # the split declined at the damage; one scanner named it
    assert str(two.value) == str(one.value) and path in str(two.value)
    assert live_threads() == threads  # the scanners' threads are gone


def test_a_truncated_gzip_fails_naming_the_file_and_leaves_no_thread(tmp_path, split_small):
    data = open(_files(DDP)[0], "rb").read()
    path = tmp_path / "cut.pt.trace.json.gz"
    path.write_bytes(data[: len(data) // 2])
    threads = live_threads()
    with pytest.raises(TraceFormatError, match="truncated gzip") as err:
        kineto_decode.read_trace(str(path))
    assert str(path) in str(err.value)
    assert split_small == ["raised"]  # met while the two scanners were reading
    assert live_threads() == threads


def test_a_grouped_take_holds_the_ungrouped_takes_arguments_by_key():
    """take(n, True) gives what take(n) gives, its arguments grouped by key (event order kept
    within a key), arg_key_start in place of arg_key: checked batch by batch on a real trace,
    two scanners fed the same pieces."""
    (path,) = [p for p in shared_trace_files() if p.startswith(STACK + os.sep)]
    text = _text(path)
    plain, grouped = SCAN.Scanner(), SCAN.Scanner()
    batches = 0
    # Pieces that end between two events, where a take is allowed.
    cuts = [0]
    while (m := kineto_split_scan._BOUNDARY.search(text, cuts[-1] + 200_000)) is not None:
        cuts.append(m.end())
    for a, b in zip(cuts, cuts[1:]):
        assert plain.feed(text[a:b]) == grouped.feed(text[a:b]) == 0
        want, got = plain.take(0), grouped.take(0, True)
        assert "arg_key" not in got and "arg_key" in want
        for key in ("first", "n", "strings", "arg_key_sid", *SCAN_EVENT_COLUMNS):
            assert got[key] == want[key], key
        keys = np.frombuffer(want["arg_key"], dtype=np.int32)
        order = np.argsort(keys, kind="stable")
        for key, dtype in (("arg_ev", np.int32), ("arg_type", np.uint8), ("arg_val", np.int64)):
            np.testing.assert_array_equal(
                np.frombuffer(got[key], dtype=dtype), np.frombuffer(want[key], dtype=dtype)[order]
            )
        n_keys = len(want["arg_key_sid"]) // 4
        starts = np.frombuffer(got["arg_key_start"], dtype=np.int64)
        assert starts.tolist() == [0, *np.cumsum(np.bincount(keys, minlength=n_keys)).tolist()]
        batches += bool(keys.size)
    assert batches >= 3


def test_place_args_puts_each_keys_arguments_at_its_place_and_refuses_bad_numbers():
    """The merge's C pass: two keys of a batch (the second key's arguments first in the
    merged columns), event numbers shifted, string values renumbered, others kept; numbers
    out of range raise ValueError instead of writing past an end."""
    starts = np.array([0, 2, 3], dtype=np.int64)  # key 0: arguments 0-1, key 1: argument 2
    ev = np.array([0, 4, 1], dtype=np.int32)
    types = np.array([SCAN.T_STR, 3, SCAN.T_RAW], dtype=np.uint8)  # a string, an int, a raw
    values = np.array([1, -7, 0], dtype=np.int64)
    ids = np.array([10, 11], dtype=np.int32)
    key_ids = np.array([1, 0], dtype=np.int32)  # batch key 0 is merged key 1, and 1 is 0
    dest = np.array([0, 1], dtype=np.int64)
    out = np.zeros(3, np.int32), np.zeros(3, np.uint8), np.zeros(3, np.int64)
    SCAN.place_args(starts, ev, types, values, ids, key_ids, dest, 100, *out)
    assert out[0].tolist() == [101, 100, 104]
    assert out[1].tolist() == [SCAN.T_RAW, SCAN.T_STR, 3]
    assert out[2].tolist() == [10, 11, -7]
    bad = {
        "string": (values.copy(), ids[:1], key_ids, dest),  # string id 1 of a table of 1
        "key": (values, ids, np.array([5, 0], dtype=np.int32), dest),
        "place": (values, ids, key_ids, np.array([0, 2], dtype=np.int64)),  # 2 + 2 > 3
    }
    for v, i, k, d in bad.values():
        with pytest.raises(ValueError, match="out of range"):
            SCAN.place_args(starts, ev, types, v, i, k, d, 0, *out)
