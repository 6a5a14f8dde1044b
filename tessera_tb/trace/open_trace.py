"""Open whatever a user points at as a run: a run directory, a Kineto JSON, a Chrome trace.

Trace files are imported once into a cache directory (keyed by the file's absolute path,
size and modification time), so calling an analysis twice on the same JSON reads it once.
"""

from __future__ import annotations

import hashlib
import os
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


def open_trace(trace: str | os.PathLike | Run) -> Run:
    """A Run for `trace`: an open Run, a run directory, a bundle (`*.tessera.zip`), a run
    under an fsspec URL (`s3://bucket/runs/exp1`), or a .json/.json.gz trace file (PyTorch
    profiler / Kineto, or Chrome trace format)."""
    if isinstance(trace, Run):
        return trace
    path = os.fspath(trace)
    if layout.is_url(path) or path.endswith(layout.BUNDLE_SUFFIX):
        return open_run(path)
    if os.path.isdir(path):
        if os.path.isdir(layout.plugin_dir(path)):
            return open_run(path)
        raise TraceFormatError(path, "not a Tessera run (no plugins/tessera directory)")
    if not os.path.isfile(path):
        raise TraceFormatError(path, "no such file or directory")
    if not path.endswith((".json", ".json.gz")):
        raise TraceFormatError(path, "expected a run directory or a .json / .json.gz trace")
    from tessera_tb.importers.kineto_import import ImportFailed, import_traces

    root = cache_dir()
    run_name = _cache_key(path)
    run_dir = os.path.join(root, run_name)
    if not os.path.isdir(run_dir):
        os.makedirs(root, exist_ok=True)
        try:
            import_traces([path], root, run_name)
        except ImportFailed as exc:
            raise TraceFormatError(path, str(exc).split(": ", 1)[-1]) from None
        except FileExistsError:
            pass  # another process imported it at the same time
    return open_run(run_dir)
