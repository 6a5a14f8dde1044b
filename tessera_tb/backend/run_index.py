"""The plugin's view of a logdir: which runs exist, and caches of loaded steps and results.

Runs are found by walking the logdir for `plugins/tessera/` (`layout.find_runs`), because
TensorBoard's data provider does not list raw plugin files. A background thread rescans every
`refresh_s` seconds; a request never waits for a rescan (only the very first scan, once). A run
that a request touches is also revalidated by a stat of its workers' `meta.pb` files at most
once a second, so a step written a moment ago shows up without waiting for the thread.

Bundles (`*.tessera.zip`) in the logdir are runs too, read in place (`trace/bundle.py`); one
that fails its checks is listed with an error naming it. A logdir URL (`s3://bucket/runs`) is
walked and read through fsspec (`trace/remote.py`): one delimiter listing per directory level
and a HEAD of each worker's meta.pb, both cached for a few seconds, and meta.pb is re-read
only when its ETag changes. When the storage cannot be reached the index keeps what it had and
`logdir_error` says why.

Errors stay where they happen: a run whose every worker is unreadable is listed with its error,
a corrupt `meta.pb` hides only that worker, and a corrupt step file hides only that step of that
worker (`RunIndex.usable_run`).

Run, worker and step names from requests are looked up in the discovered maps, never joined
into a path.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import layout, remote
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.reader import Run, WorkerInfo, read_meta, read_step_file
from tessera_tb.trace.step import StepData

logger = logging.getLogger(__name__)

# Per worker: (worker, mtime_ns, size) of its meta.pb, which changes whenever a step is added,
# then of its kernel counters file (0, 0 when absent), which `import-ncu` adds later. In a
# bundle or under a URL the version is the member's CRC or the object's ETag instead of mtime.
Signature = tuple[tuple[str, object, int, object, int], ...]
COUNTERS_FILE = "kernel_counters.pb"
# A logdir URL is rescanned at most this often (listings cost requests and money).
REMOTE_REFRESH_S = 15.0
# From this many workers on, a derived index the plugin builds is written into the run.
WRITE_SUMMARY_WORKERS = 64


@dataclass
class RunEntry:
    """One discovered run: its `Run` (workers that could be read) and what could not be read."""

    name: str
    path: str
    signature: Signature
    run: Run | None
    error: str | None = None
    worker_errors: dict[str, str] = field(default_factory=dict)
    checked_at: float = 0.0


class CachedRun(Run):
    """A `Run` whose steps come from the index's step cache (analyses call `load_step`)."""

    def __init__(
        self,
        path: str,
        workers: dict[str, WorkerInfo],
        index: RunIndex,
        signature: Signature | None = None,
    ):
        super().__init__(path, workers)
        self._index = index
        # The run entry's signature when this is the whole discovered run (None for a run
        # restricted to the step files that load): the key of its derived index.
        self.signature = signature

    def run_summary(self):
        """The run's derived index (`cross_rank.RunSummary`), or None for a restricted run."""
        return self._index.run_summary(self)

    def load_step(self, worker: str, step: int) -> StepData:
        return self._index.load_step_file(self.worker(worker).step_path(step))

    def step_derived(self, worker: str, step: int, what: str, build: Callable[[StepData], object]):
        """An object built from one step (a timeline index), cached with the step."""
        return self._index.step_derived(self.worker(worker).step_path(step), what, build)

    def iter_steps(
        self, workers: Iterable[str] | None = None, steps: Iterable[int] | None = None
    ) -> Iterator[tuple[str, StepData]]:
        wanted = set(steps) if steps is not None else None
        for name in workers if workers is not None else sorted(self.workers):
            for s in self.worker(name).steps:
                if wanted is None or s in wanted:
                    yield name, self.load_step(name, s)


class _LRU:
    """A thread-safe LRU map bounded by the summed `size` of its values (bytes, estimated)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self._items: OrderedDict[object, tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key, value, size: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.total_bytes -= old[1]
            if size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self.total_bytes += size
            while self.total_bytes > self.max_bytes and self._items:
                _, (_, dropped) = self._items.popitem(last=False)
                self.total_bytes -= dropped

    def __len__(self) -> int:
        return len(self._items)


def step_nbytes(step: StepData) -> int:
    """Estimated memory held by a loaded step, in bytes (numpy buffers + strings)."""
    total = sum(a.nbytes for a in step.events.values())
    total += sum(a.rows.nbytes + a.values.nbytes for a in step.attrs)
    total += sum(a.nbytes for a in step.flows.values())
    total += sum(c.ts_ns.nbytes + c.values.nbytes for c in step.counters)
    total += sum(len(s) + 56 for s in step.strings)
    return int(total) + 4096


def _meta_signature(run_dir: str) -> Signature:
    """The run's signature (see `Signature`). Raises TraceFormatError for a bundle that fails
    its checks and for storage that cannot be read."""
    files = layout.run_files(run_dir)
    if files is not layout.LOCAL_FILES:
        return _files_signature(files, run_dir)
    pdir = layout.plugin_dir(run_dir)
    sig = []
    try:
        names = sorted(os.listdir(pdir))
    except OSError:
        return ()
    for name in names:
        if name.startswith("."):
            continue
        try:
            st = os.stat(os.path.join(pdir, name, layout.META_FILE))
        except OSError:
            continue
        try:
            ct = os.stat(os.path.join(pdir, name, COUNTERS_FILE))
            counters = (ct.st_mtime_ns, ct.st_size)
        except OSError:
            counters = (0, 0)
        sig.append((name, st.st_mtime_ns, st.st_size, *counters))
    return tuple(sig)


def _files_signature(files: layout.RunFiles, run_dir: str) -> Signature:
    """`_meta_signature` of a run in a bundle or under a URL, through its `RunFiles`."""
    pdir = layout.plugin_dir(run_dir)
    if not files.isdir(pdir):
        return ()
    sig = []
    for name in sorted(files.listdir(pdir)):
        if name.startswith("."):
            continue
        meta = files.signature(os.path.join(pdir, name, layout.META_FILE))
        if meta is None:
            continue
        counters = files.signature(os.path.join(pdir, name, COUNTERS_FILE)) or (0, 0)
        sig.append((name, *meta, *counters))
    return tuple(sig)


def _file_key(path: str) -> tuple:
    """(path, version, size) of a step file, the key of its cached load; FileNotFoundError
    when it is gone."""
    files = layout.run_files(path)
    if files is layout.LOCAL_FILES:
        st = os.stat(path)
        return (path, st.st_mtime_ns, st.st_size)
    sig = files.signature(path)
    if sig is None:
        raise FileNotFoundError(2, "no such file", path)
    return (path, *sig)


def _now() -> float:
    return time.monotonic()


class RunIndex:
    """Discovered runs of one logdir, plus LRU caches of step files and route results."""

    def __init__(
        self,
        logdir: str,
        refresh_s: float = 5.0,
        step_cache_bytes: int = 1 << 30,
        result_cache_bytes: int = 256 << 20,
    ):
        self.remote = bool(logdir) and layout.is_url(logdir)
        if self.remote:
            self.logdir = logdir.rstrip("/")
            refresh_s = max(refresh_s, REMOTE_REFRESH_S)
        else:
            self.logdir = os.path.abspath(os.path.expanduser(logdir)) if logdir else ""
        self.refresh_s = refresh_s
        # Why the last scan of the logdir failed (storage unreachable, access denied), or None.
        self.logdir_error: str | None = None
        self._entries: dict[str, RunEntry] = {}
        self._lock = threading.Lock()
        self._scanned = threading.Event()
        self._thread: threading.Thread | None = None
        self._steps = _LRU(step_cache_bytes)
        self._results = _LRU(result_cache_bytes)
        self._bad_steps: dict[str, str] = {}
        self._summaries: dict[tuple, object] = {}
        self._summary_locks: dict[tuple, threading.Lock] = {}

    # Discovery ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background rescan thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._loop, name="tessera-run-index", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception:  # a scan must never kill the thread
                logger.exception("rescan of %s failed", self.logdir)
            finally:
                self._scanned.set()
            time.sleep(self.refresh_s)

    def refresh(self) -> None:
        """Rescan the logdir: new runs appear, deleted ones go, changed ones are reopened.

        When a logdir URL cannot be read, the runs found before stay as they were and
        `logdir_error` says why."""
        with self._lock:
            old = dict(self._entries)
        if self.remote:
            try:
                found = remote.find_runs(self.logdir)
            except TraceFormatError as exc:
                self.logdir_error = str(exc)
                self._scanned.set()
                return
            self.logdir_error = None
        else:
            found = layout.find_runs(self.logdir, bundles=True) if self.logdir else {}
        entries = {}
        for name, path in found.items():
            entries[name] = self._revalidated(old.get(name), name, path)
        with self._lock:
            self._entries = entries
        self._scanned.set()

    def _revalidated(self, entry: RunEntry | None, name: str, path: str) -> RunEntry:
        try:
            sig = _meta_signature(path)
        except TraceFormatError as exc:  # a bundle that fails its checks, unreadable storage
            where = path if self.remote else os.path.basename(path)
            problem = f"{where}: {exc.problem}"
            return RunEntry(name, path, (("", problem, 0, 0, 0),), None, problem, {}, _now())
        if entry is not None and entry.signature == sig and entry.path == path:
            entry.checked_at = time.monotonic()
            return entry
        return self._open(
            name, path, sig, entry if entry is not None and entry.path == path else None
        )

    def _open(self, name: str, path: str, sig: Signature, old: RunEntry | None = None) -> RunEntry:
        """Open a run whose signature is `sig`. Workers whose part of the signature is the
        same as in `old` (the entry it replaces) keep their metadata: only a changed meta.pb
        is read again (one GET per changed worker on remote storage)."""
        workers, errors = {}, {}
        pdir = layout.plugin_dir(path)
        unchanged = set(sig) & set(old.signature) if old is not None and old.run else set()
        for worker_sig in sig:
            worker = worker_sig[0]
            wdir = os.path.join(pdir, worker)
            if worker_sig in unchanged and worker in old.run.workers:
                workers[worker] = old.run.workers[worker]
                continue
            try:
                layout.check_worker_name(worker)
                workers[worker] = WorkerInfo(
                    worker, wdir, read_meta(os.path.join(wdir, layout.META_FILE))
                )
            except (TraceFormatError, ValueError) as exc:
                errors[worker] = str(getattr(exc, "problem", exc))
        run = CachedRun(path, workers, self, sig) if workers else None
        error = None
        if run is None:
            error = (
                "no readable worker: " + "; ".join(f"{w}: {e}" for w, e in errors.items())
                if errors
                else "run has no workers (no plugins/tessera/<worker>/meta.pb)"
            )
        return RunEntry(name, path, sig, run, error, errors, time.monotonic())

    def wait_first_scan(self, timeout_s: float = 60.0) -> None:
        self.start()
        self._scanned.wait(timeout_s)

    def entries(self, wait_s: float = 60.0) -> dict[str, RunEntry]:
        """The runs as of the last scan, by name (waits only for the first scan, at most
        `wait_s`)."""
        self.wait_first_scan(wait_s)
        with self._lock:
            return dict(self._entries)

    def entry(self, name: str) -> RunEntry:
        """The run named `name` (exactly as listed), revalidated by a stat if a second old.

        Raises KeyError when there is no such run.
        """
        entries = self.entries()
        entry = entries.get(name)
        if entry is None:
            raise KeyError(name)
        if time.monotonic() - entry.checked_at > 1.0:
            fresh = self._revalidated(entry, name, entry.path)
            if fresh is not entry:
                with self._lock:
                    if self._entries.get(name) is entry:
                        self._entries[name] = fresh
                entry = fresh
        return entry

    # Steps -------------------------------------------------------------------------------

    def load_step_file(self, path: str) -> StepData:
        """A step file through the LRU cache (keyed by path, version and size)."""
        key = _file_key(path)
        step = self._steps.get(key)
        if step is None:
            try:
                step = read_step_file(path)
            except TraceFormatError as exc:
                step = exc  # remembered, so a corrupt file is not parsed on every request
            self._steps.put(key, step, step_nbytes(step) if isinstance(step, StepData) else 1024)
        if isinstance(step, TraceFormatError):
            self._bad_steps[path] = step.problem
            raise step
        self._bad_steps.pop(path, None)
        return step

    def step_derived(self, path: str, what: str, build: Callable[[StepData], object]):
        """An object derived from one step file (a timeline index), cached beside the steps.

        Its size is counted as three times the step's, a bound for the per-row arrays the
        derived objects hold.
        """
        key = (*_file_key(path), what)
        value = self._steps.get(key)
        if value is None:
            step = self.load_step_file(path)
            value = build(step)
            self._steps.put(key, value, 3 * step_nbytes(step))
        return value

    def step_errors_key(self) -> tuple:
        """Every step file that failed to load so far, with its problem: part of the key of
        answers that list step errors (the runs listing)."""
        return tuple(sorted(self._bad_steps.items()))

    def known_step_errors(self, entry: RunEntry) -> dict[tuple[str, int], str]:
        """{(worker, step): problem} for the run's step files that failed to load so far."""
        if entry.run is None or not self._bad_steps:
            return {}
        out = {}
        for w, info in entry.run.workers.items():
            for s in info.steps:
                problem = self._bad_steps.get(info.step_path(s))
                if problem is not None:
                    out[(w, s)] = problem
        return out

    def usable_run(
        self, entry: RunEntry, workers: list[str], steps: list[int]
    ) -> tuple[Run, dict[tuple[str, int], str]]:
        """The run restricted to the (worker, step) files of the selection that load.

        Loads every selected step and its neighbours in the worker's step index (into the
        cache) and returns a run whose workers list only the steps that loaded, plus
        {(worker, step): error} for those that did not. Analyses given this run never meet a
        corrupt file.
        """
        assert entry.run is not None
        bad: dict[tuple[str, int], str] = {}
        wanted = set(steps)
        for w in workers:
            info = entry.run.worker(w)
            order = info.steps
            # The neighbours of each selected step too: the breakdown reads them.
            chosen = {i for i, s in enumerate(order) if s in wanted}
            for i in sorted(chosen | {j for c in chosen for j in (c - 1, c + 1)}):
                if 0 <= i < len(order):
                    s = order[i]
                    try:
                        self.load_step_file(info.step_path(s))
                    except (TraceFormatError, OSError) as exc:
                        bad[(w, s)] = str(getattr(exc, "problem", exc))
        if not bad:
            return entry.run, bad
        filtered = {}
        for name, info in entry.run.workers.items():
            meta = pb.WorkerMeta()
            meta.CopyFrom(info.meta)
            keep = [e for e in info.meta.steps if (name, e.step) not in bad]
            del meta.steps[:]
            meta.steps.extend(keep)
            filtered[name] = WorkerInfo(info.name, info.directory, meta)
        return CachedRun(entry.path, filtered, self), bad

    # Derived index -----------------------------------------------------------------------

    def run_summary(self, run: CachedRun):
        """The derived index of a whole discovered run (`backend/cross_rank.py`): read from
        the run when current, else built once from every step file and written into it; kept
        per run signature. None for a run restricted to the step files that load, and when a
        step file cannot be read (the views then read step files as usual)."""
        if run.signature is None:
            return None
        with self._lock:
            lock = self._summary_locks.setdefault(run.path, threading.Lock())
        with lock:  # one build per run, however many requests ask at once
            held = self._summaries.get(run.path)
            if held is not None and held[0] == run.signature:
                return held[1]
            from tessera_tb.backend import cross_rank

            try:
                # Written into the run only where it saves much (large runs); a small run's
                # index is cheap to build again and its files are left as they are.
                found = cross_rank.ensure_run_summary(
                    run, write=len(run.workers) >= WRITE_SUMMARY_WORKERS
                )
            except (TraceFormatError, OSError) as exc:
                logger.warning("no derived index for %s: %s", run.path, exc)
                found = None
            # Only the latest version of each run is kept.
            self._summaries[run.path] = (run.signature, found)
            return found

    # Results -----------------------------------------------------------------------------

    def cached_result(self, key: tuple, compute: Callable[[], bytes]) -> bytes:
        """A route's encoded answer, computed once per key (the key holds the run signature)."""
        value = self._results.get(key)
        if value is None:
            value = compute()
            self._results.put(key, value, len(value) + 256)
        return value

    def cache_stats(self) -> dict[str, int]:
        return {
            "steps": len(self._steps),
            "step_bytes": self._steps.total_bytes,
            "results": len(self._results),
            "result_bytes": self._results.total_bytes,
        }
