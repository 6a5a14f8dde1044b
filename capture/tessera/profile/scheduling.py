"""Which steps a session records: the same schedule as `torch.profiler.schedule`.

Steps are numbered from 0 by the session (the number of `sess.step()` calls so far), as
torch numbers its `ProfilerStep#N` markers. A cycle is `wait` idle steps, `warmup` steps in
which the profiler runs but keeps nothing, then `active` recorded steps; the last active
step of a cycle ends a window, whose trace is handed to the background writer. The first
`skip_first` steps are never part of a cycle; `repeat` cycles are run (0: until the session
ends, bounded by the session's `max_steps` and `max_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

NONE = "none"
WARMUP = "warmup"
RECORD = "record"
RECORD_AND_SAVE = "record_and_save"


@dataclass(frozen=True)
class Schedule:
    """A profiling schedule; `action(step)` says what happens in a step."""

    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    skip_first: int = 0

    def __post_init__(self) -> None:
        if (
            self.wait < 0
            or self.warmup < 0
            or self.active <= 0
            or self.repeat < 0
            or self.skip_first < 0
        ):
            raise ValueError(
                f"invalid schedule: wait={self.wait}, warmup={self.warmup} (need >= 0), "
                f"active={self.active} (need > 0), repeat={self.repeat}, "
                f"skip_first={self.skip_first} (need >= 0)"
            )

    @property
    def cycle_steps(self) -> int:
        return self.wait + self.warmup + self.active

    def action(self, step: int) -> str:
        """`none`, `warmup`, `record` or `record_and_save` (the last active step of a cycle).

        The same answer as `torch.profiler.schedule` with these arguments.
        """
        if step < self.skip_first:
            return NONE
        step -= self.skip_first
        n = self.cycle_steps
        if self.repeat > 0 and step >= self.repeat * n:
            return NONE
        mod = step % n
        if mod < self.wait:
            return NONE
        if mod < self.wait + self.warmup:
            return WARMUP
        return RECORD if mod < n - 1 else RECORD_AND_SAVE

    def is_active(self, step: int) -> bool:
        """Whether `step` is recorded (and so written to the run)."""
        return self.action(step) in (RECORD, RECORD_AND_SAVE)

    def active_steps(self, upto: int) -> list[int]:
        """The recorded steps among 0 .. upto-1."""
        return [s for s in range(upto) if self.is_active(s)]


def schedule(
    *, wait: int = 1, warmup: int = 1, active: int = 3, repeat: int = 1, skip_first: int = 0
) -> Schedule:
    """A profiling schedule (same arguments and meaning as `torch.profiler.schedule`)."""
    return Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
