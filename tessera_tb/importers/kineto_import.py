"""Import PyTorch profiler (Kineto) traces into a run: `tessera-prof import`.

Files are grouped by worker (`{worker}.{ns}.pt.trace.json[.gz]`, as
`tensorboard_trace_handler` names them); several files of one worker are successive
spans. The run is built in a hidden directory beside its destination and renamed into
place only when every file converted, so a failed import leaves no half-written run and
an existing run stays intact.
"""

from __future__ import annotations

import collections
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgspec
import numpy as np

# numpy's unique() imports numpy.ma on its first call; the importer always makes that call
# (the step writer's scalars, backend/utilization), so the module loads with the importer
# rather than in the middle of the first import.
import numpy.ma  # noqa: F401

from tessera_tb.importers import background, kineto_decode, kineto_stream, nvml_csv
from tessera_tb.importers.kineto_span import StringTable, stream_span
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import layout, run_placement
from tessera_tb.trace.atomic import fsync_tree
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.step import Capability, StepData
from tessera_tb.trace.writer import WorkerWriter, encode_step, new_worker_meta

_TRACE_NAME = re.compile(r"^(?P<worker>.+?)\.(?P<ns>\d+)\.pt\.trace\.json(?:\.gz)?$")
_TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")

Progress = Callable[[str], None]


class ImportFailed(Exception):
    """The import could not be done; the message is one line naming the file and problem."""


@dataclass
class WorkerImport:
    worker: str
    files: list[str]
    steps: list[int] = field(default_factory=list)
    events: int = 0
    json_bytes: int = 0
    bytes_written: int = 0
    nvml: str | None = None


@dataclass
class ImportResult:
    run_dir: str
    workers: list[WorkerImport]
    seconds: float
    warnings: list[str]

    @property
    def events(self) -> int:
        return sum(w.events for w in self.workers)

    @property
    def json_bytes(self) -> int:
        return sum(w.json_bytes for w in self.workers)

    @property
    def bytes_written(self) -> int:
        return sum(w.bytes_written for w in self.workers)


def worker_of_file(path: str) -> tuple[str, int]:
    """(worker name, span order key) from a trace file name."""
    base = os.path.basename(path)
    m = _TRACE_NAME.match(base)
    if m:
        return layout.safe_worker_name(m.group("worker")), int(m.group("ns"))
    for suffix in _TRACE_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return layout.safe_worker_name(base), 0


def is_trace_file(name: str) -> bool:
    return name.endswith((".json", ".json.gz")) and not name.startswith(".")


def discover(paths: Iterable[str]) -> dict[str, list[str]]:
    """Map worker -> its trace files in span order, from files and directories."""
    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(
                os.path.join(p, f)
                for f in os.listdir(p)
                if is_trace_file(f) and os.path.isfile(os.path.join(p, f))
            )
            if not found:
                raise ImportFailed(f"{p}: directory holds no .json or .json.gz trace files")
            files.extend(found)
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise ImportFailed(f"{p}: no such file or directory")
    by_worker: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for f in files:
        worker, order = worker_of_file(f)
        by_worker[worker].append((order, f))
    return {w: [f for _, f in sorted(v)] for w, v in sorted(by_worker.items())}


def parse_steps(spec: str) -> set[int]:
    """ "4-6,9" -> {4, 5, 6, 9}."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                out.update(range(int(lo), int(hi) + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ValueError(f"bad step selection {spec!r}: use e.g. 4-6,9") from None
    return out


def _source_format(trace: kineto_decode.RawTrace) -> str:
    cats = trace.first_categories(5000)
    if cats & {"Operator", "Kernel", "Runtime"}:
        return "kineto-2021"
    if "async_cpu_to_gpu" in cats:
        return "kineto-2022"
    return "kineto"


def worker_meta_from_trace(
    worker: str, trace: kineto_decode.RawTrace, files: list[str]
) -> pb.WorkerMeta:
    """WorkerMeta from a trace's top-level keys: rank, world size, process groups, devices,
    versions, clock base and the source format (also used by the capture layer for its
    first window)."""
    m = trace.meta
    dist = m.get("distributedInfo") or {}
    meta = new_worker_meta(
        worker,
        clock_base_ns=int(m.get("baseTimeNanoseconds") or 0),
        source_format=_source_format(trace),
        origin="import",
    )
    meta.sources.extend(os.path.basename(f) for f in files)
    if isinstance(dist.get("rank"), int):
        meta.rank = dist["rank"]
    if isinstance(dist.get("world_size"), int):
        meta.world_size = dist["world_size"]
    meta.backend = str(dist.get("backend") or "")
    for pg in dist.get("pg_config") or []:
        meta.process_groups.add(
            name=str(pg.get("pg_name", "")),
            desc=str(pg.get("pg_desc", "")),
            backend_config=str(pg.get("backend_config", "")),
            size=int(pg.get("pg_size") or 0),
            ranks=[int(r) for r in pg.get("ranks") or []],
        )
    for key, name in (
        ("cuda_runtime_version", "cuda_runtime"),
        ("cuda_driver_version", "cuda_driver"),
        ("cupti_version", "cupti"),
        ("schemaVersion", "kineto_schema"),
    ):
        if key in m:
            meta.versions[name] = str(m[key])
    if "nccl_version" in dist:
        meta.versions["nccl"] = str(dist["nccl_version"])
    for d in m.get("deviceProperties") or []:
        known = {"id", "name", "totalGlobalMem", "computeMajor", "computeMinor", "numSms"}
        meta.devices.add(
            id=int(d.get("id", -1)),
            name=str(d.get("name", "")),
            total_global_mem_bytes=int(d.get("totalGlobalMem") or 0),
            compute_major=int(d.get("computeMajor") or 0),
            compute_minor=int(d.get("computeMinor") or 0),
            num_sms=int(d.get("numSms") or 0),
            extra_json=msgspec.json.encode({k: v for k, v in d.items() if k not in known}).decode(),
        )
    other = {k: v for k, v in m.items() if k not in ("deviceProperties", "distributedInfo")}
    meta.trace_meta_json = msgspec.json.encode(other).decode()
    return meta


def _main_device(step: StepData) -> int:
    devices = collections.Counter(t.device for t in step.tracks if t.kind == "device_stream")
    return devices.most_common(1)[0][0] if devices else -1


def _capabilities(meta: pb.WorkerMeta, trace, kinds_seen: set[str], nvml_path: str | None):
    m = trace.meta
    caps = []

    def cap(name: str, ok: bool, reason: str) -> None:
        caps.append(Capability(name, "ok" if ok else "unavailable", "" if ok else reason))

    cap(
        "device_activity",
        bool(kinds_seen & {"kernel", "collective", "memcpy", "memset"}),
        "no GPU kernels or copies in the trace (CPU-only run, or the cuda activity was off)",
    )
    cap("shapes", bool(m.get("record_shapes")), "recorded without record_shapes=True")
    cap("stacks", "python" in kinds_seen, "recorded without with_stack=True")
    cap("memory", "memory" in kinds_seen, "recorded without profile_memory=True")
    cap("nvml", nvml_path is not None, "no NVML sample file (nvml_<worker>.csv) beside the trace")
    cap(
        "cupti_range_counters",
        "profiler_range" in kinds_seen,
        "no cuda_profiler_range events (CUPTI range profiler was off)",
    )
    caps.append(Capability("ncu_counters", "unavailable", "no-ncu: run tessera-prof import-ncu"))
    for c in caps:
        meta.capabilities.add(name=c.name, status=c.status, reason=c.reason)
    return caps


def _read_span(path, strings, span_index, run_dir, progress, worker):
    """(RawTrace of the file's top level, SpanStream of its steps, the StreamedFile or
    None). A large file is read in bounded memory (kineto_stream), in three passes over
    scratch files beside the run; others whole, which is faster."""
    if kineto_stream.should_stream(path):
        try:
            streamed = kineto_stream.StreamedFile(
                path,
                strings,
                span_index,
                os.path.dirname(os.path.abspath(run_dir)),
                progress=lambda msg: progress(f"{worker}: {msg}"),
            )
        except kineto_stream.StreamUnsupported:
            pass  # the whole-file reader takes it (and names its problem)
        else:
            progress(
                f"{worker}: {os.path.basename(path)}: read in bounded memory, "
                f"{streamed.step_count} steps in {len(streamed.parts)} part(s)"
            )
            return streamed.as_trace(), streamed.as_span(), streamed
    trace = kineto_decode.read_trace(path)
    base_ns = int(trace.meta.get("baseTimeNanoseconds") or 0)
    return trace, stream_span(trace, strings, span_index, base_ns), None


class StepWriterThread:
    """Writes each step put, in order, while the caller makes the next: `encode(step)` runs
    in `encoders` threads at once and `write(step, data)` in one more, in put order.
    Encoding spends most of its time in C (column layout, Zstandard), which releases the GIL,
    so on two cores the steps are compressed side by side while the next is cut. At most
    `depth` steps wait beyond those being encoded. An error of an encode or a write is
    raised by the next `put` or on leaving the `with` block; leaving it on an error of the
    caller's stops the threads without writing what still waits. Each step's bytes depend
    on that step alone, so the files are the same for any number of encoders."""

    def __init__(
        self,
        write: Callable[[StepData, bytes], object],
        encode: Callable[[StepData], bytes],
        *,
        encoders: int = 1,
        depth: int = 2,
    ) -> None:
        self._write = write
        self._encode = encode
        self._pool = ThreadPoolExecutor(max(1, encoders), thread_name_prefix="tessera-encode")
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._error: BaseException | None = None
        self._abandon = False
        self._thread = threading.Thread(target=self._run, name="tessera-write", daemon=True)
        self._thread.start()

    def _encoded(self, step: StepData) -> bytes | None:
        if self._error is not None or self._abandon:
            return None
        return self._encode(step)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            step, pending = item
            try:
                data = pending.result()
                if self._error is None and not self._abandon:
                    self._write(step, data)
            except BaseException as exc:  # raised in the caller's thread
                if self._error is None:
                    self._error = exc
            del step, pending, item

    def put(self, step: StepData) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((step, self._pool.submit(self._encoded, step)))

    def __enter__(self) -> StepWriterThread:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._abandon = exc_type is not None
        self._queue.put(None)
        self._thread.join()
        self._pool.shutdown(wait=True)
        if exc_type is None and self._error is not None:
            raise self._error


class StepWriterInline:
    """StepWriterThread's face, for a span of few events: each step encoded and written
    when put, in the caller's thread. Starting and joining threads would cost more than
    its steps take (the same bytes either way)."""

    def __init__(
        self, write: Callable[[StepData, bytes], object], encode: Callable[[StepData], bytes]
    ) -> None:
        self._write = write
        self._encode = encode

    def put(self, step: StepData) -> None:
        self._write(step, self._encode(step))

    def __enter__(self) -> StepWriterInline:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        pass


# While a file's steps are written, a progress line at most this often (a file read in
# bounded memory spends most of a minute per few GB there).
PROGRESS_SECONDS = 10.0

# A span of fewer events than this is written by StepWriterInline: the size below which
# a span's numpy pieces run in one thread too, for the same reason.
INLINE_SPAN_EVENTS = background.PARALLEL_ROWS


def step_writer(
    write: Callable[[StepData, bytes], object],
    encode: Callable[[StepData], bytes],
    event_count: int,
) -> StepWriterThread | StepWriterInline:
    """The writer for a span's steps: threads for a large span, none for a small one."""
    if event_count < INLINE_SPAN_EVENTS:
        return StepWriterInline(write, encode)
    return StepWriterThread(write, encode, encoders=encoder_threads())


def encoder_threads() -> int:
    """Threads that encode one worker's steps at once: two where there are two CPUs or
    more (compression runs beside the cutting of the next step), else one."""
    return 2 if background.two_cpus() else 1


def _import_worker(
    worker: str,
    files: list[str],
    run_dir: str,
    steps: set[int] | None,
    nvml_path: str | None,
    progress: Progress,
    warnings: list[str],
) -> WorkerImport:
    from tessera_tb.trace.step import KIND_NAMES

    result = WorkerImport(worker=worker, files=files, nvml=nvml_path)
    samples = nvml_csv.read_nvml_csv(nvml_path) if nvml_path else None
    strings = StringTable()
    writer = None
    kinds_seen: set[str] = set()
    first_trace = None
    for span_index, path in enumerate(files):
        t0 = time.perf_counter()
        size = os.path.getsize(path)
        progress(f"{worker}: reading {os.path.basename(path)} ({size / 1e6:.1f} MB)")
        trace, span, streamed = _read_span(path, strings, span_index, run_dir, progress, worker)
        if writer is None:
            first_trace = trace
            meta = worker_meta_from_trace(worker, trace, files)
            pids = collections.Counter(t.pid for t in span.tracks if t.kind == "host_thread")
            if pids:
                pid = max(pids, key=pids.get)  # the most common (the first of equals)
                meta.pid = int(pid) if pid.lstrip("-").isdigit() else 0
            # A staging directory, renamed into place whole once every file converted.
            writer = WorkerWriter(run_dir, meta, staged=True)
        written = 0
        next_report = time.perf_counter() + PROGRESS_SECONDS
        # Steps are encoded (compressed) in threads, two at once on two CPUs, and saved in
        # order while the next one is cut from the span's columns; memory holds the span's
        # columns and at most four steps. A small span's steps are written as they come.
        with step_writer(writer.write_step, encode_step, span.event_count) as out:
            for step in span.steps:
                # A count per kind code, not a set of every event's kind (14 us, not 117, for a
                # step of 5,670 events).
                counts = np.bincount(step.events["kind"], minlength=len(KIND_NAMES))
                kinds_seen.update(KIND_NAMES[np.flatnonzero(counts)].tolist())
                if steps is not None and step.step not in steps:
                    continue
                if step.step in result.steps:
                    raise TraceFormatError(
                        path, f"step {step.step} appears in two files of {worker}"
                    )
                if samples is not None:
                    step.counters = nvml_csv.counters_between(
                        samples, step.start_ns, step.end_ns, _main_device(step)
                    )
                    if not step.counters:
                        step.capabilities.append(
                            Capability("nvml", "unavailable", "no NVML samples inside the step")
                        )
                out.put(step)
                result.steps.append(step.step)
                written += 1
                del step
                if time.perf_counter() >= next_report:
                    next_report = time.perf_counter() + PROGRESS_SECONDS
                    progress(
                        f"{worker}: {os.path.basename(path)}: {written:,} of "
                        f"{span.step_count:,} steps written ({time.perf_counter() - t0:.1f} s)"
                    )
        warnings.extend(span.warnings)
        result.events += span.event_count
        result.json_bytes += trace.json_bytes
        progress(
            f"{worker}: {os.path.basename(path)}: {span.event_count:,} events, "
            f"{written} of {span.step_count} steps written ({time.perf_counter() - t0:.2f} s)"
        )
        if streamed is not None:
            streamed.close()
        del trace, span, streamed
    _capabilities(writer.meta, first_trace, kinds_seen, nvml_path)
    writer.close()
    result.bytes_written = writer.bytes_written
    return result


def import_worker(
    worker: str,
    files: list[str],
    run_dir: str,
    *,
    steps: set[int] | None = None,
    nvml: str | None = None,
    progress: Progress | None = None,
    warnings: list[str] | None = None,
) -> WorkerImport:
    """Import one worker's (rank's) trace files, in span order, into `run_dir` (a staging
    run directory: files written plainly, the worker's meta.pb last). The per-rank unit of
    `import_traces`, run in its threads or as one Dask task (`dask_import`). Raises
    TraceFormatError naming the file and the problem. glibc's malloc is set for it while
    it runs (background.import_malloc)."""
    with background.import_malloc():
        return _import_worker(
            worker,
            files,
            run_dir,
            steps,
            nvml,
            progress or (lambda _msg: None),
            warnings if warnings is not None else [],
        )


def nvml_file_of(files: list[str], worker: str) -> str | None:
    """`nvml_<worker>.csv` beside a worker's trace files, when there is one."""
    return _nvml_beside(files, worker)


def default_jobs() -> int:
    """Workers imported at once when not told: the CPUs, at most 4 (past that the threads
    mostly wait for the GIL, and every one holds its trace's columns and steps in memory)."""
    return max(1, min(4, os.cpu_count() or 1))


def _import_workers(
    by_worker: dict[str, list[str]],
    run_dir: str,
    steps: set[int] | None,
    nvml: str | None,
    progress: Progress,
    warnings: list[str],
    jobs: int,
) -> list[WorkerImport]:
    """Each worker's import, in worker order, `jobs` at a time. On the first failure the
    workers not started yet are cancelled and the error is raised once the others end."""
    jobs = min(len(by_worker), jobs if jobs > 0 else default_jobs()) or 1
    per_worker: dict[str, list[str]] = {w: [] for w in by_worker}

    def one(worker: str) -> WorkerImport:
        files = by_worker[worker]
        nvml_path = nvml if nvml is not None else _nvml_beside(files, worker)
        return _import_worker(
            worker, files, run_dir, steps, nvml_path, progress, per_worker[worker]
        )

    # glibc's malloc set for the import (before any of its threads start: they share one
    # arena) until it ends (background.import_malloc)
    with background.import_malloc():
        if jobs == 1:
            results = [one(w) for w in by_worker]
        else:
            pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="tessera-import")
            futures = [pool.submit(one, w) for w in by_worker]
            try:
                results = [f.result() for f in futures]
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    for w in by_worker:
        warnings.extend(per_worker[w])
    return results


def _nvml_beside(files: list[str], worker: str) -> str | None:
    for f in files:
        candidate = os.path.join(os.path.dirname(f), f"nvml_{worker}.csv")
        if os.path.isfile(candidate):
            return candidate
    return None


def _remove_empty_dirs(path: str, stop: str) -> None:
    stop = os.path.abspath(stop)
    path = os.path.abspath(path)
    while path != stop and path.startswith(stop + os.sep):
        try:
            os.rmdir(path)
        except OSError:
            return
        path = os.path.dirname(path)


def select_workers_and_run(
    paths: list[str], workers: set[str] | None, nvml: str | None, run: str | None
) -> tuple[dict[str, list[str]], str]:
    """The trace files of each worker to import (those of `workers` when given) and the run's
    name (`run`, else the directory's or the first file's worker name), checked. Raises
    ImportFailed with a one-line message. Shared by the local and the Dask import."""
    by_worker = discover(paths)
    if workers is not None:
        unknown = workers - set(by_worker)
        if unknown:
            raise ImportFailed(
                f"no trace files for worker(s) {sorted(unknown)}; found {sorted(by_worker)}"
            )
        by_worker = {w: f for w, f in by_worker.items() if w in workers}
    if nvml is not None and len(by_worker) != 1:
        raise ImportFailed(f"--nvml names one file but {len(by_worker)} workers are imported")
    if run is None:
        first = paths[0].rstrip("/")
        run = os.path.basename(first) if os.path.isdir(first) else worker_of_file(first)[0]
    try:
        layout.check_run_name(run)
    except ValueError as exc:
        raise ImportFailed(str(exc)) from None
    return by_worker, run


def _os_failure(exc: OSError, where: str) -> ImportFailed:
    """An import's OSError (a full disk, a read-only directory, a logdir under a file) as
    one line naming the file and the problem, not a traceback; `where` when it names none."""
    return ImportFailed(f"{exc.filename or where}: {exc.strerror or exc}")


def import_traces(
    paths: list[str],
    logdir: str,
    run: str | None = None,
    *,
    steps: set[int] | None = None,
    workers: set[str] | None = None,
    nvml: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    jobs: int = 1,
    dask: str | None = None,
) -> ImportResult:
    """Import Kineto traces into `<logdir>/<run>`; returns what was written.

    `jobs`: how many workers (ranks) to import at once, in threads (0: as many as there are
    workers, at most `default_jobs()`). The gunzip, the C scanner, compression and file
    writes run without the GIL, so several ranks overlap; each holds its trace's columns and
    steps in memory (about the size of its JSON text; the text itself is streamed).

    `dask`: a Dask scheduler (`tcp://host:8786`, or `local:N` for N worker processes on this
    machine) that imports one worker per task instead (`dask_import`); `jobs` is then
    ignored. The logdir must be a file system the cluster's workers share with this process.

    `nvml` names one NVML sample CSV for a single-worker import; otherwise
    `nvml_<worker>.csv` beside a worker's traces is used when present.
    Raises ImportFailed with a one-line message; on failure nothing is left behind.
    """
    t0 = time.perf_counter()
    progress = progress or (lambda _msg: None)
    by_worker, run = select_workers_and_run(paths, workers, nvml, run)
    dest = os.path.join(logdir, *run.split("/"))
    if os.path.exists(dest) and not overwrite:
        raise ImportFailed(f"{dest}: run already exists (pass --overwrite to replace it)")
    parent = os.path.dirname(dest)
    made_parent = not os.path.isdir(parent)
    try:
        os.makedirs(parent, exist_ok=True)
        # Built beside its destination (same file system), hidden from run discovery, and
        # renamed into place whole, exclusively (trace/run_placement.py). Staging
        # directories of earlier imports killed on the way go first.
        run_placement.remove_stale_staging(parent)
        tmp_run = run_placement.make_staging_dir(parent)
    except OSError as exc:  # a logdir under a file, a read-only directory, a full disk
        raise _os_failure(exc, parent) from None
    warnings: list[str] = []
    try:
        # Millions of objects are made and freed by reference counting alone; the
        # collector's passes over them cost up to a fifth of the import.
        with kineto_decode.gc_paused():
            if dask is not None:
                from tessera_tb.importers import dask_import

                results = dask_import.import_workers_on_dask(
                    dask, by_worker, tmp_run, steps, nvml, progress, warnings
                )
            else:
                results = _import_workers(by_worker, tmp_run, steps, nvml, progress, warnings, jobs)
        if not any(r.steps for r in results):
            raise ImportFailed(f"no steps selected: the traces hold none of {sorted(steps or [])}")
        if os.path.exists(dest):
            # Replacing a run: its new files reach the disk before the old ones go, so a
            # power loss cannot leave it with neither. A new run is left to the page cache
            # (its traces are still there to import again).
            fsync_tree(tmp_run)
        run_placement.place_run(tmp_run, dest, overwrite=overwrite)
    except run_placement.RunExists:
        raise ImportFailed(f"{dest}: run already exists (pass --overwrite to replace it)") from None
    except TraceFormatError as exc:
        raise ImportFailed(str(exc)) from None
    except OSError as exc:  # writing the run or a large trace's scratch files
        raise _os_failure(exc, dest) from None
    finally:
        if os.path.lexists(tmp_run):  # gone already, unless it failed or holds the old run
            shutil.rmtree(tmp_run, ignore_errors=True)
        if made_parent and not os.path.exists(dest):
            _remove_empty_dirs(parent, stop=logdir)
    return ImportResult(dest, results, time.perf_counter() - t0, warnings)
