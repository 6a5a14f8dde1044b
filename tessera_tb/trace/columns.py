"""Encode numpy arrays into `Column` messages and back (docs/FORMAT.md, "Columns")."""

from __future__ import annotations

import zlib

import numpy as np

from tessera_tb.proto import trace_pb2 as pb

_DTYPES = {
    pb.INT8: np.dtype("<i1"),
    pb.UINT8: np.dtype("<u1"),
    pb.INT32: np.dtype("<i4"),
    pb.INT64: np.dtype("<i8"),
    pb.FLOAT64: np.dtype("<f8"),
}
_CODES = {dt: code for code, dt in _DTYPES.items()}

# zlib level 1 compresses the shuffled columns nearly as well as level 6 at a
# fraction of the time (bench/ingest.py prints bytes per event).
_ZLIB_LEVEL = 1
_MIN_COMPRESS_BYTES = 64


def encode(values: np.ndarray, dtype: str, *, delta: bool = False, out: pb.Column) -> None:
    """Fill `out` with `values` stored as `dtype` (little-endian), delta-coded if asked."""
    arr = np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<"))
    out.dtype = _CODES[arr.dtype]
    out.count = arr.size
    if delta and arr.size:
        arr = np.diff(arr, prepend=arr.dtype.type(0))
        out.delta = True
    width = arr.dtype.itemsize
    raw = arr.view(np.uint8)
    if width > 1 and arr.size > 1:
        raw = raw.reshape(-1, width).T
        out.shuffle = True
    data = raw.tobytes()
    if len(data) >= _MIN_COMPRESS_BYTES:
        out.codec = pb.CODEC_ZLIB
        data = zlib.compress(data, _ZLIB_LEVEL)
    out.data = data


def decode(col: pb.Column, *, path: str = "<memory>", what: str = "column") -> np.ndarray:
    """Return the numpy array that `col` holds; raises ValueError naming `what` if it is corrupt."""
    dtype = _DTYPES.get(col.dtype)
    if dtype is None:
        if col.count == 0 and not col.data:
            return np.zeros(0, dtype=np.int64)
        raise ValueError(f"{what}: unknown dtype code {col.dtype}")
    data = col.data
    if col.codec == pb.CODEC_ZLIB:
        try:
            data = zlib.decompress(data)
        except zlib.error as exc:
            raise ValueError(f"{what}: corrupt compressed data ({exc})") from None
    elif col.codec != pb.CODEC_NONE:
        raise ValueError(f"{what}: unknown codec {col.codec}")
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
