from __future__ import annotations

import os

import pytest

from tessera_tb.backend.selection import resolve_steps, steady_state_step, step_times_ms
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS


def test_steady_state_step_is_the_median_one_after_the_first():
    run = open_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"))
    times = step_times_ms(run, "rank0")
    later = {s: t for s, t in times.items() if s != min(times)}
    chosen = steady_state_step(run, "rank0")
    assert chosen in later
    ordered = sorted(later.values())
    assert times[chosen] in (ordered[(len(ordered) - 1) // 2], ordered[len(ordered) // 2])


def test_unknown_steps_are_a_clear_error():
    run = open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    assert resolve_steps(run, None) == [4, 5]
    with pytest.raises(ValueError, match=r"no step\(s\) \[9\]"):
        resolve_steps(run, [4, 9])
