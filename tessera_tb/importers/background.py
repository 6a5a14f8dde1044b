"""One piece of numpy work beside another: most of numpy's sorts, gathers and arithmetic
release the GIL, so on two cores two such pieces of a large span take about the time of
the longer one."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

# A span of fewer rows than this does its pieces one after the other, in the calling
# thread: starting and joining a thread costs more than such a span's pieces take.
PARALLEL_ROWS = 20_000


def two_cpus() -> bool:
    """Whether there are two CPUs or more: where the import's work is worth a second thread."""
    return (os.cpu_count() or 1) >= 2


# glibc's mallopt parameters (malloc.h) and what an import sets them to.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_IMPORT_SETTINGS = ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30))
# What the last import to end leaves: glibc's arena limit (8 per CPU), and the thresholds
# where glibc's own adaptation takes a process that frees large blocks (the mmap threshold
# rises to the largest freed, at most 32 MB, and the trim threshold to twice that). Setting
# a threshold turns that adaptation off for good, so glibc's starting values (128 KB) would
# leave every later array over 128 KB to a fresh mapping, numpy's work after an import
# (an analysis in the same process) paying the page faults again each time.
_AFTER_SETTINGS = (
    (_M_ARENA_MAX, 8 * (os.cpu_count() or 1)),
    (_M_MMAP_THRESHOLD, 32 << 20),
    (_M_TRIM_THRESHOLD, 64 << 20),
)
_tuned = 0  # imports running with the settings above
_tuned_lock = threading.Lock()
# When the last import ends, the memory it freed is given back this many seconds later
# (glibc's malloc_trim, in a thread), unless another import starts first and reuses it.
# The trim holds glibc's arena lock while it works (5-10 ms after the 50x copy), so
# whatever the caller allocates meanwhile waits: done at once, it came out of the import's
# own time (and a command-line import, which exits right after, gains nothing from it).
TRIM_DELAY_S = 1.0
_pending_trim: threading.Timer | None = None  # the trim waiting to run, if any


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's mallopt, or None (another C library; TESSERA_MALLOC=default)."""
    if os.environ.get("TESSERA_MALLOC", "import") == "default":
        return None
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def import_malloc():
    """glibc's malloc set for an import while one runs: one arena for every thread, blocks
    of up to 32 MB from the heap rather than mapped afresh, and freed memory kept, not
    given back to the system. A span's columns and temporaries, made and dropped by the
    scanners, the merge, the span's pieces and the steps in several threads, then reuse
    memory already touched: on the 50x copy 30,000-33,000 page faults against
    75,000-77,000, 1.28-1.34 s of CPU against 1.37-1.41 s, and 0.762-0.828 s against
    0.794-0.883 s (6 alternating runs), its peak no higher (196-198 MB against 204-207 MB;
    the 52x one-step copy 214-219 MB against 225-232 MB). When the last import running
    ends, the arena limit is glibc's again and the thresholds are left where glibc's own
    adaptation would take them (_AFTER_SETTINGS), and the freed memory is given back in a
    thread of its own TRIM_DELAY_S later, unless another import starts first (imports one
    after the other, rank after rank on a Dask worker, reuse it instead of touching it
    afresh). Where malloc is not glibc's, or TESSERA_MALLOC=default is set, nothing
    changes."""
    global _tuned, _pending_trim
    mallopt = _mallopt()
    with _tuned_lock:
        applied = mallopt is not None
        if applied and _pending_trim is not None:
            _pending_trim.cancel()  # this import reuses what the last one freed
            _pending_trim = None
        if applied and _tuned == 0:
            # every setting or none: one refused leaves the others as the end would
            if not all([mallopt(k, v) == 1 for k, v in _IMPORT_SETTINGS]):
                for k, v in _AFTER_SETTINGS:
                    mallopt(k, v)
                applied = False
        if applied:
            _tuned += 1
    try:
        yield
    finally:
        if applied:
            with _tuned_lock:
                _tuned -= 1
                if _tuned == 0:
                    for k, v in _AFTER_SETTINGS:
                        mallopt(k, v)
                    _pending_trim = _trim_later(TRIM_DELAY_S)


def release_freed_memory() -> None:
    """Give the memory that other threads freed back to the system (glibc's malloc_trim),
    in a thread of its own: the call takes 2-7 ms on the 50x copy, which the caller's work
    goes on beside (the call releases the GIL, and malloc is safe to use meanwhile). The
    other threads' temporaries were made in per-thread malloc arenas, which the main
    thread's later work does not reuse: kept, they added 100-160 MB of peak on a 592 MB
    file (the two scanners' merge), and some 45 MB on the 52x one-step copy (a span's
    pieces)."""
    if _tuned:  # one arena, memory kept: what is freed is reused (import_malloc)
        return
    _trim_later(0)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def _trim_later(delay: float) -> threading.Timer | None:
    """malloc_trim in a thread of its own `delay` seconds from now (a daemon: an exiting
    process does not wait for it); the timer, which cancel() stops, or None (not glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return None
    timer = threading.Timer(delay, trim, args=(0,))
    timer.name = "tessera-trim"
    timer.daemon = True
    timer.start()
    return timer


class Background:
    """fn(*args), in a thread of its own once `start`ed or in the caller's by `run`;
    `result()` waits for it and returns its value or raises its error (in the caller's
    thread)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._fn, self._args = fn, args
        self._thread: threading.Thread | None = None
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # raised by result()
            self._error = exc
        self._args = ()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="tessera-background", daemon=True)
        self._thread.start()

    def run_or_start(self, rows: int) -> Background:
        """Start it for a span of at least PARALLEL_ROWS rows, else run it now."""
        if rows >= PARALLEL_ROWS:
            self.start()
        else:
            self.run()
        return self

    @property
    def threaded(self) -> bool:
        """Whether it ran in a thread of its own."""
        return self._thread is not None

    def join(self) -> None:
        """Wait for it, its value and error kept for result()."""
        if self._thread is not None:
            self._thread.join()

    def result(self) -> Any:
        self.join()
        if self._error is not None:
            raise self._error
        return self._value
