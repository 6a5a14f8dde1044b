"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory, fsync'ed, and a
    rename: after a crash or a power loss `path` holds the old bytes or the new ones."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def fsync_tree(root: str) -> None:
    """fsync every file and directory under `root` (a staged tree, written plainly, before
    it is renamed into place)."""
    for directory, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
