"""Encode numpy arrays into `Column` messages and back (docs/FORMAT.md, "Columns")."""

from __future__ import annotations

import zlib

import msgspec
import numpy as np

from tessera_tb.proto import trace_pb2 as pb

try:
    # ISA-L's deflate: the same zlib streams, made about 4x and read about 2x faster than
    # zlib's own (bench/ingest.py). Any zlib reads what it writes, and it what zlib writes.
    from isal import isal_zlib as deflate_module
except ImportError:  # a platform without isal's wheels: zlib, slower, same format
    deflate_module = zlib
DEFLATE_ERRORS = (zlib.error, deflate_module.error)

try:
    # The C packer (setup.py builds it where a C compiler and zlib's headers are at hand).
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

# zlib level 1 compresses the shuffled columns nearly as well as level 6 at a
# fraction of the time (bench/ingest.py prints bytes per event).
_ZLIB_LEVEL = 1
_STRINGS = msgspec.json.Decoder(list[str])
_MIN_COMPRESS_BYTES = 64
# Long integer columns choose difference coding or not on this many blocks of values.
_DELTA_PROBE_BLOCKS = 4
_DELTA_PROBE_VALUES = 2048


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
    columns go through here together: the C packer (_colpack, where it was built) packs
    them all in one call with the GIL released, so steps encoded in several threads do not
    queue for it column by column. `packer`: "c" or "python" to force one (tests); the
    bytes are the same."""
    prepared = []
    for values, dtype, delta, out in jobs:
        arr = np.ascontiguousarray(values, dtype=_LITTLE[dtype])
        integer = arr.dtype.kind == "i"
        if delta and not integer:
            raise ValueError(f"delta coding is exact only for integers, not {arr.dtype}")
        mode = _CHOOSE if delta is None and integer else _DELTA if delta else _PLAIN
        prepared.append((arr, mode, out))
    use_c = _colpack is not None if packer is None else packer == "c"
    if use_c:
        packed = _colpack.pack_columns(
            [(arr, mode, _probe_starts(arr, mode)) for arr, mode, _ in prepared],
            _ZLIB_LEVEL,
            _MIN_COMPRESS_BYTES,
            _DELTA_PROBE_VALUES,
        )
    else:
        packed = [_pack_column(arr, mode) for arr, mode, _ in prepared]
    for (arr, _, out), (delta, shuffle, compressed, data) in zip(prepared, packed):
        out.dtype = _CODES[arr.dtype]
        out.count = arr.size
        out.delta = delta
        out.shuffle = shuffle
        out.codec = pb.CODEC_ZLIB if compressed else pb.CODEC_NONE
        out.data = data


def _pack_column(arr: np.ndarray, mode: int) -> tuple[bool, bool, bool, bytes]:
    """(delta, shuffle, compressed, bytes) of one column, in numpy and the zlib module:
    what _colpack.c does in C."""
    if mode == _CHOOSE and arr.size > 2 and arr.nbytes >= _MIN_COMPRESS_BYTES:
        # (fewer bytes are stored uncompressed either way: both forms the same size)
        starts = _probe_starts(arr, mode)
        if starts is not None:
            mode = _DELTA if _delta_pays(arr, starts) else _PLAIN
        else:
            plain = _pack(arr)
            diffs = _pack(_deltas(arr))
            return (True, *diffs) if len(diffs[2]) < len(plain[2]) else (False, *plain)
    delta = mode == _DELTA and arr.size > 0
    return (delta, *_pack(_deltas(arr) if delta else arr))


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


def _delta_pays(arr: np.ndarray, starts: tuple[int, ...]) -> bool:
    """Whether difference coding compresses a long integer column smaller, judged on a few
    blocks spread over it: compressing the whole column both ways costs twice the zlib time
    for the same choice (bench/ingest.py, B/ev)."""
    plain = diffs = 0
    for s in starts:
        block = arr[s : s + _DELTA_PROBE_VALUES]
        plain += len(_pack(block)[2])
        diffs += len(_pack(_deltas(block))[2])
    return diffs < plain


def _pack(arr: np.ndarray) -> tuple[bool, bool, bytes]:
    """(shuffled, compressed, bytes) of an array: byte planes split, then zlib when it pays."""
    width = arr.dtype.itemsize
    raw = arr.view(np.uint8)
    shuffle = width > 1 and arr.size > 1
    if shuffle:
        raw = raw.reshape(-1, width).T
    codec, data = _compress(raw.tobytes())
    return shuffle, codec == pb.CODEC_ZLIB, data


def _compress(data: bytes) -> tuple[int, bytes]:
    """(codec, bytes): zlib when the data is long enough and compression makes it smaller.

    Written with the standard library's zlib, not ISA-L: the same run must come out byte for
    byte the same from any import (threads, Dask workers, the streaming reader), and ISA-L's
    deflate gave different (valid) streams for the same column in about one import of two
    with a writer thread (3474 vs 3475 bytes). zlib costs ~0.1 s more per 100 MB of JSON."""
    if len(data) >= _MIN_COMPRESS_BYTES:
        packed = zlib.compress(data, _ZLIB_LEVEL)
        if len(packed) < len(data):
            return pb.CODEC_ZLIB, packed
    return pb.CODEC_NONE, data


def _decompress(codec: int, data: bytes, what: str) -> bytes:
    if codec == pb.CODEC_ZLIB:
        try:
            return deflate_module.decompress(data)
        except DEFLATE_ERRORS as exc:
            raise ValueError(f"{what}: corrupt compressed data ({exc})") from None
    if codec != pb.CODEC_NONE:
        raise ValueError(f"{what}: unknown codec {codec}")
    return data


def encode_strings(strings: list[str], out: pb.StringTable) -> None:
    out.count = len(strings)
    out.codec, out.data = _compress(msgspec.json.encode(strings))


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
    data = _decompress(col.codec, col.data, what)
    n = int(col.count)
    if len(data) != n * dtype.itemsize:
        raise ValueError(f"{what}: {len(data)} bytes for {n} values of {dtype.name}")
    raw = np.frombuffer(data, dtype=np.uint8)
    if col.shuffle:
        raw = raw.reshape(dtype.itemsize, n).T
    arr = np.ascontiguousarray(raw).view(dtype).reshape(n)
    if col.delta:
        arr = np.cumsum(arr, dtype=dtype)
    return arr.astype(dtype.newbyteorder("="), copy=False)
