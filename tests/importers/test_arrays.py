"""The importer's array helpers give what numpy's own functions give."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tb.importers.arrays import distinct


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.uint16])
def test_distinct_is_numpys_unique(dtype):
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    for size in (0, 1, 2, 3, 17, 1000, 50_000):
        for high in (1, 2, 50, 20_000):
            low = max(info.min, -high)
            values = rng.integers(low, min(high, info.max), size, endpoint=True).astype(dtype)
            got, want = distinct(values), np.unique(values)
            assert got.dtype == want.dtype
            assert got.tolist() == want.tolist()
    extremes = np.array([info.max, info.min, 0, info.max, info.min], dtype=dtype)
    assert distinct(extremes).tolist() == np.unique(extremes).tolist()


def test_distinct_leaves_its_input_alone():
    values = np.array([5, 1, 5, 3], dtype=np.int64)
    distinct(values)
    assert values.tolist() == [5, 1, 5, 3]
