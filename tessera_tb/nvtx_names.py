"""NVTX range names the capture session opens and `tessera-prof counters` filters on.

Importing this module imports nothing else (the session imports it at start-up).
Step N is a start/end range `tessera_step_N` in NVTX's default domain (docs/CAPTURE.md).
"""

STEP_RANGE = "tessera_step_{}"
STEP_RANGE_PREFIX = "tessera_step_"


def step_range_name(step: int) -> str:
    """The NVTX range name of step `step` (`tessera_step_3`)."""
    return STEP_RANGE.format(int(step))


def step_of_range(name: str) -> int | None:
    """The step of a range name (`tessera_step_3` -> 3), None for any other name."""
    if not name.startswith(STEP_RANGE_PREFIX):
        return None
    tail = name[len(STEP_RANGE_PREFIX) :]
    return int(tail) if tail.isdigit() else None
