"""Encode numpy arrays into `Column` messages and back (docs/FORMAT.md, "Columns")."""

from __future__ import annotations

import functools
import importlib.util
import threading
import zlib

import msgspec
import numpy as np
import zstandard

from tessera_tb.proto import trace_pb2 as pb

try:
    # ISA-L's inflate: about 2x faster than zlib's (bench/ingest.py), for gzip traces and the
    # zlib columns of schema 1.x runs. Any zlib reads what it writes, and it what zlib writes.
    from isal import isal_zlib as deflate_module
except ImportError:  # a platform without isal's wheels: zlib, slower, same format
    deflate_module = zlib
DEFLATE_ERRORS = (zlib.error, deflate_module.error)

try:
    # The C packer (setup.py builds it where a C compiler is at hand).
    from tessera_tb.trace import _colpack
except ImportError:
    _colpack = None

_DTYPES = {
    pb.INT8: np.dtype("<i1"),
    pb.UINT8: np.dtype("<u1"),
    pb.INT32: np.dtype("<i4"),
    pb.INT64: np.dtype("<i8"),
    pb.FLOAT64: np.dtype("<f8"),
}
_CODES = {dt: code for code, dt in _DTYPES.items()}
_LITTLE = {dt.name: dt for dt in _DTYPES.values()}  # "int32" -> little-endian int32

# Zstandard's level 3 (its default) is as fast as its level 1 on columns this small and
# 8% smaller (bench/ingest.py prints bytes per event).
_ZSTD_LEVEL = 3
_THREAD = threading.local()
# A string table or column that says it inflates to more is refused as corrupt.
_MAX_INFLATED = 1 << 30
_STRINGS = msgspec.json.Decoder(list[str])
_MIN_COMPRESS_BYTES = 64
# Long integer columns choose difference coding or not on this many blocks of values.
_DELTA_PROBE_BLOCKS = 4
_DELTA_PROBE_VALUES = 2048
# Columns laid out and compressed in one round, at most about this many bytes of values (a
# round holds up to twice that, both forms of the columns that choose, until it is packed).
_BATCH_BYTES = 8 << 20


# How a column's integers are stored: as they are, as differences, or whichever packs
# smaller (the `delta` argument of encode: False, True, None).
_PLAIN, _DELTA, _CHOOSE = 0, 1, 2


def encode(values: np.ndarray, dtype: str, *, delta: bool | None = None, out: pb.Column) -> None:
    """Fill `out` with `values` stored as `dtype` (little-endian).

    `delta`: True/False forces difference coding; None (the default) tries both for
    integer columns and keeps the smaller (offsets and ids shrink, names do not).
    """
    encode_many([(values, dtype, delta, out)])


def encode_many(jobs, *, packer=None) -> None:
    """encode() for several columns at once: (values, dtype, delta, out) each. A step's
    columns go through here together: the C packer (_colpack, where it was built) lays them
    out, compresses them and keeps each one's smaller form in one call with the GIL
    released, so steps encoded in several threads do not queue for the GIL column by column.
    Columns of more than _BATCH_BYTES in all go in several such rounds, so that the forms
    held at once stay bounded on a huge step.

    `packer` forces one way (tests); the bytes are the same: "c" (_colpack with the
    zstandard package's own Zstandard, bound by _c_zstd), "c-layout" (_colpack lays out,
    Python compresses with the package and chooses: where no Zstandard could be bound) or
    "python" (numpy: where _colpack was not built)."""
    prepared = [(*_job(values, dtype, delta), out) for values, dtype, delta, out in jobs]
    if packer is None:
        packer = "c" if _c_zstd() else "c-layout" if _colpack is not None else "python"
    elif packer == "c" and not _c_zstd():
        raise RuntimeError("the C packer has no Zstandard bound")
    batch: list = []
    held = 0
    for item in prepared:
        batch.append(item)
        held += item[0].nbytes
        if held >= _BATCH_BYTES:
            _encode_batch(batch, packer)
            batch, held = [], 0
    if batch:
        _encode_batch(batch, packer)


def _job(values, dtype: str, delta: bool | None) -> tuple[np.ndarray, int]:
    """(the values as stored, contiguous and little-endian; how they are coded)."""
    arr = np.ascontiguousarray(values, dtype=_LITTLE[dtype])
    integer = arr.dtype.kind == "i"
    if delta and not integer:
        raise ValueError(f"delta coding is exact only for integers, not {arr.dtype}")
    return arr, _CHOOSE if delta is None and integer else _DELTA if delta else _PLAIN


def _step_column(values, dtype: str, delta: bool | None) -> tuple:
    """A column of pack_step: (array, mode, probe starts, dtype code)."""
    arr, mode = _job(values, dtype, delta)
    return arr, mode, _probe_starts(arr, mode), _CODES[arr.dtype]


def pack_step(
    event_count: int, events: list, attrs: list, flows, strings: bytes
) -> tuple[int, bytes, bytes]:
    """A step's columns packed in one C call (_colpack.pack_step): (the string table's
    codec, its stored bytes, the Step fields events, attrs and flows as protobuf bytes).
    events, attrs and flows as writer._parts gives them."""
    compressed, data, fragment = _colpack.pack_step(
        (event_count, [_step_column(*c) for c in events]),
        [
            (key.encode(), type_code, _step_column(*rows), _step_column(*values))
            for key, type_code, rows, values in attrs
        ],
        None if flows is None else (flows[0], [_step_column(*c) for c in flows[1]]),
        strings,
        _MIN_COMPRESS_BYTES,
        _DELTA_PROBE_VALUES,
        _ZSTD_LEVEL,
    )
    return (pb.CODEC_ZSTD if compressed else pb.CODEC_NONE), data, fragment


def _encode_batch(prepared: list, packer: str) -> None:
    if packer == "c":
        packed = _colpack.pack_columns(
            [(arr, mode, _probe_starts(arr, mode)) for arr, mode, _ in prepared],
            _MIN_COMPRESS_BYTES,
            _DELTA_PROBE_VALUES,
            _ZSTD_LEVEL,
        )
        for (arr, _, out), (delta, shuffle, compressed, data) in zip(prepared, packed):
            out.dtype = _CODES[arr.dtype]
            out.count = arr.size
            out.delta = delta
            out.shuffle = shuffle
            out.codec = pb.CODEC_ZSTD if compressed else pb.CODEC_NONE
            out.data = data
        return
    if packer == "c-layout":
        layouts = _colpack.layout_columns(
            [(arr, mode, _probe_starts(arr, mode)) for arr, mode, _ in prepared],
            _MIN_COMPRESS_BYTES,
            _DELTA_PROBE_VALUES,
        )
    else:
        layouts = [_layout(arr, mode) for arr, mode, _ in prepared]
    for (arr, _, out), (delta, shuffle, codec, data) in zip(prepared, _pack_all(layouts)):
        out.dtype = _CODES[arr.dtype]
        out.count = arr.size
        out.delta = delta
        out.shuffle = shuffle
        out.codec = codec
        out.data = data


# About the bytes of values a step's events hold (the event columns: 53 per row; with the
# arguments, ~110 on the 50x copy): a step is packed in one call where this many
# per event stay within _BATCH_BYTES.
_STEP_BYTES_PER_EVENT = 128


@functools.cache
def _c_zstd() -> bool:
    """Whether _colpack packs columns whole (pack_columns): it takes Zstandard's functions
    from the zstandard package's own library, its CFFI module, which exports them (the C
    backend's does not), once per process. The version there must be the one the package
    compresses with, so the frames are the package's. False where _colpack was not built,
    the module is not there (a zstandard built without it) or cannot be loaded: then
    Python compresses, with the same bytes."""
    if _colpack is None or not hasattr(_colpack, "bind_zstd"):
        return False
    try:
        spec = importlib.util.find_spec("zstandard._cffi")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin:
        return False
    major, minor, patch = zstandard.ZSTD_VERSION
    return _colpack.bind_zstd(spec.origin, major * 10000 + minor * 100 + patch)


def _step_schema() -> tuple:
    """The field numbers _colpack.pack_step writes, from the messages' own descriptors, and
    the columns' order there (their names in step.EVENT_COLUMNS, FLOW_COLUMNS order)."""
    from tessera_tb.trace.step import EVENT_COLUMNS, FLOW_COLUMNS

    def numbers(message, names) -> tuple:
        return tuple(message.DESCRIPTOR.fields_by_name[name].number for name in names)

    events = numbers(pb.Events, ["count", *EVENT_COLUMNS])
    flows = numbers(pb.Flows, ["count", *FLOW_COLUMNS])
    for table in (events, flows):  # the columns follow each other from the first one
        if table[1:] != tuple(range(table[1], table[1] + len(table) - 1)):
            return ()
    return (
        numbers(pb.Step, ["events", "attrs", "flows"]),
        events[:2],
        numbers(pb.AttrColumn, ["key", "type", "rows", "values"]),
        flows[:2],
        numbers(pb.Column, ["dtype", "codec", "count", "delta", "shuffle", "data"]),
        (pb.CODEC_NONE, pb.CODEC_ZSTD),
    )


def packs_steps(event_count: int) -> bool:
    """Whether writer.encode_step packs a step of `event_count` events in one C call
    (pack_step): where _colpack has Zstandard bound and writes the fields the messages
    have (checked once against their descriptors), and the step is not so large that its
    columns should go in rounds of _BATCH_BYTES (encode_many)."""
    return _step_packing() and event_count * _STEP_BYTES_PER_EVENT <= _BATCH_BYTES


@functools.cache
def _step_packing() -> bool:
    """Whether _colpack packs whole steps here (packs_steps), found once per process."""
    return _c_zstd() and getattr(_colpack, "STEP_SCHEMA", None) == _step_schema()


def strings_json(strings: list[str]) -> bytes:
    """A string table's stored JSON, before compression."""
    return msgspec.json.encode(strings)


def _layout(arr: np.ndarray, mode: int) -> tuple[bool, bytes | None, bytes | None, tuple | None]:
    """(shuffle, plain, diffs, probes) of one column, in numpy: what _colpack.c does in C.

    plain and diffs: the byte planes of the values and of their differences, None where that
    form is not wanted. probes: for a long column that chooses, (plain, diffs) of a few
    blocks spread over it (_probe_starts), else None."""
    size = arr.size
    choose = mode == _CHOOSE and size > 2 and arr.nbytes >= _MIN_COMPRESS_BYTES
    delta_only = mode == _DELTA and size > 0
    starts = _probe_starts(arr, mode) if choose else None
    probes = None
    if starts is not None:
        blocks = [arr[s : s + _DELTA_PROBE_VALUES] for s in starts]
        probes = tuple((_planes(b), _planes(_deltas(b))) for b in blocks)
    plain = None if delta_only else _planes(arr)
    diffs = _planes(_deltas(arr)) if delta_only or choose else None
    return arr.dtype.itemsize > 1 and size > 1, plain, diffs, probes


def _pack_all(layouts) -> list[tuple[bool, bool, int, bytes]]:
    """(delta, shuffle, codec, bytes) of each laid-out column: each wanted form compressed
    (_compress_many), and where both are there, the smaller kept (the plain one on a tie).
    A long column chooses on its probe blocks, then only the chosen form is compressed:
    compressing it whole both ways costs twice the time for the same choice."""
    first = []
    for _, plain, diffs, probes in layouts:
        if probes is not None:
            first += [form for pair in probes for form in pair]
        else:
            first += [form for form in (plain, diffs) if form is not None]
    done = iter(_compress_many(first))
    picks, chosen = [], []
    for shuffle, plain, diffs, probes in layouts:
        if probes is not None:
            sizes = [len(next(done)[1]) for _ in range(2 * len(probes))]
            delta = sum(sizes[1::2]) < sum(sizes[0::2])
            chosen.append(diffs if delta else plain)
            picks.append((delta, shuffle, None))
            continue
        as_is = next(done) if plain is not None else None
        as_diffs = next(done) if diffs is not None else None
        if as_diffs is not None and (as_is is None or len(as_diffs[1]) < len(as_is[1])):
            picks.append((True, shuffle, as_diffs))
        else:
            picks.append((False, shuffle, as_is))
    later = iter(_compress_many(chosen))
    return [(d, s, *(packed if packed is not None else next(later))) for d, s, packed in picks]


def _compress_many(forms: list[bytes]) -> list[tuple[int, bytes]]:
    """_compress of each form. Where the zstandard build has its batch call, all of them in
    one call that releases the GIL once: a step's columns compressed one call each
    gave the GIL back and waited for it some 120 times, and steps encoded in two threads
    beside the importer's own thread spent more time waiting than compressing. Both calls
    write the same frames (tests/trace/test_colpack.py)."""
    big = [form for form in forms if len(form) >= _MIN_COMPRESS_BYTES]
    compressor = _compressor()
    batch = getattr(compressor, "multi_compress_to_buffer", None)
    if big and batch is not None:
        packed = iter([segment.tobytes() for segment in batch(big)])
    else:
        packed = iter([compressor.compress(form) for form in big])
    out = []
    for form in forms:
        if len(form) >= _MIN_COMPRESS_BYTES:
            made = next(packed)
            if len(made) < len(form):
                out.append((pb.CODEC_ZSTD, made))
                continue
        out.append((pb.CODEC_NONE, form))
    return out


def _deltas(arr: np.ndarray) -> np.ndarray:
    """Differences from the previous value, the first from 0 (np.diff with prepend=0)."""
    out = np.empty_like(arr)
    if arr.size:
        out[0] = arr[0]
        np.subtract(arr[1:], arr[:-1], out=out[1:])
    return out


def _probe_starts(arr: np.ndarray, mode: int) -> tuple[int, ...] | None:
    """Where the probe blocks of a long integer column that chooses its coding start
    (None for the other columns: they try both codings whole)."""
    if mode != _CHOOSE or arr.size <= _DELTA_PROBE_BLOCKS * _DELTA_PROBE_VALUES * 2:
        return None
    last = arr.size - _DELTA_PROBE_VALUES
    return tuple(np.linspace(0, last, _DELTA_PROBE_BLOCKS).astype(np.int64).tolist())


def _planes(arr: np.ndarray) -> bytes:
    """The bytes of an array plane by plane (all first bytes, then all second bytes, ...);
    one value, or values of one byte, as they are."""
    raw = arr.view(np.uint8)
    if arr.dtype.itemsize > 1 and arr.size > 1:
        raw = raw.reshape(-1, arr.dtype.itemsize).T
    return raw.tobytes()


def _compressor():
    """This thread's Zstandard compressor (one may not be used by two threads at once)."""
    made = getattr(_THREAD, "compressor", None)
    if made is None:
        made = _THREAD.compressor = zstandard.ZstdCompressor(
            level=_ZSTD_LEVEL, write_checksum=False, write_content_size=True
        )
    return made


def _compress(data: bytes) -> tuple[int, bytes]:
    """(codec, bytes): one Zstandard frame when the data is long enough and compression makes
    it smaller, else the data as is.

    Zstandard, not zlib's deflate: at level 3 it is 3x faster than zlib's level 1 on the
    columns of real steps, and they come out 19% smaller (docs/FORMAT.md). Its frames
    depend on the data and the level alone, so one import always writes the same bytes, in
    any thread (tests/trace/test_compress_repeatable.py); ISA-L's deflate did not."""
    if len(data) >= _MIN_COMPRESS_BYTES:
        packed = _compressor().compress(data)
        if len(packed) < len(data):
            return pb.CODEC_ZSTD, packed
    return pb.CODEC_NONE, data


def _decompress(codec: int, data: bytes, what: str, expected: int | None = None) -> bytes:
    """The stored bytes of a column or string table. `expected`: the length they must have
    (a column's count x itemsize); a Zstandard frame that says otherwise is refused before
    anything is allocated, as is one over _MAX_INFLATED bytes."""
    if codec == pb.CODEC_ZSTD:
        try:
            size = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise ValueError(f"{what}: corrupt compressed data ({exc})") from None
        if size < 0 or (expected is not None and size != expected) or size > _MAX_INFLATED:
            held = "an unknown number of" if size < 0 else f"{size:,}"
            want = f", {expected:,} expected" if expected is not None else ""
            raise ValueError(f"{what}: corrupt compressed data ({held} bytes{want})")
        try:
            return _decompressor().decompress(data, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise ValueError(f"{what}: corrupt compressed data ({exc})") from None
    if codec == pb.CODEC_ZLIB:
        try:
            return deflate_module.decompress(data)
        except DEFLATE_ERRORS as exc:
            raise ValueError(f"{what}: corrupt compressed data ({exc})") from None
    if codec != pb.CODEC_NONE:
        raise ValueError(f"{what}: unknown codec {codec}")
    return data


def _decompressor():
    made = getattr(_THREAD, "decompressor", None)
    if made is None:
        made = _THREAD.decompressor = zstandard.ZstdDecompressor()
    return made


def encode_strings(strings: list[str], out: pb.StringTable) -> None:
    out.count = len(strings)
    out.codec, out.data = _compress(strings_json(strings))


def decode_strings(table: pb.StringTable) -> list[str]:
    data = _decompress(table.codec, table.data, "string table")
    if not data:
        if table.count:
            raise ValueError(f"string table is empty, header says {table.count} strings")
        return []
    try:
        strings = _STRINGS.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"string table: {exc}") from None
    if len(strings) != table.count:
        raise ValueError(f"string table holds {len(strings)} strings, header says {table.count}")
    return strings


def decode(col: pb.Column, *, path: str = "<memory>", what: str = "column") -> np.ndarray:
    """Return the numpy array that `col` holds; raises ValueError naming `what` if it is corrupt."""
    dtype = _DTYPES.get(col.dtype)
    if dtype is None:
        if col.count == 0 and not col.data:
            return np.zeros(0, dtype=np.int64)
        raise ValueError(f"{what}: unknown dtype code {col.dtype}")
    n = int(col.count)
    data = _decompress(col.codec, col.data, what, n * dtype.itemsize)
    if len(data) != n * dtype.itemsize:
        raise ValueError(f"{what}: {len(data)} bytes for {n} values of {dtype.name}")
    raw = np.frombuffer(data, dtype=np.uint8)
    if col.shuffle:
        raw = raw.reshape(dtype.itemsize, n).T
    arr = np.ascontiguousarray(raw).view(dtype).reshape(n)
    if col.delta:
        arr = np.cumsum(arr, dtype=dtype)
    return arr.astype(dtype.newbyteorder("="), copy=False)
