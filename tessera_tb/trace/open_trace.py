"""Open whatever a user points at as a run: a run directory, a bundle, a URL, a Kineto JSON,
a directory of Kineto traces (one file per rank, as `tensorboard_trace_handler` writes
them), or a Chrome trace.

Trace files and directories are imported once into a cache directory (keyed by each file's
absolute path, size and modification time), so calling an analysis twice on the same traces
reads them once. A directory is imported as `tessera-prof import DIR` reads it: every rank,
with `nvml_<worker>.csv` files beside them; the importer's progress goes to stderr.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile

from tessera_tb.trace import layout
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.reader import Run, open_run


def cache_dir() -> str:
    """$TESSERA_CACHE_DIR, else ~/.cache/tessera, else a per-user temp directory."""
    configured = os.environ.get("TESSERA_CACHE_DIR")
    if configured:
        return configured
    home = os.path.expanduser("~")
    if home and home != "~" and os.access(home, os.W_OK):
        return os.path.join(home, ".cache", "tessera")
    return os.path.join(tempfile.gettempdir(), f"tessera-cache-{os.getuid()}")


def _cache_key(path: str) -> str:
    st = os.stat(path)
    text = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _dir_cache_key(files: list[str]) -> str:
    """One key for a directory's trace (and NVML) files: any change re-imports."""
    h = hashlib.sha256()
    for f in sorted(files):
        st = os.stat(f)
        h.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "dir-" + h.hexdigest()[:24]


def _stderr_progress(msg: str) -> None:
    print(f"tessera: {msg}", file=sys.stderr, flush=True)


def _import_cached(paths: list[str], key: str, label: str, progress) -> Run:
    from tessera_tb.importers.kineto_import import ImportFailed, import_traces

    root = cache_dir()
    run_dir = os.path.join(root, key)
    if not os.path.isdir(run_dir):
        os.makedirs(root, exist_ok=True)
        try:
            import_traces(paths, root, key, progress=progress)
        except ImportFailed as exc:
            raise TraceFormatError(label, str(exc).split(": ", 1)[-1]) from None
        except FileExistsError:
            pass  # another process imported it at the same time
    return open_run(run_dir)


def trace_dir_files(path: str) -> list[str]:
    """The trace files of a directory of Kineto traces (and the NVML CSVs beside them);
    raises TraceFormatError when it holds none."""
    from tessera_tb.importers.kineto_import import is_trace_file

    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise TraceFormatError(path, exc.strerror or str(exc)) from None
    traces = [
        os.path.join(path, n)
        for n in names
        if is_trace_file(n) and os.path.isfile(os.path.join(path, n))
    ]
    if not traces:
        raise TraceFormatError(
            path,
            "not a Tessera run (no plugins/tessera directory) and holds no .json or .json.gz "
            "trace files",
        )
    nvml = [os.path.join(path, n) for n in names if n.startswith("nvml_") and n.endswith(".csv")]
    return traces + nvml


def open_trace(trace: str | os.PathLike | Run, *, progress=_stderr_progress) -> Run:
    """A Run for `trace`: an open Run, a run directory, a bundle (`*.tessera.zip`), a run
    under an fsspec URL (`s3://bucket/runs/exp1`), a .json/.json.gz trace file (PyTorch
    profiler / Kineto, or Chrome trace format, e.g. from `profile.chrome`), or a directory of
    Kineto traces (all ranks). Traces are imported into a cached run; `progress` gets the
    importer's messages (default: stderr). Raises TraceFormatError with one line."""
    if isinstance(trace, Run):
        return trace
    path = os.fspath(trace)
    if layout.is_url(path) or path.endswith(layout.BUNDLE_SUFFIX):
        return open_run(path)
    if os.path.isdir(path):
        if os.path.isdir(layout.plugin_dir(path)):
            return open_run(path)
        files = trace_dir_files(path)
        return _import_cached([path], _dir_cache_key(files), path, progress)
    if not os.path.isfile(path):
        raise TraceFormatError(path, "no such file or directory")
    if not path.endswith((".json", ".json.gz")):
        raise TraceFormatError(path, "expected a run directory or a .json / .json.gz trace")
    return _import_cached([path], _cache_key(path), path, progress)
