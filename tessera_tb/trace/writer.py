"""Write steps, worker metadata and TensorBoard scalars into a run (docs/FORMAT.md).

Every file is written atomically (temporary file + rename), so a reader never sees half a
step, and a crash loses at most the step being written.
"""

from __future__ import annotations

import os

import numpy as np

from tessera_tb import __version__
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import columns, layout
from tessera_tb.trace.atomic import write_bytes_atomic
from tessera_tb.trace.scalars import ScalarWriter
from tessera_tb.trace.schema_version import SCHEMA_MAJOR, SCHEMA_MINOR
from tessera_tb.trace.step import (
    ATTR_TYPES,
    ATTR_VALUE_DTYPES,
    EVENT_COLUMNS,
    FLOW_COLUMNS,
    StepData,
    canonical_order,
    reorder,
)

# How the event and flow columns are stored: as differences (True) or as they are (False).
# Left to the encoder (None: it packs both forms and keeps the smaller), each was packed
# twice: 96 MB went through Zstandard for the 100 steps of the 50x copy (bench/ingest.py),
# 69 MB with these, and encoding those steps in one thread took 0.33 s, 0.27 s with these.
# Each is the form the encoder chose on (nearly) every step of the shared traces; their
# step files grow by 0.18% in all (at most 0.8%, on the smallest trace), mostly where
# external_id or correlation would have gone the other way
# (tests/trace/test_fixed_codings.py).
EVENT_DELTA = {
    "start_ns": True,
    "dur_ns": False,
    "name_id": False,
    "track_id": False,
    "cat_id": False,
    "correlation": False,
    "external_id": True,
    "parent": False,
    "launch": True,
}
FLOW_DELTA = {"flow_id": True, "cat_id": True, "track_id": False, "ts_ns": False, "row": True}
_TRACK_KINDS = {"host_thread": pb.HOST_THREAD, "device_stream": pb.DEVICE_STREAM}


def _parts(step: StepData) -> tuple:
    """What a step file holds, before it is packed: (the step in canonical order, base_ns,
    events, attrs, flows). events: (values, dtype, delta) of each event column, as stored
    (offsets from base_ns, row references relative to the row); attrs: (key, type code,
    rows column, values column) each; flows: None, or (count, columns) as events'. Both
    ways of writing a step (step_to_proto, and encode_step's C path) start from these."""
    perm = canonical_order(step.events)
    if not np.array_equal(perm, np.arange(perm.size)):
        step = reorder(step, perm)
    ev = step.events
    starts = ev["start_ns"]
    base_ns = int(min(step.start_ns, starts.min())) if starts.size else int(step.start_ns)
    rows = np.arange(step.num_events, dtype=np.int64)
    stored = dict(ev)
    stored["start_ns"] = starts - base_ns
    for ref in ("parent", "launch"):  # row references stored relative to the row: small numbers
        stored[ref] = np.where(ev[ref] >= 0, rows - ev[ref], 0)
    events = [(stored[name], dtype, EVENT_DELTA.get(name)) for name, dtype in EVENT_COLUMNS.items()]
    attrs = [
        (
            a.key,
            ATTR_TYPES[a.type],
            (a.rows, "int32", True),
            (a.values, ATTR_VALUE_DTYPES[a.type], None),
        )
        for a in step.attrs
    ]
    flows = None
    if step.flows:
        fl = dict(step.flows)
        bound = fl["row"] >= 0
        anchor = np.where(bound, starts[np.maximum(fl["row"], 0)] if starts.size else 0, base_ns)
        fl["ts_ns"] = fl["ts_ns"] - anchor
        flows = (
            int(fl["flow_id"].size),
            [(fl[name], dtype, FLOW_DELTA.get(name)) for name, dtype in FLOW_COLUMNS.items()],
        )
    return step, base_ns, events, attrs, flows


def _head(step: StepData, base_ns: int) -> pb.Step:
    """The step's fields before its string table, and its tracks."""
    msg = pb.Step(
        schema_major=SCHEMA_MAJOR,
        schema_minor=SCHEMA_MINOR,
        step=int(step.step),
        base_ns=base_ns,
        start_ns=int(step.start_ns) - base_ns,
        end_ns=int(step.end_ns) - base_ns,
    )
    for position, t in enumerate(step.tracks):
        if t.id != position:
            raise ValueError(f"track {t.name!r} has id {t.id} at position {position}")
        msg.tracks.add(
            id=t.id,
            kind=_TRACK_KINDS.get(t.kind, pb.TRACK_OTHER),
            pid=str(t.pid),
            tid=str(t.tid),
            device=int(t.device),
            stream=int(t.stream),
            name=t.name,
            sort_index=int(t.sort_index),
        )
    return msg


def _tail(step: StepData, base_ns: int, msg: pb.Step) -> None:
    """The step's counters, capabilities and span index, into `msg`."""
    cols = []
    for c in step.counters:
        cm = msg.counters.add(name=c.name, unit=c.unit, source=c.source, device=int(c.device))
        cols.append((np.asarray(c.ts_ns) - base_ns, "int64", True, cm.ts_ns))
        cols.append((c.values, "float64", None, cm.values))
    if cols:
        columns.encode_many(cols)
    for cap in step.capabilities:
        msg.capabilities.add(name=cap.name, status=cap.status, reason=cap.reason)
    msg.span_index = int(step.span_index)


def step_to_proto(step: StepData) -> pb.Step:
    """Serialise a StepData (rows are put in canonical order first)."""
    step, base_ns, events, attrs, flows = _parts(step)
    msg = _head(step, base_ns)
    columns.encode_strings(step.strings, msg.strings)
    msg.events.count = step.num_events
    # (values, dtype, delta, message) of every column, packed together (columns.encode_many)
    cols = [(*c, getattr(msg.events, name)) for name, c in zip(EVENT_COLUMNS, events)]
    for key, type_code, rows, values in attrs:
        col = msg.attrs.add(key=key, type=type_code)
        cols += [(*rows, col.rows), (*values, col.values)]
    if flows is not None:
        msg.flows.count = flows[0]
        cols += [(*c, getattr(msg.flows, name)) for name, c in zip(FLOW_COLUMNS, flows[1])]
    columns.encode_many(cols)
    _tail(step, base_ns, msg)
    return msg


def encode_step(step: StepData) -> bytes:
    """A step file's bytes (step_to_proto, serialised). It reads only the step, so an
    importer encodes several steps at once in threads.

    Where the C packer can (columns.packs_steps), its columns and string table are packed
    in one call that holds no GIL (`_colpack.pack_step`), which also writes the message's
    fields that hold the columns (events, attrs, flows) as protobuf writes them; the fields
    before and after those are serialised by protobuf, and the three pieces joined are the
    message's own serialisation (fields in number order), the bytes step_to_proto gives
    (tests/trace/test_colpack.py). Of a 50x copy step's 2.4 ms of encoding, 1.9 ms are in
    that call and 0.45-0.5 ms in Python, which holds the GIL; filled column by column,
    ~0.8 ms of 2.75 ms were."""
    if not columns.packs_steps(step.num_events):
        return step_to_proto(step).SerializeToString()
    step, base_ns, events, attrs, flows = _parts(step)
    head = _head(step, base_ns)
    head.strings.count = len(step.strings)
    head.strings.codec, head.strings.data, fragment = columns.pack_step(
        step.num_events, events, attrs, flows, columns.strings_json(step.strings)
    )
    tail = pb.Step()
    _tail(step, base_ns, tail)
    return head.SerializeToString() + fragment + tail.SerializeToString()


def new_worker_meta(worker: str, **fields) -> pb.WorkerMeta:
    """A WorkerMeta with the schema version and this package's version (rank -1: unknown)."""
    fields.setdefault("rank", -1)
    meta = pb.WorkerMeta(
        schema_major=SCHEMA_MAJOR,
        schema_minor=SCHEMA_MINOR,
        worker=layout.check_worker_name(worker),
        **fields,
    )
    meta.versions["tessera"] = __version__
    return meta


class WorkerWriter:
    """Writes one worker's step files, its meta.pb and its TensorBoard scalars."""

    def __init__(
        self, run_dir: str, meta: pb.WorkerMeta, *, scalars: bool = True, staged: bool = False
    ):
        """`staged`: `run_dir` is a hidden staging directory that is renamed into place
        whole when complete (the importer): files are written plainly and the step index
        once, at close. Otherwise (a live run, the capture layer) every file is written
        atomically and the index is rewritten with each step, so that a crash loses at most
        the step in flight."""
        self.run_dir = run_dir
        self.staged = staged
        self.meta = meta
        self.directory = layout.worker_dir(run_dir, meta.worker)
        os.makedirs(self.directory, exist_ok=True)
        self._scalars = ScalarWriter(run_dir, meta.worker) if scalars else None
        self.bytes_written = 0

    def write_step(self, step: StepData, data: bytes | None = None) -> str:
        """Write one step file and record it in the worker's index; returns its path.
        `data`: the step's `encode_step` bytes, when they were made beforehand."""
        if data is None:
            data = encode_step(step)
        name = layout.step_file_name(int(step.step))
        path = os.path.join(self.directory, name)
        self._write(path, data)
        self.bytes_written += len(data)
        self._index_step(
            pb.StepIndexEntry(
                step=int(step.step),
                start_ns=int(step.start_ns),
                end_ns=int(step.end_ns),
                event_count=step.num_events,
            )
        )
        # The index is rewritten with every step, so a crash loses at most the step in flight.
        if not self.staged:
            self.write_meta()
        if self._scalars is not None:
            self._scalars.write_step(step)
        return path

    def _index_step(self, entry: pb.StepIndexEntry) -> None:
        """Put a step in the index (meta.steps, in step order), in place: a step after the
        last is appended, a rewritten one updated, one out of order shifted into place.
        Protobuf keeps what is deleted from a repeated field in the message's memory until
        the message goes, so rebuilding the index for every step grew by the whole index
        each time (340 MB over 4,000 steps); `meta` is also shared with the capture layer,
        which adds capabilities to it, so it is never replaced."""
        steps = self.meta.steps
        if not steps or steps[-1].step < entry.step:
            steps.append(entry)
            return
        for e in steps:
            if e.step == entry.step:
                e.CopyFrom(entry)
                return
        steps.add()
        i = len(steps) - 1
        while i > 0 and steps[i - 1].step > entry.step:
            steps[i].CopyFrom(steps[i - 1])
            i -= 1
        steps[i].CopyFrom(entry)

    def write_meta(self) -> str:
        path = os.path.join(self.directory, layout.META_FILE)
        # Deterministic: map fields (versions) in key order, so the same import writes the
        # same bytes in any process (a Dask worker's import equals a local one).
        self._write(path, self.meta.SerializeToString(deterministic=True))
        return path

    def _write(self, path: str, data: bytes) -> None:
        if self.staged:
            with open(path, "wb") as f:
                f.write(data)
        else:
            write_bytes_atomic(path, data)

    def close(self) -> None:
        self.write_meta()
        if self._scalars is not None:
            self._scalars.close()
            self._scalars = None
