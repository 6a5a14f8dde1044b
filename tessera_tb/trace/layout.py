"""Where things live in a log directory (docs/FORMAT.md, "Layout").

    <logdir>/<run>/plugins/tessera/<worker>/meta.pb
    <logdir>/<run>/plugins/tessera/<worker>/step_00000012.pb
    <logdir>/<run>/events.out.tfevents.*

Run and worker names come from users and from trace files, so they are checked here and
never joined into a path unchecked.
"""

from __future__ import annotations

import os
import re

PLUGIN_NAME = "tessera"
PLUGIN_SUBDIR = os.path.join("plugins", PLUGIN_NAME)
META_FILE = "meta.pb"

_WORKER_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_UNSAFE_WORKER_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def step_file_name(step: int) -> str:
    """`step_00000012.pb`; a negative step number keeps its sign in front of 8 digits."""
    return f"step_{'-' if step < 0 else ''}{abs(step):08d}.pb"


def check_run_name(run: str) -> str:
    """Return `run` if it is a safe relative run path ("exp1" or "group/exp1"), else raise."""
    if not run or "\x00" in run or "\\" in run:
        raise ValueError(f"invalid run name {run!r}")
    parts = run.split("/")
    if os.path.isabs(run) or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        raise ValueError(
            f"invalid run name {run!r}: use a relative path without '.', '..' or hidden parts"
        )
    return run


def safe_worker_name(name: str) -> str:
    """Turn a name from a trace file into a worker directory name ("rank0", "host_123")."""
    cleaned = _UNSAFE_WORKER_CHARS.sub("_", name).strip("._-")[:128]
    return cleaned or "worker"


def check_worker_name(worker: str) -> str:
    if not _WORKER_OK.match(worker):
        raise ValueError(f"invalid worker name {worker!r}: letters, digits, '.', '_', '-' only")
    return worker


def plugin_dir(run_dir: str) -> str:
    return os.path.join(run_dir, PLUGIN_SUBDIR)


def worker_dir(run_dir: str, worker: str) -> str:
    return os.path.join(plugin_dir(run_dir), check_worker_name(worker))


def find_runs(logdir: str) -> dict[str, str]:
    """Map run name (relative path, '/'-separated, "." for the logdir itself) -> run directory.

    A run is any directory that holds `plugins/tessera/`. Hidden directories (such as an
    import in progress) are skipped.
    """
    runs: dict[str, str] = {}
    logdir = os.path.abspath(logdir)
    for dirpath, dirnames, _ in os.walk(logdir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if os.path.isdir(os.path.join(dirpath, PLUGIN_SUBDIR)):
            rel = os.path.relpath(dirpath, logdir)
            runs["." if rel == "." else rel.replace(os.sep, "/")] = dirpath
        if "plugins" in dirnames:
            dirnames.remove("plugins")
    return runs
