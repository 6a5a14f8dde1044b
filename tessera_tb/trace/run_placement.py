"""Putting a finished run directory in place, exclusively, and cleaning up after killed writers.

A run is built in a hidden staging directory beside its destination (same file system) and
renamed into place whole. Of two writers of one run:
  - without overwrite, exactly one wins: a rename onto an existing, non-empty run directory fails
    (ENOTEMPTY/EEXIST), and the loser raises RunExists having left nothing behind;
  - with overwrite, the later one replaces the earlier one as a whole. On Linux the two
    directories are exchanged atomically (renameat2 RENAME_EXCHANGE), so there is no moment
    without a run; elsewhere the old run is parked beside it for the two renames.

A staging directory's name says which process owns it (`.tessera-import-<host>-<pid>-<random>`),
so the next writer into that directory removes those whose owner is gone (`kill -9`, power loss)
and never one still in use. Run discovery skips hidden directories (layout.find_runs).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import socket

_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class RunExists(OSError):
    """The destination run appeared (another writer won) and overwrite was not asked for."""


def make_staging_dir(parent: str, kind: str = "import") -> str:
    """A new hidden directory `parent/.tessera-<kind>-<host>-<pid>-<random>`, with the
    permissions a plain mkdir gives (it becomes the run: tempfile.mkdtemp's owner-only mode
    would hide it from other users)."""
    while True:
        path = os.path.join(parent, f".tessera-{kind}-{_HOST}-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def _owner_gone(name: str) -> bool:
    """True for a staging or parking directory of this host whose process no longer runs."""
    parts = name.split("-")
    # .tessera / kind / host / pid / random[.replaced]
    if len(parts) != 5 or parts[0] != ".tessera" or parts[2] != _HOST or not parts[3].isdigit():
        return False
    pid = int(parts[3])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def remove_stale_staging(parent: str) -> list[str]:
    """Remove the staging directories in `parent` left by writers of this host that are gone;
    returns their paths. Directories of live processes and of other hosts are left alone."""
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if name.startswith(".tessera-") and _owner_gone(name):
            path = os.path.join(parent, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not hasattr(os, "sched_getaffinity"):  # not Linux
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False  # a file system without exchange
    raise OSError(err, os.strerror(err), b)


def place_run(staging: str, dest: str, *, overwrite: bool) -> None:
    """Move the finished run `staging` to `dest`. Without `overwrite`, raises RunExists when
    `dest` exists (another writer finished first); `staging` is then left to the caller to
    remove. With `overwrite`, an existing `dest` is replaced whole; the old run ends up in
    `staging`'s place (or is removed) and the caller removes what is left there."""
    for _ in range(100):
        try:
            os.rename(staging, dest)  # fails on an existing non-empty directory
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
        if not overwrite:
            raise RunExists(errno.EEXIST, "run already exists", dest)
        try:
            if _exchange(staging, dest):
                return  # staging now holds the old run
        except FileNotFoundError:
            continue  # the old run went meanwhile: plain rename again
        parking = staging + ".replaced"
        try:
            os.rename(dest, parking)
        except FileNotFoundError:
            continue
        try:
            os.rename(staging, dest)
        except OSError:
            os.rename(parking, dest)
            raise
        shutil.rmtree(parking, ignore_errors=True)
        return
    raise RunExists(errno.EEXIST, "run keeps being replaced by other writers", dest)
