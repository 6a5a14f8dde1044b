"""Array helpers the importer's hot paths share."""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` of a 1-D integer array, its distinct values sorted, by a sort.

    numpy 2.4's `unique` hashes integers and is 5-40x slower than sorting them: 25 ms
    against 3 ms for 463k string ids of 20,000 distinct values, 8.7 ms against 0.9 ms for
    50 distinct values. The importer calls it on every event's ids of a file."""
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
