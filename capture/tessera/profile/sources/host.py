"""The host-only source: regions, marks, user counters and step timing, without torch or a GPU.

On the training thread recording is a clock read and a list append; everything else (numpy
columns, tracks, strings) is built on the background thread from a `HostBatch`, one per
recorded step. Times are epoch ns from `time.time_ns()`, the clock Kineto's host events
use, so regions line up with the profiler's ops (checked to a few µs).

- `region(name)`: a named interval on the calling thread's track (kind `region`); nestable,
  usable as a context manager or a decorator. A region is stored with the step in which it
  ends (its start may lie in the step before).
- marks (`sess.mark(name)`): instant events (kind `mark`) on the calling thread's track.
- `counter(name, value, unit)`: a user counter sample, a `CounterSeries` with source `user`.

This module imports nothing heavy (no numpy, no torch); `host_steps.py` builds the columns.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, field


@dataclass
class HostBatch:
    """What the host source recorded in one step (epoch ns)."""

    step: int
    start_ns: int
    end_ns: int
    regions: list[tuple[int, int, str, int]] = field(default_factory=list)  # start, end, name, tid
    marks: list[tuple[int, str, int]] = field(default_factory=list)  # ts, name, tid
    counters: list[tuple[int, str, float, str]] = field(
        default_factory=list
    )  # ts, name, value, unit
    thread_names: dict[int, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.regions or self.marks or self.counters)


class HostRecorder:
    """Collects regions, marks and counters while `recording` is set (an active step)."""

    def __init__(self) -> None:
        self.recording = False
        self.pid = os.getpid()
        self._regions: list[tuple[int, int, str, int]] = []
        self._marks: list[tuple[int, str, int]] = []
        self._counters: list[tuple[int, str, float, str]] = []
        self._thread_names: dict[int, str] = {}

    def _tid(self) -> int:
        tid = threading.get_native_id()
        if tid not in self._thread_names:
            self._thread_names[tid] = threading.current_thread().name
        return tid

    def add_region(self, name: str, start_ns: int, end_ns: int) -> None:
        if self.recording:
            self._regions.append((start_ns, end_ns, name, self._tid()))

    def add_mark(self, name: str) -> None:
        if self.recording:
            self._marks.append((time.time_ns(), name, self._tid()))

    def add_counter(self, name: str, value: float, unit: str) -> None:
        if self.recording:
            self._counters.append((time.time_ns(), name, float(value), unit))

    def take(self, step: int, start_ns: int, end_ns: int) -> HostBatch:
        """Hand over what was recorded since the last call, as the batch of `step`."""
        batch = HostBatch(
            step, start_ns, end_ns, self._regions, self._marks, self._counters,
            dict(self._thread_names),
        )  # fmt: skip
        self._regions, self._marks, self._counters = [], [], []
        return batch

    def discard(self) -> None:
        self._regions, self._marks, self._counters = [], [], []


# The recorder of the session that is running in this process (None: regions are no-ops).
_current: HostRecorder | None = None
# The running session's NVTX markers (nvtx_markers.NvtxMarkers), None without CUDA: regions
# then also open an NVTX push/pop range of their name.
_nvtx = None


def set_current(recorder: HostRecorder | None, nvtx=None) -> None:
    global _current, _nvtx
    _current = recorder
    _nvtx = nvtx


class region:  # noqa: N801 (used like a function: `with profile.region("fwd"):`)
    """A named region on the calling thread's track: `with region("forward/attention"): ...`.

    Also a decorator: `@region("data")` records every call of the function. Regions nest;
    outside a running session, or in a step that is not recorded, a region costs two clock
    reads and records nothing.
    """

    __slots__ = ("name", "_starts")

    def __init__(self, name: str):
        self.name = str(name)
        self._starts: list[int] = []

    def __enter__(self) -> region:
        if _nvtx is not None:
            _nvtx.push(self.name)
        self._starts.append(time.time_ns())
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        end_ns = time.time_ns()
        start_ns = self._starts.pop()
        if _nvtx is not None:
            _nvtx.pop()
        recorder = _current
        if recorder is not None:
            recorder.add_region(self.name, start_ns, end_ns)
        return False

    def __call__(self, func):
        name = self.name

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with region(name):
                return func(*args, **kwargs)

        return wrapper


def counter(name: str, value: float, unit: str = "") -> None:
    """Record one sample of a user counter (e.g. `counter(name="loss", value=0.3, unit="scalar")`).

    Stored as a counter track with source `user` in the step in which it was recorded.
    """
    recorder = _current
    if recorder is not None:
        recorder.add_counter(str(name), value, str(unit))


def mark(name: str) -> None:
    """An instant event on the calling thread's track (what `sess.mark` records)."""
    recorder = _current
    if recorder is not None:
        recorder.add_mark(str(name))
