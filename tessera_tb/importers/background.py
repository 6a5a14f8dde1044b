"""One piece of numpy work beside another: most of numpy's sorts, gathers and arithmetic
release the GIL, so on two cores two such pieces of a large span take about the time of
the longer one."""

from __future__ import annotations

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


def release_freed_memory() -> None:
    """Give the memory that other threads freed back to the system (glibc's malloc_trim),
    in a thread of its own: the call takes 2-7 ms on the 50x copy, which the caller's work
    goes on beside (the call releases the GIL, and malloc is safe to use meanwhile). The
    other threads' temporaries were made in per-thread malloc arenas, which the main
    thread's later work does not reuse: kept, they added 100-160 MB of peak on a 592 MB
    file (the two scanners' merge), and some 45 MB on the 52x one-step copy (a span's
    pieces)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    threading.Thread(target=trim, args=(0,), name="tessera-trim", daemon=True).start()


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
