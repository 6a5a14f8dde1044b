"""One trace file's text scanned by two C scanners at once, on two CPUs.

The text arrives in pieces (`kineto_decode.iter_text`). Scanner A reads the text from its
start; in every other piece, between two event boundaries, a run of events goes to scanner
B instead, as a bare list of its own. A boundary is found by a pattern (a comma, a newline
and an opening brace: JSON strings hold no raw newline) and proven by the scanners
themselves: A, fed the text up to it, must hold no cut event (`feed` returns 0 kept bytes),
and B, fed the run, must end at an event's end with nothing kept. Where a proof fails, or a
scanner declines anything, the caller scans the file again with one scanner, which then
gives its own result or its own error; nothing here decides what a trace means.

The two scanners' batches (`Scanner.take`) are put back in text order: string ids and
argument-key numbers are renumbered in first-use order, the order one scanner gives them
(a string or key first used in a run of B is new to B there too, and is listed among B's
new ones in the order of its first use), so the merged columns equal one scanner's
`finish()`, byte for byte (tested on every shared trace).
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tessera_tb.importers.background import release_freed_memory
from tessera_tb.importers.kineto_stream import _COLUMN_TYPES, _EVENT_COLUMNS

# A and B take turns: each reads on until it is this far ahead of the other (in bytes of
# text read in all).
RUN_BYTES = 1 << 20
# No run starts this close to the end of the text (where the members after the list are).
TAIL_BYTES = 4 << 20
_BOUNDARY = re.compile(rb",[ \t\r]*\n[ \t\r\n]*(?=\{)")
_STRING_COLUMNS = ("ph", "cat", "name", "pid", "tid")
_ARG_COLUMNS = ("arg_ev", "arg_type", "arg_val")


class _Side:
    """One scanner in a thread of its own, running the operations queued for it in order:
    ("feed", bytes-like, run), ("cut", run): take() where nothing is kept, ("finish", None).
    `run` numbers B's runs, so that the ops of a dropped one are skipped."""

    def __init__(self, scanner_module, name: str) -> None:
        self.scanner = scanner_module.Scanner()
        self.unsupported = scanner_module.Unsupported
        self.ops: queue.Queue = queue.Queue(maxsize=8)
        self.batches: list[dict[str, Any]] = []
        self.rest: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.declined = False
        self.dropped_run: int | None = None  # ops of this run (their last item) are skipped
        self._kept = 0
        self.taken_strings = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            op = self.ops.get()
            try:
                if op is None:
                    return
                dropped = self.dropped_run is not None and op[-1] == self.dropped_run
                if not (self.declined or dropped or self.error is not None):
                    self._do(op)
            finally:
                self.ops.task_done()

    def _do(self, op: tuple) -> None:
        try:
            if op[0] == "feed":
                self._kept = self.scanner.feed(op[1])
            elif op[0] == "cut":
                if self._kept:
                    self.declined = True  # the boundary is inside an event
                    return
                batch = self.scanner.take(self.taken_strings, True)  # arguments by key
                self.taken_strings += len(batch["strings"])
                self.batches.append(batch)
            else:  # finish
                self.rest = self.scanner.finish()
        except self.unsupported:
            self.declined = True
        except BaseException as exc:  # raised in the caller's thread
            self.error = exc

    def put(self, *op) -> None:
        self.ops.put(op)

    def close(self) -> None:
        self.ops.put(None)
        self._thread.join()


def scan_split(
    pieces: Iterable[bytes], scanner_module, text_bytes: int | None = None
) -> tuple[dict[str, Any], int] | None:
    """The columns of the text given in `pieces`, as one scanner's `finish()` gives them
    (plus `top_text`), and the text's length; None where the caller must scan the text
    with one scanner instead (a boundary not proven, a scanner declining, no run for B).
    Errors of reading the pieces are raised as they come. `text_bytes`: the text's expected
    size, when known: no run starts or ends in its last TAIL_BYTES (the members after the
    events list hold lists of objects, whose commas look like boundaries).

    A reads the first piece (where the members before the events list are); from there on
    A and B take turns, wherever the pieces end: each reads on until it has read RUN_BYTES
    more than the other in all (A's count taking in the tail, which it reads alone at the
    end), and hands over at the next boundary. So each reads about half of the text, at
    once. A run the text ends in is read by A instead (A stopped at its start, and B's
    reading of it is dropped), so A always reads the end of the list and the members after
    it."""
    a = _Side(scanner_module, "tessera-scan-a")
    b = _Side(scanner_module, "tessera-scan-b")
    order: list[str] = []  # which side each batch came from, in text order
    b_runs = 0  # B's runs cut so far (the number of the open one)
    size = a_bytes = b_bytes = 0
    run: list[memoryview] | None = None  # the text of B's open run (B reads now)
    budget = RUN_BYTES  # what the side reading now reads before it hands over
    last = None if text_bytes is None else text_bytes - TAIL_BYTES
    tail = 0 if text_bytes is None else TAIL_BYTES  # read by A alone at the end, counted ahead
    try:
        for piece in pieces:
            start = size
            size += len(piece)
            view = memoryview(piece)
            pos = 0
            while pos < len(piece):
                m = _handover(piece, start, pos, budget, last, run is not None)
                if m is None:  # the side reading now reads the rest of the piece
                    if run is None:
                        a.put("feed", view[pos:], None)
                        a_bytes += len(piece) - pos
                    else:
                        run.append(view[pos:])
                        b.put("feed", run[-1], b_runs)
                        b_bytes += len(piece) - pos
                    budget -= len(piece) - pos
                    break
                if run is None:  # A hands over: it reads up to the event, B from it on
                    a.put("feed", view[pos : m.end()], None)
                    a.put("cut", None)
                    order.append("a")
                    a_bytes += m.end() - pos
                    run = []
                    b.put("feed", b"," if b_runs else b"[", b_runs)
                    budget = a_bytes + tail - b_bytes + RUN_BYTES
                else:  # B hands back: it ends with an event, A reads on from the next
                    run.append(view[pos : m.start()])
                    b.put("feed", run[-1], b_runs)
                    b.put("cut", b_runs)
                    order.append("b")
                    b_bytes += m.start() - pos
                    b_runs += 1
                    run = None
                    budget = b_bytes - (a_bytes + tail) + RUN_BYTES
                pos = m.end()
            # B declining with no run open failed on a finished run; in an open one it may
            # be the run the text ends in (then dropped), so reading goes on.
            if a.error or b.error or a.declined or (b.declined and run is None):
                break
        else:
            if run is not None:  # the text ends in B's run: A reads it, B's reading is dropped
                b.dropped_run = b_runs
                for v in run:
                    a.put("feed", v, None)
            a.put("finish", None)
    finally:
        a.close()
        b.close()
    for side in (a, b):
        if side.error is not None:
            raise side.error
    if a.declined or a.rest is None or not b_runs:
        return None
    if b.declined and len(b.batches) < b_runs:
        return None  # B could not read one of its runs
    return _merged(order, a, b, scanner_module), size


def _handover(piece: bytes, start: int, pos: int, budget: int, last: int | None, b_reads: bool):
    """The boundary in `piece` (which starts at byte `start` of the text) where the side
    reading from `pos` on hands over, or None: the first one `budget` bytes on or later.
    None in the first piece. A run neither starts nor ends past `last` (the tail): A starts
    none with less than RUN_BYTES before it, and B hands back before it (or reads on)."""
    if not start:
        return None
    at = pos + max(budget, 0)
    stop = len(piece)
    if last is not None:
        room = last - start  # the tail starts at piece[room]
        if b_reads:
            at = max(pos, min(at, room - (64 << 10)))
            stop = min(stop, room)
        else:
            stop = min(stop, room - RUN_BYTES)
    if at >= stop:
        return None
    return _BOUNDARY.search(piece, at, stop)


class _Renumber:
    """Ids of one side's strings and argument keys in the merged (text-order) numbering."""

    def __init__(self) -> None:
        self.string_ids = np.zeros(0, dtype=np.int32)
        self.key_ids = np.zeros(0, dtype=np.int32)


def _numbered(values: list, index: dict, table: list) -> np.ndarray:
    """The merged number of each value: its index in `table`, where it is appended (and
    `index` notes it) when first seen."""
    out = np.empty(len(values), dtype=np.int32)
    for i, value in enumerate(values):
        number = index.get(value)
        if number is None:
            number = index[value] = len(table)
            table.append(value)
        out[i] = number
    return out


def _merged(order: list[str], a: _Side, b: _Side, scanner_module) -> dict[str, Any]:
    """One scanner's finish() columns from the two sides' batches. The output arrays are
    made whole first and filled batch by batch, each batch dropped once copied, so memory
    holds the columns about once, not the batches and their concatenation."""
    batches: list = []
    taken = {"a": iter(a.batches), "b": iter(b.batches)}
    for who in order:
        batches.append((who, next(taken[who])))
    # What came after A's last take, from finish(): in take()'s grouped shape.
    a_taken = sum(int(x["n"]) for x in a.batches)
    rest = {
        **a.rest,
        "first": a_taken,
        "n": len(a.rest["ph"]) // 4,  # finish()'s n counts every event read
        "strings": a.rest["strings"][a.taken_strings :],
    }
    batches.append(("a", rest))
    del rest
    top = np.frombuffer(a.rest["top"], dtype=np.int64).reshape(-1, 3).copy()
    top_text = a.rest["top_text"]
    a.batches.clear()
    b.batches.clear()
    a.rest = None

    # Pass 1: the merged numbering of strings and argument keys, and the sizes.
    strings: list[str] = []
    index: dict[str, int] = {}
    key_sids: list[int] = []
    key_index: dict[int, int] = {}
    renumber = {"a": _Renumber(), "b": _Renumber()}
    events = 0
    batch_counts = []  # per batch: its arguments' count per merged key
    for who, batch in batches:
        r = renumber[who]
        r.string_ids = np.append(r.string_ids, _numbered(batch["strings"], index, strings))
        sid_of_key = np.frombuffer(batch["arg_key_sid"], dtype=np.int32)
        new_keys = r.string_ids[sid_of_key[r.key_ids.size :]].tolist()
        r.key_ids = np.append(r.key_ids, _numbered(new_keys, key_index, key_sids))
        # The batch's arguments come grouped by the side's key numbers (take(..., True)).
        per_key = np.diff(np.frombuffer(batch["arg_key_start"], dtype=np.int64))
        counts = np.zeros(len(key_sids), dtype=np.int64)
        counts[r.key_ids[: per_key.size]] = per_key
        batch_counts.append(counts)
        events += int(batch["n"])
    n_keys = len(key_sids)
    key_count = np.zeros(n_keys, dtype=np.int64)
    for counts in batch_counts:
        key_count[: counts.size] += counts
    key_start = np.zeros(n_keys + 1, dtype=np.int64)
    key_start[1:] = np.cumsum(key_count)

    # Pass 2: each batch's columns renumbered into place; arguments grouped by key, in
    # event order within a key (batches come in text order, each grouped by its scanner).
    # Where each batch's rows and each key's arguments of it go is known from pass 1, so
    # the batches are copied by two threads at once (numpy releases the GIL while it
    # copies), each dropped once copied.
    out = {k: np.empty(events, dtype=_COLUMN_TYPES[k]) for k in _EVENT_COLUMNS}
    arg_out = {k: np.empty(int(key_start[-1]), dtype=_COLUMN_TYPES[k]) for k in _ARG_COLUMNS}
    jobs = []
    cursor = key_start[:-1].copy()
    first_event = 0
    for i, (who, batch) in enumerate(batches):
        # A key's arguments in this batch go from its cursor on.
        jobs.append((i, who, first_event, cursor.copy()))
        cursor[: batch_counts[i].size] += batch_counts[i]
        first_event += int(batch["n"])
    del batch_counts

    def copy(job) -> None:
        i, who, first_event, dest = job
        (_, batch), batches[i] = batches[i], None  # dropped once copied
        ids = renumber[who].string_ids
        # (a side's key numbers only grow, so its last ones number every batch's keys)
        key_ids = renumber[who].key_ids
        rows = slice(first_event, first_event + int(batch["n"]))
        for k in _EVENT_COLUMNS:
            column = np.frombuffer(batch[k], dtype=_COLUMN_TYPES[k])
            out[k][rows] = ids[column] if k in _STRING_COLUMNS else column
        sid = out["id_sid"][rows]
        string_id = sid >= 0
        sid[string_id] = ids[sid[string_id]]
        # Each key's arguments to its place, event numbers shifted and strings renumbered:
        # one C pass (a numpy loop over keys made three calls per key and batch).
        scanner_module.place_args(
            batch["arg_key_start"],
            batch["arg_ev"],
            batch["arg_type"],
            batch["arg_val"],
            ids,
            key_ids,
            dest,
            first_event - int(batch["first"]),
            arg_out["arg_ev"],
            arg_out["arg_type"],
            arg_out["arg_val"],
        )

    with ThreadPoolExecutor(2, thread_name_prefix="tessera-merge") as pool:
        for _ in pool.map(copy, jobs):
            pass
    release_freed_memory()
    top[:, 0] = renumber["a"].string_ids[top[:, 0]]
    return {
        "strings": strings,
        "n": events,
        **out,
        **arg_out,
        "arg_key_sid": np.array(key_sids, dtype=np.int32),
        "arg_key_start": key_start,
        "top": top.reshape(-1).tobytes(),
        "top_text": top_text,
    }
