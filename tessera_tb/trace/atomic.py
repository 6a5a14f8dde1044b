"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile


def write_bytes_atomic(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write `data` to `path` through a temporary file in the same directory and a rename.

    `durable`: fsync the file before the rename, so that after a power loss `path` holds the
    old bytes or the new ones. Without it the rename still hides half-written files from
    readers and from a crash of this process; the importer, which builds a run in a hidden
    directory, syncs the whole tree once before it replaces anything (fsync_tree)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def fsync_tree(root: str) -> None:
    """fsync every file and directory under `root` (a tree written with durable=False)."""
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
