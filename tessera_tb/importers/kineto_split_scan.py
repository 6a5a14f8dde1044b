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

import os
import queue
import re
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from tessera_tb.importers.kineto_scanned import T_BIGINT, T_RAW, T_STR
from tessera_tb.importers.kineto_stream import _ungrouped

# Only texts larger than this are split: below it the second thread costs more than it saves.
SPLIT_ABOVE_BYTES = 16 << 20
# A run for B starts once A is this far ahead (in bytes of text).
RUN_BYTES = 1 << 20
# No run starts this close to the end of the text (where the members after the list are).
TAIL_BYTES = 4 << 20
_BOUNDARY = re.compile(rb",[ \t\r]*\n[ \t\r\n]*(?=\{)")
_STRING_COLUMNS = ("ph", "cat", "name", "pid", "tid")
_TYPES = {
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
_STRING_ARGS = np.zeros(256, dtype=bool)
_STRING_ARGS[[T_STR, T_RAW, T_BIGINT]] = True


class _Declined(Exception):
    """The split scan cannot give one scanner's result: scan the file with one scanner."""


def worth_splitting(text_bytes: int) -> bool:
    return text_bytes > SPLIT_ABOVE_BYTES and (os.cpu_count() or 1) >= 2


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
                batch = self.scanner.take(self.taken_strings)
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

    A reads from the start. When A is ahead by RUN_BYTES or more, a run for B starts at the
    next boundary and ends at the first boundary after B has caught up; the text after it
    goes to A again. A run the text ends in is read by A instead (A stopped at its start,
    and B's reading of it is dropped), so A always reads the end of the list and the
    members after it."""
    a = _Side(scanner_module, "tessera-scan-a")
    b = _Side(scanner_module, "tessera-scan-b")
    order: list[str] = []  # which side each batch came from, in text order
    size = a_bytes = b_bytes = 0
    run: list[memoryview] | None = None  # the text of B's open run
    last = None if text_bytes is None else text_bytes - TAIL_BYTES
    try:
        for piece in pieces:
            start = size
            size += len(piece)
            view = memoryview(piece)
            if run is None:
                m = None
                if start and a_bytes - b_bytes >= RUN_BYTES and (last is None or size <= last):
                    m = _BOUNDARY.search(piece)
                if m is None:
                    a.put("feed", view, None)
                    a_bytes += len(piece)
                else:
                    a.put("feed", view[: m.end()], None)
                    a.put("cut", None)
                    order.append("a")
                    run = [view[m.end() :]]
                    b.put("feed", b"," if "b" in order else b"[", order.count("b"))
                    b.put("feed", run[0], order.count("b"))
                    a_bytes += m.end()
                    b_bytes += len(piece) - m.end()
            else:
                m = _BOUNDARY.search(piece)
                if (
                    m is None
                    or b_bytes + m.start() < a_bytes
                    or (last is not None and start + m.start() > last)
                ):
                    run.append(view)
                    b.put("feed", view, order.count("b"))
                    b_bytes += len(piece)
                else:
                    b.put("feed", view[: m.start()], order.count("b"))
                    b.put("cut", order.count("b"))
                    order.append("b")
                    a.put("feed", view[m.end() :], None)
                    b_bytes += m.start()
                    a_bytes += len(piece) - m.end()
                    run = None
            # B declining with no run open failed on a finished run; in an open one it may
            # be the run the text ends in (then dropped), so reading goes on.
            if a.error or b.error or a.declined or (b.declined and run is None):
                break
        else:
            if run is not None:  # the text ends in B's run: A reads it, B's reading is dropped
                b.dropped_run = order.count("b")
                for v in run:
                    a.put("feed", v, None)
            a.put("finish", None)
    finally:
        a.close()
        b.close()
    for side in (a, b):
        if side.error is not None:
            raise side.error
    if a.declined or a.rest is None or "b" not in order:
        return None
    if b.declined and len(b.batches) < order.count("b"):
        return None  # B could not read one of its runs
    return _merged(order, a, b), size


class _Renumber:
    """Ids of one side's strings and argument keys in the merged (text-order) numbering."""

    def __init__(self) -> None:
        self.string_ids = np.zeros(0, dtype=np.int32)
        self.key_ids = np.zeros(0, dtype=np.int32)

    def same_strings(self) -> bool:
        return bool((self.string_ids == np.arange(self.string_ids.size)).all())

    def same_keys(self) -> bool:
        return bool((self.key_ids == np.arange(self.key_ids.size)).all())


def _merged(order: list[str], a: _Side, b: _Side) -> dict[str, Any]:
    strings: list[str] = []
    index: dict[str, int] = {}
    key_sids: list[int] = []
    key_index: dict[int, int] = {}
    renumber = {"a": _Renumber(), "b": _Renumber()}
    batches = []
    taken = {"a": iter(a.batches), "b": iter(b.batches)}
    for who in order:
        batches.append((who, next(taken[who])))
    # What came after A's last take, from finish(): in take()'s shape.
    a_taken = sum(int(x["n"]) for x in a.batches)
    batches.append(("a", _ungrouped(a.rest, a_taken, a.taken_strings)))

    parts: dict[str, list[np.ndarray]] = {k: [] for k in _TYPES}
    events = 0
    for who, batch in batches:
        r = renumber[who]
        new = []
        for text in batch["strings"]:
            gid = index.get(text)
            if gid is None:
                gid = index[text] = len(strings)
                strings.append(text)
            new.append(gid)
        r.string_ids = np.concatenate([r.string_ids, np.array(new, np.int32)])
        sid_of_key = np.frombuffer(batch["arg_key_sid"], dtype=np.int32)
        new_keys = []
        for sid in sid_of_key[r.key_ids.size :].tolist():
            gsid = int(r.string_ids[sid])
            k = key_index.get(gsid)
            if k is None:
                k = key_index[gsid] = len(key_sids)
                key_sids.append(gsid)
            new_keys.append(k)
        r.key_ids = np.concatenate([r.key_ids, np.array(new_keys, np.int32)])
        cols = {k: np.frombuffer(batch[k], dtype=t) for k, t in _TYPES.items()}
        if not r.same_strings():
            ids = r.string_ids
            for k in _STRING_COLUMNS:
                cols[k] = ids[cols[k]]
            sid = cols["id_sid"]
            if (sid >= 0).any():
                cols["id_sid"] = np.where(sid >= 0, ids[np.maximum(sid, 0)], -1).astype(np.int32)
            is_string = _STRING_ARGS[cols["arg_type"]]
            if is_string.any():
                val = cols["arg_val"].copy()
                val[is_string] = ids[val[is_string]]
                cols["arg_val"] = val
        if not r.same_keys():
            cols["arg_key"] = r.key_ids[cols["arg_key"]]
        shift = events - int(batch["first"])
        if shift:
            cols["arg_ev"] = cols["arg_ev"] + np.int32(shift)
        events += int(batch["n"])
        for k in _TYPES:
            parts[k].append(cols[k])
    merged = {k: np.concatenate(v) for k, v in parts.items()}
    # Arguments grouped by key, in event order within a key (a stable sort; a radix sort
    # on 16-bit keys, as there are rarely more than a few hundred keys).
    keys = merged["arg_key"]
    by_key = np.argsort(keys.astype(np.uint16) if len(key_sids) <= 1 << 16 else keys, kind="stable")
    key_start = np.zeros(len(key_sids) + 1, dtype=np.int64)
    key_start[1:] = np.cumsum(np.bincount(keys, minlength=len(key_sids)))
    top = np.frombuffer(a.rest["top"], dtype=np.int64).reshape(-1, 3).copy()
    top[:, 0] = renumber["a"].string_ids[top[:, 0]]
    return {
        "strings": strings,
        "n": events,
        **{k: merged[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur")},
        "id_val": merged["id_val"],
        "id_sid": merged["id_sid"],
        "arg_ev": merged["arg_ev"][by_key],
        "arg_type": merged["arg_type"][by_key],
        "arg_val": merged["arg_val"][by_key],
        "arg_key_sid": np.array(key_sids, dtype=np.int32),
        "arg_key_start": key_start,
        "top": top.reshape(-1).tobytes(),
        "top_text": a.rest["top_text"],
    }
