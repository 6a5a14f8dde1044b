"""Where things live in a log directory (docs/FORMAT.md, "Layout").

    <logdir>/<run>/plugins/tessera/<worker>/meta.pb
    <logdir>/<run>/plugins/tessera/<worker>/step_00000012.pb
    <logdir>/<run>/events.out.tfevents.*

Run and worker names come from users and from trace files, so they are checked here and
never joined into a path unchecked.

A run's files live in a directory, in a bundle (`exp1.tessera.zip`, read in place:
`trace/bundle.py`) or under an fsspec URL (`s3://bucket/runs/exp1`: `trace/remote.py`).
`run_files(path)` returns the `RunFiles` that reads a path of any of them; paths inside a
bundle are written as if the bundle were a directory (`exp1.tessera.zip/plugins/tessera/...`).
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


def new_capture_dir(run_dir: str, worker: str) -> str:
    """Where a new capture session of `worker` writes, given the run directory it was asked
    for: `run_dir` itself while that holds no capture of `worker`, else the first of
    `run_dir/capture-2`, `capture-3`, ... that holds none. Each is a run of its own (listed as
    `exp1/capture-2`), so an earlier session's steps are never replaced nor mixed with the
    new ones; the ranks of one job, starting alike, pick the same one."""
    n = 1
    while True:
        candidate = run_dir if n == 1 else os.path.join(run_dir, f"capture-{n}")
        if not os.path.exists(os.path.join(worker_dir(candidate, worker), META_FILE)):
            return candidate
        n += 1


def find_runs(logdir: str, *, bundles: bool = False) -> dict[str, str]:
    """Map run name (relative path, '/'-separated, "." for the logdir itself) -> run directory.

    A run is any directory that holds `plugins/tessera/`. Hidden directories (such as an
    import in progress) are skipped. With `bundles`, every non-hidden `*.tessera.zip` file is
    a run too, named by its relative path with the suffix (`group/exp1.tessera.zip`), mapped
    to the bundle's path (open it with `open_run` like a directory).
    """
    runs: dict[str, str] = {}
    logdir = os.path.abspath(logdir)
    for dirpath, dirnames, filenames in os.walk(logdir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if os.path.isdir(os.path.join(dirpath, PLUGIN_SUBDIR)):
            rel = os.path.relpath(dirpath, logdir)
            runs["." if rel == "." else rel.replace(os.sep, "/")] = dirpath
        if bundles:
            for f in sorted(filenames):
                if f.endswith(BUNDLE_SUFFIX) and not f.startswith("."):
                    path = os.path.join(dirpath, f)
                    runs[os.path.relpath(path, logdir).replace(os.sep, "/")] = path
        if "plugins" in dirnames:
            dirnames.remove("plugins")
    return runs


# Where a run's files are ------------------------------------------------------------------

BUNDLE_SUFFIX = ".tessera.zip"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_IN_ZIP = re.compile(r"\.zip(?=/|$)")


def is_url(path: str) -> bool:
    """True for an fsspec URL (`s3://bucket/runs`, `gs://...`, `memory://...`)."""
    return bool(_URL.match(path))


class RunFiles:
    """Read access to the files of runs in one kind of storage, by path.

    Paths are those of the local layout joined onto the run's location (a directory, a
    bundle path, a URL). Reading a file that is missing or unreadable raises `OSError` (local),
    or a `TraceFormatError` naming the path (bundles, remote storage).
    """

    def read_bytes(self, path: str) -> bytes:
        raise NotImplementedError

    def isfile(self, path: str) -> bool:
        raise NotImplementedError

    def isdir(self, path: str) -> bool:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        """Names of the entries of a directory (files and subdirectories)."""
        raise NotImplementedError

    def signature(self, path: str) -> tuple | None:
        """(version, size_bytes) of a file, None when it does not exist. The version changes
        whenever the content does (mtime ns locally, the ETag remotely, the CRC in a bundle)."""
        raise NotImplementedError


class LocalFiles(RunFiles):
    """The local file system (plain `open`, `os.stat`, `os.listdir`)."""

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def signature(self, path: str) -> tuple | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)


LOCAL_FILES = LocalFiles()


def run_files(path: str) -> RunFiles:
    """The `RunFiles` that reads `path`: an fsspec URL's file system, the bundle that `path`
    is or lies in (`.../exp1.tessera.zip[/plugins/...]`, when that zip is a regular file),
    else the local file system.

    Raises `TraceFormatError` for a bundle that fails its checks and for a URL whose
    storage cannot be used (both name the bundle or the URL).
    """
    if "://" in path and is_url(path):
        from tessera_tb.trace import remote

        return remote.files_for(path)
    if ".zip" in path:
        m = _IN_ZIP.search(path)
        if m is not None and os.path.isfile(path[: m.end()]):
            from tessera_tb.trace import bundle

            return bundle.files_for(path[: m.end()])
    return LOCAL_FILES
