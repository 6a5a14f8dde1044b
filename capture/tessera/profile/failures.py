"""How the capture layer reports problems without stopping the user's training loop.

A source that fails is disabled, a full disk or an unwritable directory stops the capture,
and each problem becomes one `TesseraWarning`. Problems found on a background thread are
queued here and emitted on the training thread at its next `step()` (or at the end of the
session), so they appear where the user's loop is and `warnings` filters apply as usual.
"""

from __future__ import annotations

import collections
import threading
import warnings


class TesseraWarning(UserWarning):
    """A capture problem that did not interrupt training (a source disabled, capture stopped)."""


class WarningBox:
    """Warnings keyed by problem: each key is warned about once per session."""

    def __init__(self) -> None:
        self._pending: collections.deque[str] = collections.deque()
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def add(self, key: str, message: str) -> None:
        """Queue `message` unless a warning with the same key was queued before."""
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            self._pending.append(message)

    def seen(self, key: str) -> bool:
        return key in self._seen

    def __bool__(self) -> bool:
        return bool(self._pending)

    def emit(self, stacklevel: int = 3) -> None:
        """Issue the queued warnings on the calling thread."""
        while self._pending:
            try:
                message = self._pending.popleft()
            except IndexError:
                return
            warnings.warn(message, TesseraWarning, stacklevel=stacklevel)
