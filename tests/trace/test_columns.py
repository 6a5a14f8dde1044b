"""Columns decode to exactly what was encoded, whatever coding the encoder picked."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_strings_round_trip_including_unicode_and_nul():
    table = pb.StringTable()
    strings = ["", "aten::mm", "void cutlass::Kernel<...>", "naïve\x00name", "<img src=x>"] * 20
    columns.encode_strings(strings, table)
    assert columns.decode_strings(table) == strings
