"""union_length_ns: the C pass and the numpy form against a count of covered points."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tb.backend import intervals


def _covered(starts, ends, lo, hi) -> int:
    """The points of [lo, hi) inside some [start, end): counted one by one."""
    return sum(any(s <= t < e for s, e in zip(starts, ends)) for t in range(lo, hi))


def _forms():
    forms = [intervals.union_length_ns_numpy]
    if intervals._c_union_length is not None:
        forms.append(intervals.union_length_ns)
    return forms


@pytest.mark.parametrize("form", _forms(), ids=lambda f: f.__name__)
def test_union_length_is_the_count_of_covered_points(form):
    rng = np.random.default_rng(7)
    cases = [
        ([], [], 0, 10),
        ([5], [5], 0, 10),  # empty
        ([8], [3], 0, 10),  # reversed: empty
        ([0, 4], [4, 9], 0, 10),  # touching
        ([-20, 30], [-10, 40], 0, 10),  # all outside
        ([2, 1, 0], [9, 3, 20], 0, 10),  # unsorted, nested, past the end
        ([3], [7], 5, 2),  # lo past hi
        ([6, 1], [4, 9], 5, 2),  # lo past hi, one interval reversed across them
    ]
    for _ in range(600):  # overlapping, unsorted, some outside [lo, hi)
        n = int(rng.integers(0, 40))
        starts = rng.integers(-30, 300, n)
        ends = starts + rng.integers(-5, 60, n)
        lo, hi = rng.integers(-40, 320, 2).tolist()  # lo past hi in about half: empty
        cases.append((starts.tolist(), ends.tolist(), lo, hi))
    for starts, ends, lo, hi in cases:
        want = _covered(starts, ends, lo, hi)
        got = form(np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), lo, hi)
        assert got == want, (starts, ends, lo, hi)
        assert isinstance(got, int)


def test_union_length_agrees_far_from_zero_and_over_wide_spans():
    """Offsets of every width (the C sort takes a pass per byte), times in ns since the
    epoch, and int64's ends."""
    rng = np.random.default_rng(11)
    top = np.iinfo(np.int64).max
    for base, width in ((1_790_000_000 * 10**9, 10**9), (-(2**62), 2**62), (0, 2**40), (0, 300)):
        for _ in range(50):
            starts = base + rng.integers(0, width, 500)
            ends = starts + rng.integers(0, width // 50 + 2, 500)
            lo, hi = base + width // 10, base + width - width // 10
            want = intervals.union_length_ns_numpy(starts, ends, lo, hi)
            assert intervals.union_length_ns(starts, ends, lo, hi) == want
    if intervals._c_union_length is not None:  # (past int64, which numpy's sum wraps)
        edge = np.array([-top - 1, 0, top - 5]), np.array([-5, 7, top])
        assert intervals.union_length_ns(*edge, -top - 1, top) == 2**63 - 5 + 7 + 5
