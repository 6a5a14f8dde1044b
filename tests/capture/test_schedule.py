"""The session's schedule says what torch.profiler.schedule says, step by step."""

from __future__ import annotations

import contextlib
import itertools

import pytest

from tessera.profile import schedule as make_schedule
from tessera.profile.scheduling import NONE, RECORD, RECORD_AND_SAVE, WARMUP


def test_actions_match_torch_profiler_schedule_for_every_step():
    torch_profiler = pytest.importorskip("torch.profiler")
    names = {
        torch_profiler.ProfilerAction.NONE: NONE,
        torch_profiler.ProfilerAction.WARMUP: WARMUP,
        torch_profiler.ProfilerAction.RECORD: RECORD,
        torch_profiler.ProfilerAction.RECORD_AND_SAVE: RECORD_AND_SAVE,
    }
    for wait, warmup, active, repeat, skip_first in itertools.product(
        (0, 1, 3), (0, 1, 2), (1, 3), (0, 1, 2), (0, 10)
    ):
        ours = make_schedule(
            wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
        )
        with pytest.warns(UserWarning) if warmup == 0 else contextlib.nullcontext():
            theirs = torch_profiler.schedule(
                wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
            )
        for step in range(60):
            assert ours.action(step) == names[theirs(step)], (wait, warmup, active, repeat, step)


def test_the_brief_example_records_steps_12_to_14_and_17_to_19():
    s = make_schedule(skip_first=10, wait=1, warmup=1, active=3, repeat=2)
    assert s.active_steps(40) == [12, 13, 14, 17, 18, 19]


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError):
        make_schedule(active=0)
    with pytest.raises(ValueError):
        make_schedule(wait=-1)
