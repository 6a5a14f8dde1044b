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


def encode(values: np.ndarray, dtype: str, *, delta: bool | None = None, out: pb.Column) -> None:
    """Fill `out` with `values` stored as `dtype` (little-endian).

    `delta`: True/False forces difference coding; None (the default) tries both for
    integer columns and keeps the smaller (offsets and ids shrink, names do not).
    """
    arr = np.ascontiguousarray(values, dtype=_LITTLE[dtype])
    out.dtype = _CODES[arr.dtype]
    out.count = arr.size
    if delta is None and arr.dtype.kind == "i" and arr.size > 2:
        if arr.nbytes < _MIN_COMPRESS_BYTES:
            delta = False  # stored uncompressed either way, so both forms are the same size
        elif arr.size > _DELTA_PROBE_BLOCKS * _DELTA_PROBE_VALUES * 2:
            delta = _delta_pays(arr)
        else:
            plain = _pack(arr)
            diffs = _pack(_deltas(arr))
            out.delta = len(diffs[2]) < len(plain[2])
            out.shuffle, out.codec, out.data = diffs if out.delta else plain
            return
    if delta and arr.dtype.kind != "i":
        raise ValueError(f"delta coding is exact only for integers, not {arr.dtype}")
    if delta and arr.size:
        arr = _deltas(arr)
        out.delta = True
    out.shuffle, out.codec, out.data = _pack(arr)


def _deltas(arr: np.ndarray) -> np.ndarray:
    """Differences from the previous value, the first from 0 (np.diff with prepend=0)."""
    out = np.empty_like(arr)
    if arr.size:
        out[0] = arr[0]
        np.subtract(arr[1:], arr[:-1], out=out[1:])
    return out


def _delta_pays(arr: np.ndarray) -> bool:
    """Whether difference coding compresses a long integer column smaller, judged on a few
    blocks spread over it: compressing the whole column both ways costs twice the zlib time
    for the same choice (bench/ingest.py, B/ev)."""
    n = arr.size
    width = _DELTA_PROBE_VALUES
    starts = np.linspace(0, n - width, _DELTA_PROBE_BLOCKS).astype(np.int64).tolist()
    plain = diffs = 0
    for s in starts:
        block = arr[s : s + width]
        plain += len(_pack(block)[2])
        diffs += len(_pack(_deltas(block))[2])
    return diffs < plain


def _pack(arr: np.ndarray) -> tuple[bool, int, bytes]:
    """(shuffled, codec, bytes) of an array: byte planes split, then zlib when it pays."""
    width = arr.dtype.itemsize
    raw = arr.view(np.uint8)
    shuffle = width > 1 and arr.size > 1
    if shuffle:
        raw = raw.reshape(-1, width).T
    return (shuffle, *_compress(raw.tobytes()))


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
