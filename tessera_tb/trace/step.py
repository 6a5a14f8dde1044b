"""The in-memory form of one profiled step of one worker: numpy columns, no per-event objects.

Importers and the capture layer build a `StepData`; the writer stores it; the reader gives
it back. All times here are epoch nanoseconds (int64); the file stores offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from tessera_tb.proto import trace_pb2 as pb

try:  # the C packer (setup.py builds it where a C compiler is at hand)
    from tessera_tb.trace import _colpack
except ImportError:
    _colpack = None

if TYPE_CHECKING:  # pandas is imported where a frame is built: the importer never needs it
    import pandas as pd

# EventKind values by name, and names by value (for frames and messages).
KIND = {name.lower().removeprefix("kind_"): value for name, value in pb.EventKind.items()}
KIND_NAMES = np.array(sorted(KIND, key=KIND.get), dtype=object)

# Groups of kinds the definitions of METRICS.md speak of.
DEVICE_WORK_KINDS = np.array(  # busy time, device self time, launched work
    [KIND[k] for k in ("kernel", "collective", "memcpy", "memset")], np.uint8
)
DEVICE_KINDS = np.append(DEVICE_WORK_KINDS, np.uint8(KIND["gpu_annotation"]))  # device timeline
KERNEL_KINDS = np.array([KIND["kernel"], KIND["collective"]], np.uint8)
HOST_TREE_KINDS = np.array(  # the host op tree ("Steps and nesting")
    [KIND[k] for k in ("cpu_op", "annotation", "runtime", "driver")], np.uint8
)
LAUNCH_KINDS = np.array([KIND["runtime"], KIND["driver"]], np.uint8)  # launch linkage


def kind_mask(kinds: np.ndarray) -> np.ndarray:
    """A lookup table over every uint8 kind value: `kind_mask(G)[kind]` is np.isin(kind, G)
    at the cost of one gather (np.isin sorts; on a small step that is most of the work)."""
    mask = np.zeros(256, dtype=bool)
    mask[kinds] = True
    return mask


IS_DEVICE_WORK = kind_mask(DEVICE_WORK_KINDS)
IS_HOST_TREE = kind_mask(HOST_TREE_KINDS)
IS_LAUNCH = kind_mask(LAUNCH_KINDS)

# Event columns and their stored dtypes. `start_ns` is epoch ns in memory.
EVENT_COLUMNS = {
    "start_ns": "int64",
    "dur_ns": "int64",
    "name_id": "int32",
    "track_id": "int32",
    "kind": "uint8",
    "cat_id": "int32",
    "correlation": "int64",
    "external_id": "int64",
    "parent": "int32",
    "launch": "int32",
}
FLOW_COLUMNS = {
    "flow_id": "int64",
    "cat_id": "int32",
    "phase": "uint8",
    "track_id": "int32",
    "ts_ns": "int64",
    "row": "int32",
}
FLOW_PHASES = {"s": 0, "t": 1, "f": 2}

ATTR_TYPES = {
    "int64": pb.ATTR_INT64,
    "float64": pb.ATTR_FLOAT64,
    "string": pb.ATTR_STRING,
    "json": pb.ATTR_JSON,
    "bool": pb.ATTR_BOOL,
}
ATTR_TYPE_NAMES = {v: k for k, v in ATTR_TYPES.items()}
ATTR_VALUE_DTYPES = {
    "int64": "int64",
    "float64": "float64",
    "string": "int32",
    "json": "int32",
    "bool": "uint8",
}


@dataclass
class TrackInfo:
    """A host thread or device stream."""

    id: int
    kind: str  # "host_thread", "device_stream" or "track_other"
    pid: str
    tid: str
    device: int = -1
    stream: int = -1
    name: str = ""
    sort_index: int = 0


@dataclass
class Attr:
    """A sparse attribute column: `values[i]` belongs to event row `rows[i]`.

    For type "string" and "json", values are ids into the step's string table
    ("json" strings hold compact JSON text: shapes, lists).
    """

    key: str
    type: str
    rows: np.ndarray
    values: np.ndarray


@dataclass
class CounterSeries:
    """A (ts, value) series: power, temperature, clocks, utilization, user counters."""

    name: str
    unit: str
    source: str
    device: int
    ts_ns: np.ndarray  # epoch ns
    values: np.ndarray  # float64


@dataclass
class Capability:
    name: str
    status: str  # "ok", "unavailable", "unsupported"
    reason: str = ""


@dataclass
class StepData:
    """One step of one worker. `events` and `flows` map column name -> numpy array."""

    step: int
    start_ns: int
    end_ns: int
    strings: list[str]
    tracks: list[TrackInfo]
    events: dict[str, np.ndarray]
    attrs: list[Attr] = field(default_factory=list)
    flows: dict[str, np.ndarray] = field(default_factory=dict)
    counters: list[CounterSeries] = field(default_factory=list)
    capabilities: list[Capability] = field(default_factory=list)
    span_index: int = 0

    @property
    def num_events(self) -> int:
        return int(self.events["start_ns"].size)

    @property
    def span_ns(self) -> int:
        """Duration of the step span (METRICS.md, "Steps and nesting")."""
        return int(self.end_ns - self.start_ns)

    @cached_property
    def _strings_array(self) -> np.ndarray:
        return np.array(self.strings, dtype=object)

    def string_values(self, ids: np.ndarray) -> np.ndarray:
        """Map string ids to Python strings (an object array)."""
        return self._strings_array[ids]

    @cached_property
    def attrs_by_key(self) -> dict[str, Attr]:
        return {a.key: a for a in self.attrs}

    def attr(self, key: str) -> pd.Series:
        """One attribute as a Series indexed by event row; missing key gives an empty Series.

        String attributes come back as strings; JSON ones as their JSON text.
        """
        import pandas as pd

        a = self.attrs_by_key.get(key)
        if a is None:
            return pd.Series([], dtype=object, name=key)
        if a.type in ("string", "json"):
            values = self.string_values(a.values)
        elif a.type == "bool":
            values = a.values.astype(bool)
        else:
            values = a.values
        return pd.Series(values, index=a.rows, name=key)

    def frame(self) -> pd.DataFrame:
        """Events as a DataFrame: one row per event, row order = file row order.

        Columns: start_ns, dur_ns, end_ns (epoch ns), name, cat, kind (categoricals),
        track_id, correlation, external_id, parent, launch.
        """
        import pandas as pd

        ev = self.events
        strings = pd.Index(self.strings)
        if not strings.is_unique:
            raise ValueError("string table has duplicate entries")
        df = pd.DataFrame(
            {
                "start_ns": ev["start_ns"],
                "dur_ns": ev["dur_ns"],
                "end_ns": ev["start_ns"] + ev["dur_ns"],
                "name": pd.Categorical.from_codes(ev["name_id"], categories=strings),
                "cat": pd.Categorical.from_codes(ev["cat_id"], categories=strings),
                "kind": pd.Categorical.from_codes(
                    ev["kind"].astype(np.int16), categories=list(KIND_NAMES)
                ),
                "track_id": ev["track_id"],
                "correlation": ev["correlation"],
                "external_id": ev["external_id"],
                "parent": ev["parent"],
                "launch": ev["launch"],
            }
        )
        return df


def empty_events(n: int = 0) -> dict[str, np.ndarray]:
    return {name: np.zeros(n, dtype=dt) for name, dt in EVENT_COLUMNS.items()}


def canonical_order(events: dict[str, np.ndarray]) -> np.ndarray:
    """Row order of the file: by track, then start, longer first, then lower External id.

    With this order a parent precedes its children on a track, and each track is one
    contiguous block (what timeline queries slice).
    """
    track, start, external = events["track_id"], events["start_ns"], events["external_id"]
    in_order = _c_in_order(track, start, events["dur_ns"], external)
    if in_order is None:
        in_order = _in_order(track, start, -events["dur_ns"], external)
    if in_order:
        return np.arange(track.size)  # what the stable sort gives rows already in order
    packed = _packed_keys(track, start, events["dur_ns"], external)
    if packed is None:
        return np.lexsort((external, -events["dur_ns"], start, track))
    then, first = packed
    # By (track, start) first: rows come in runs of it, which a stable sort takes in about
    # one pass. Only rows tied on it are then sorted by the other two.
    order = np.argsort(first, kind="stable")
    ordered = first[order]
    tie = ordered[1:] == ordered[:-1]
    if tie.any():
        tied = np.zeros(order.size, dtype=bool)
        tied[1:] = tie
        tied[:-1] |= tie
        at = np.flatnonzero(tied)
        rows = order[at]
        order[at] = rows[np.lexsort((then[rows], ordered[at]))]
    return order


def _packed_keys(track, start, dur, external) -> tuple[np.ndarray, np.ndarray] | None:
    """The four sort keys as two int64 keys that sort the same: (track, start) and (longer
    first, External id), each pair's bits side by side; None where their ranges need more
    than 62 bits. Half the passes of a lexsort over the four."""
    bits = []
    for key in (track, start, dur, external):
        low, high = int(key.min()), int(key.max())
        bits.append((low, high, (high - low).bit_length()))
    (t_low, _, _), (s_low, _, s_bits), (_, d_high, d_bits), (e_low, _, e_bits) = bits
    if bits[0][2] + s_bits > 62 or d_bits + e_bits > 62:
        return None
    first = ((track.astype(np.int64) - t_low) << s_bits) | (start - s_low)
    then = ((d_high - dur) << e_bits) | (external - e_low)
    return then, first


def _c_in_order(track, start, dur, external) -> bool | None:
    """_in_order of (track, start, -dur, external) in one C pass without the GIL
    (trace/_colpack.c: on a step of the 50x copy, 0.15 ms of numpy calls holding it), where
    the packer was built and the columns have their usual types; None elsewhere."""
    if _colpack is None or track.dtype != np.int32:
        return None
    if not all(k.dtype == np.int64 for k in (start, dur, external)):
        return None
    return _colpack.in_canonical_order(
        np.ascontiguousarray(track),
        np.ascontiguousarray(start),
        np.ascontiguousarray(dur),
        np.ascontiguousarray(external),
    )


def _in_order(*keys: np.ndarray) -> bool:
    """Whether consecutive rows are non-decreasing by `keys` (the first most significant):
    one pass, where a lexsort would cost n log n (steps come from the importer in order)."""
    if keys[0].size < 2:
        return True
    later = np.zeros(keys[0].size - 1, dtype=bool)  # decided: strictly greater
    tied = np.ones(keys[0].size - 1, dtype=bool)  # undecided: equal on the keys so far
    for k in keys:
        a, b = k[:-1], k[1:]
        later |= tied & (b > a)
        if not (later | ~tied | (b >= a)).all():
            return False
        tied &= b == a
    return True


def reorder(step: StepData, perm: np.ndarray) -> StepData:
    """Return `step` with its event rows permuted (`perm[new_row] = old_row`).

    Row references (parent, launch, attribute rows, flow rows) are remapped.
    """
    n = step.num_events
    new_of_old = np.empty(n, dtype=np.int32)
    new_of_old[perm] = np.arange(n, dtype=np.int32)

    def remap(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int32)
        return np.where(rows >= 0, new_of_old[np.maximum(rows, 0)], -1).astype(np.int32)

    events = {k: v[perm] for k, v in step.events.items()}
    events["parent"] = remap(events["parent"])
    events["launch"] = remap(events["launch"])
    attrs = []
    for a in step.attrs:
        rows = new_of_old[a.rows]
        order = np.argsort(rows, kind="stable")
        attrs.append(Attr(a.key, a.type, rows[order].astype(np.int32), a.values[order]))
    flows = dict(step.flows)
    if flows:
        flows["row"] = remap(flows["row"])
    return StepData(
        step=step.step,
        start_ns=step.start_ns,
        end_ns=step.end_ns,
        strings=step.strings,
        tracks=step.tracks,
        events=events,
        attrs=attrs,
        flows=flows,
        counters=step.counters,
        capabilities=step.capabilities,
        span_index=step.span_index,
    )
