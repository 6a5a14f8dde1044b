"""Interval arithmetic on numpy arrays (no per-interval Python loop)."""

from __future__ import annotations

import numpy as np

try:  # the C form of union_length_ns, where the package's C modules were built
    from tessera_tb.trace._colpack import union_length as _c_union_length
except ImportError:  # pragma: no cover - built without a C compiler
    _c_union_length = None


def merged_segments(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted segments [seg_start, seg_end) covering the union of [starts, ends)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new segment starts where an interval begins after everything before it ended.
    new_seg = np.empty(s.size, dtype=bool)
    new_seg[0] = True
    new_seg[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_seg)
    # `reach` never decreases, so a segment ends at the reach of its last interval.
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def union_length_ns(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> int:
    """Length of the union of [starts, ends) clipped to [lo, hi), in ns."""
    if _c_union_length is not None:
        # one C call (a radix sort and a sweep): an importer computes GPU busy % for every
        # step, and the numpy form below takes some twenty calls
        return _c_union_length(
            np.ascontiguousarray(starts, dtype=np.int64),
            np.ascontiguousarray(ends, dtype=np.int64),
            int(lo),
            int(hi),
        )
    return union_length_ns_numpy(starts, ends, lo, hi)


def union_length_ns_numpy(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> int:
    """union_length_ns in numpy (where the C module was not built)."""
    # np.minimum(np.maximum(...)) is np.clip, at half its cost per call on a step's few
    # thousand intervals
    s = np.minimum(np.maximum(np.asarray(starts, dtype=np.int64), lo), hi)
    e = np.minimum(np.maximum(np.asarray(ends, dtype=np.int64), lo), hi)
    seg_start, seg_end = merged_segments(s, e)
    return int((seg_end - seg_start).sum())
