"""Columns decode to exactly what was encoded, whatever coding the encoder picked."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
import zstandard

from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import columns

RNG = np.random.default_rng(7)
ARRAYS = {
    "empty": (np.zeros(0, np.int64), "int64"),
    "one": (np.array([42], np.int64), "int64"),
    "ascending_ns": (np.cumsum(RNG.integers(0, 5000, 10_000)) + 1_795_329_702_837_034_000, "int64"),
    "negative": (RNG.integers(-(2**40), 2**40, 5000), "int64"),
    "ids": (RNG.integers(0, 400, 20_000), "int32"),
    "kinds": (RNG.integers(0, 17, 3000), "uint8"),
    "floats": (RNG.normal(size=4000), "float64"),
    "extremes": (np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max]), "int64"),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("delta", [None, True, False])
def test_round_trip(name, delta):
    values, dtype = ARRAYS[name]
    col = pb.Column()
    if delta and np.dtype(dtype).kind != "i":
        with pytest.raises(ValueError, match="only for integers"):
            columns.encode(values, dtype, delta=delta, out=col)
        return
    columns.encode(values, dtype, delta=delta, out=col)
    back = columns.decode(pb.Column.FromString(col.SerializeToString()))
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, values)


def test_auto_delta_picks_the_smaller_coding():
    values, _ = ARRAYS["ascending_ns"]
    auto, plain = pb.Column(), pb.Column()
    columns.encode(values, "int64", out=auto)
    columns.encode(values, "int64", delta=False, out=plain)
    assert auto.delta and len(auto.data) < len(plain.data)


def test_corrupt_data_raises_value_error_naming_the_column():
    col = pb.Column()
    columns.encode(ARRAYS["ids"][0], "int32", out=col)
    col.data = col.data[:-10]
    with pytest.raises(ValueError, match="events.name_id"):
        columns.decode(col, what="events.name_id")


def _zstd_column(values: np.ndarray, dtype: str) -> pb.Column:
    col = pb.Column()
    columns.encode(values, dtype, delta=False, out=col)
    assert col.codec == pb.CODEC_ZSTD
    return col


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[:-10], "did not decompress full frame|corrupt"),
        (lambda data: data + b"\0", "unused data"),
        (lambda data: b"\x28\xb5\x2f\xfd" + b"\xff" * 12, "corrupt compressed data"),
        (lambda data: b"not a zstd frame at all", "corrupt compressed data"),
    ],
    ids=["truncated", "trailing-bytes", "bad-header", "garbage"],
)
def test_a_damaged_zstd_frame_is_refused_naming_the_column(damage, message):
    col = _zstd_column(ARRAYS["ids"][0], "int32")
    col.data = damage(col.data)
    with pytest.raises(ValueError, match="events.name_id") as err:
        columns.decode(col, what="events.name_id")
    assert err.match(message)


def test_a_frame_that_claims_another_size_is_refused_before_it_is_inflated():
    """A frame whose header gives another length than count x itemsize (here a huge one) is
    refused from the header alone: nothing of that size is allocated."""
    col = _zstd_column(ARRAYS["ids"][0], "int32")
    col.count = 10**12
    with pytest.raises(ValueError, match="80,000 bytes, 4,000,000,000,000 expected"):
        columns.decode(col, what="events.name_id")
    # a frame made without its content size in the header: refused too
    col = _zstd_column(ARRAYS["ids"][0], "int32")
    raw = np.asarray(ARRAYS["ids"][0], "<i4").view(np.uint8).reshape(-1, 4).T.tobytes()
    col.data = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    with pytest.raises(ValueError, match="unknown number of bytes"):
        columns.decode(col, what="events.name_id")


def test_schema_1_zlib_columns_and_string_tables_still_decode():
    """What 1.x wrote: zlib streams (CODEC_ZLIB), laid out as today."""
    values = ARRAYS["ascending_ns"][0]
    diffs = np.diff(values, prepend=0).astype("<i8")
    col = pb.Column(dtype=pb.INT64, codec=pb.CODEC_ZLIB, count=values.size, delta=True)
    col.shuffle = True
    col.data = zlib.compress(diffs.view(np.uint8).reshape(-1, 8).T.tobytes(), 1)
    np.testing.assert_array_equal(columns.decode(col), values)
    strings = ["", "aten::mm", "naïve"] * 30
    text = json.dumps(strings, separators=(",", ":"), ensure_ascii=False).encode()
    table = pb.StringTable(codec=pb.CODEC_ZLIB, count=len(strings), data=zlib.compress(text, 1))
    assert columns.decode_strings(table) == strings
    table.data = table.data[:-4]
    with pytest.raises(ValueError, match="string table: corrupt compressed data"):
        columns.decode_strings(table)


def test_a_string_table_that_would_inflate_past_the_limit_is_refused(monkeypatch):
    table = pb.StringTable()
    columns.encode_strings(["aten::mm"] * 300, table)
    assert table.codec == pb.CODEC_ZSTD
    monkeypatch.setattr(columns, "_MAX_INFLATED", 1000)
    with pytest.raises(ValueError, match="string table: corrupt compressed data \\(3,301 bytes"):
        columns.decode_strings(table)


def test_strings_round_trip_including_unicode_and_nul():
    table = pb.StringTable()
    strings = ["", "aten::mm", "void cutlass::Kernel<...>", "naïve\x00name", "<img src=x>"] * 20
    columns.encode_strings(strings, table)
    assert columns.decode_strings(table) == strings
