"""The background writer: everything after the hand-over runs off the training thread.

The training thread only puts messages on a bounded queue (`submit_*`, never blocking):

- a `HostBatch` per recorded step (regions, marks, user counters, the step's span);
- a window: the path of a Kineto JSON file holding the recorded steps of one cycle;
- capability changes, "no profiler trace from now on", and the end of the session.

`StepAssembler` does the work: a window is decoded with the Kineto importer's own code
(`kineto_decode` + `kineto_span.build_span`), each of its steps gets the host batch of the
same step number merged in, NVML samples inside its span and user counters as counter
tracks, and is written by `WorkerWriter` (atomic step file, then `meta.pb` with the step
index: a crash loses at most the step in flight). Without a profiler trace a step is
written from its host batch alone. Caps (`max_steps`, `max_bytes`) and write failures (full
disk, unwritable directory) stop the capture: nothing more is written, the session's
schedule turns the profiler off, and one warning says why.

Where the assembler runs:

- `ProcessWriter` (the default): in a child process (`writer_process.py`, niced), fed by one
  thread of the training process through a pipe. Decoding and writing a window is Python
  work that holds the GIL for tens to hundreds of ms; on a thread of the training process it
  made every op of the training thread wait for the GIL (measured: steps 2-12x slower while
  a window was processed, bench/capture_overhead.py). A child process has its own GIL. If
  the training process dies (even by SIGKILL), the child sees the pipe close, finishes what
  it was handed and exits, so every handed-over step is still written.
- `ThreadWriter`: the same assembler on one thread of the training process; used when a
  child process cannot be started.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from tessera.profile.sources import host, host_steps
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace.step import Capability, StepData

QUEUE_SIZE = 256
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031  # Linux fcntl; absent from the fcntl module before Python 3.10 on some builds

Report = Callable[[tuple], None]


class StepAssembler:
    """Turns messages into step files (runs on the writer thread or in the writer process).

    Reports go out through `report`: ("written", step, bytes_written), ("stopped", reason),
    ("warn", key, message), ("capability", name, status, reason).
    """

    def __init__(
        self,
        run_dir: str,
        meta: pb.WorkerMeta,
        *,
        expect_trace: bool,
        nvml,
        max_steps: int,
        max_bytes: int,
        report: Report,
        upload_url: str | None = None,
    ):
        self.run_dir = run_dir
        # A run whose home is an fsspec URL (s3://...) is written here and mirrored there
        # file by file after every step: an object PUT is atomic, like the local rename.
        self.upload_url = upload_url
        self._uploader = None
        self.meta = meta
        self.expect_trace = expect_trace
        self.nvml = nvml
        self.max_steps = int(max_steps)
        self.max_bytes = int(max_bytes)
        self.report = report
        self.pid = int(meta.pid)
        self.writer = None
        self.steps_written: list[int] = []
        self.stopped: str | None = None
        self.windows = 0
        self.busy_ns = 0
        self._pending: dict[int, host.HostBatch] = {}
        self._meta_from_trace = False

    def open(self) -> None:
        """Create the worker directory and write `meta.pb` (capabilities known so far)."""
        if self.nvml is not None:
            self._set_capability(self.nvml.capability, write=False)
        try:
            self.writer = self._open()
            self.writer.write_meta()
        except OSError as exc:
            self._stop(f"cannot write to {self.run_dir} ({exc.strerror or exc})")

    def handle(self, msg: tuple) -> None:
        t0 = time.perf_counter_ns()
        try:
            kind = msg[0]
            if kind == "host":
                batch: host.HostBatch = msg[1]
                if self.expect_trace:
                    self._pending[batch.step] = batch
                else:
                    self._write(host_steps.host_step(batch, self.pid))
            elif kind == "window":
                self._window(msg[1], msg[2])
            elif kind == "no_trace":
                self.expect_trace = False
                self._flush_pending(msg[1])
            elif kind == "capability":
                self._set_capability(Capability(*msg[1:]))
        except Exception as exc:  # a bug or a bad trace must not take the writer down
            self._stop(f"the background writer failed ({type(exc).__name__}: {exc})")
        finally:
            self.busy_ns += time.perf_counter_ns() - t0

    def finish(self, orphaned: bool = False) -> None:
        """Write what is pending and close the files.

        `orphaned`: the training process died. Host batches still waiting for their window's
        trace are then dropped: that window ended with the process, and a step without its
        profiler trace would read as a step without ops.
        """
        if orphaned:
            self._pending.clear()
        self._flush_pending("the profiler delivered no trace for this step")
        if self.nvml is not None:
            self.nvml.stop()
        if self.writer is not None and not self.stopped:
            try:
                self.writer.close()
            except OSError as exc:
                self._stop(f"cannot write to {self.run_dir} ({exc.strerror or exc})")
            self._upload()  # the scalars and the final meta.pb

    # ---- internals ------------------------------------------------------------------------

    def _window(self, path: str, index: int) -> None:
        from tessera_tb.importers import kineto_decode
        from tessera_tb.importers.kineto_span import StringTable, build_span

        try:
            if self.stopped:
                return
            trace = kineto_decode.read_trace(path)
            base_ns = int(trace.meta.get("baseTimeNanoseconds") or 0)
            span = build_span(trace, StringTable(), index, base_ns)
        except Exception as exc:
            self.report(
                (
                    "warn",
                    f"window-{type(exc).__name__}",
                    f"tessera capture: a profiler window could not be read ({exc}); its steps "
                    "are written with host events only",
                )
            )
            self._flush_pending("the profiler trace of this window could not be read")
            return
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.windows += 1
        if not self._meta_from_trace:
            self._meta_from_trace = True
            self._merge_trace_meta(trace)
        del trace
        if not span.steps:
            return
        batches = [self._pending.pop(s.step) for s in span.steps if s.step in self._pending]
        host_steps.add_host_tracks(span.tracks, [b for b in batches if not b.empty], self.pid)
        by_step = {b.step: b for b in batches}
        # Batches of steps whose window never arrived (a lost window) are written alone.
        first = min(s.step for s in span.steps)
        self._flush_pending("no profiler trace reached the writer for this step", before=first)
        for step in span.steps:
            batch = by_step.get(step.step)
            if batch is not None and not batch.empty:
                host_steps.merge_host(step, batch, self.pid)
            self._write(step)

    def _flush_pending(self, reason: str, before: int | None = None) -> None:
        for s in sorted(self._pending):
            if before is not None and s >= before:
                continue
            step = host_steps.host_step(self._pending.pop(s), self.pid)
            step.capabilities.append(Capability("torch_profiler", "unavailable", reason))
            self._write(step)

    def _open(self):
        from tessera_tb.trace import layout
        from tessera_tb.trace.writer import WorkerWriter

        directory = layout.worker_dir(self.run_dir, self.meta.worker)
        old = os.path.join(directory, layout.META_FILE)
        if os.path.exists(old):
            self.report(
                (
                    "warn",
                    "replaced",
                    f"tessera capture: {directory} held an earlier capture of worker "
                    f"{self.meta.worker}; it is replaced",
                )
            )
            for name in os.listdir(directory):
                if name.startswith("step_") and name.endswith(".pb"):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(directory, name))
            os.unlink(old)
        return WorkerWriter(self.run_dir, self.meta)

    def _write(self, step: StepData) -> None:
        if self.stopped:
            return
        if len(self.steps_written) >= self.max_steps:
            self._stop(f"max_steps={self.max_steps} steps written", cap=True)
            return
        self._add_nvml(step)
        try:
            if self.writer is None:
                self.writer = self._open()
            self.writer.write_step(step)
        except OSError as exc:
            self._stop(f"cannot write to {self.run_dir} ({exc.strerror or exc})")
            return
        self.steps_written.append(step.step)
        self._upload()
        self.report(("written", step.step, self.writer.bytes_written))
        if self.writer.bytes_written >= self.max_bytes:
            self._stop(
                f"max_bytes={self.max_bytes} reached ({self.writer.bytes_written} bytes of step "
                "files written)",
                cap=True,
            )

    def _upload(self) -> None:
        """Mirror the local run to `upload_url`; a storage error stops capture (one warning)."""
        if self.upload_url is None or self.stopped:
            return
        from tessera_tb.trace.errors import TraceFormatError
        from tessera_tb.trace.remote import RunUploader

        try:
            if self._uploader is None:
                self._uploader = RunUploader(self.run_dir, self.upload_url)
            self._uploader.sync()
        except (TraceFormatError, OSError) as exc:
            self.upload_url = None
            self._stop(f"cannot upload to the run's URL ({exc})")

    def _add_nvml(self, step: StepData) -> None:
        from tessera_tb.importers import nvml_csv

        if self.nvml is None or self.nvml.capability.status != "ok":
            return
        found = False
        for device in self.nvml.devices:
            samples = self.nvml.samples_for(device)
            if samples is None:
                continue
            counters = nvml_csv.counters_between(samples, step.start_ns, step.end_ns, device)
            found |= bool(counters)
            step.counters = list(step.counters) + counters
        if not found:
            step.capabilities.append(
                Capability("nvml", "unavailable", "no NVML samples inside the step")
            )
        self.nvml.forget_before(step.start_ns)

    def _stop(self, reason: str, cap: bool = False) -> None:
        if self.stopped:
            return
        self.stopped = reason
        what = "capture stopped" if cap else "capture stopped after an error"
        self.report(
            (
                "warn",
                "stopped",
                f"tessera capture: {what}: {reason}; {len(self.steps_written)} step(s) are in "
                f"{self.run_dir}, training continues without profiling",
            )
        )
        self.report(("stopped", reason))
        if self.nvml is not None:
            self.nvml.stop()
        if self.writer is not None:
            with contextlib.suppress(OSError):
                self.writer.close()

    def _set_capability(self, cap: Capability, write: bool = True) -> None:
        for existing in self.meta.capabilities:
            if existing.name == cap.name:
                existing.status, existing.reason = cap.status, cap.reason
                break
        else:
            self.meta.capabilities.add(name=cap.name, status=cap.status, reason=cap.reason)
        self.report(("capability", cap.name, cap.status, cap.reason))
        if write and self.writer is not None and not self.stopped:
            try:
                self.writer.write_meta()
            except OSError as exc:
                self._stop(f"cannot write to {self.run_dir} ({exc.strerror or exc})")

    def _merge_trace_meta(self, trace) -> None:
        """Devices, versions and distributed details from the first window's trace."""
        from tessera_tb.importers.kineto_import import worker_meta_from_trace

        from_trace = worker_meta_from_trace(self.meta.worker, trace, [])
        meta = self.meta
        if not meta.devices:
            meta.devices.extend(from_trace.devices)
        for key, value in from_trace.versions.items():
            if key != "tessera":
                meta.versions[key] = value
        if not meta.process_groups:
            meta.process_groups.extend(from_trace.process_groups)
        meta.backend = meta.backend or from_trace.backend
        meta.clock_base_ns = from_trace.clock_base_ns
        meta.trace_meta_json = from_trace.trace_meta_json


class _WriterHandle:
    """What the session sees of a writer, wherever the assembler runs."""

    def __init__(self, on_stop: Callable[[str], None], on_warning: Callable[[str, str], None]):
        self.on_stop = on_stop
        self.on_warning = on_warning
        self.steps_written: list[int] = []
        self.bytes_written = 0
        self.step_written_at: dict[int, float] = {}  # step -> time.monotonic() when reported
        self.stopped: str | None = None
        self.capabilities: dict[str, Capability] = {}
        self.stats: dict = {}
        self.pid = os.getpid()
        # Set once the NVML sampler has started or failed (its capability was reported).
        self.nvml_settled = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)

    def _on_report(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "written":
            self.steps_written.append(msg[1])
            self.bytes_written = msg[2]
            self.step_written_at[msg[1]] = time.monotonic()
        elif kind == "stopped":
            self.stopped = msg[1]
            self.on_stop(msg[1])
        elif kind == "warn":
            self.on_warning(msg[1], msg[2])
        elif kind == "capability":
            self.capabilities[msg[1]] = Capability(msg[1], msg[2], msg[3])
            if msg[1] == "nvml":
                self.nvml_settled.set()
        elif kind == "done":
            self.stats = msg[1]
            self.nvml_settled.set()

    def _put(self, msg: tuple) -> None:
        try:
            self._queue.put_nowait(msg)
        except queue.Full:
            self.on_warning(
                "queue-full",
                "tessera capture: the background writer is behind; some recorded data was "
                "dropped (the training loop was not slowed)",
            )

    def submit_host(self, batch: host.HostBatch) -> None:
        self._put(("host", batch))

    def submit_window(self, path: str, index: int) -> None:
        self._put(("window", path, index))

    def submit_no_trace(self, reason: str) -> None:
        """The profiler is gone: pending and later host batches are written on their own."""
        self._put(("no_trace", reason))

    def submit_capability(self, cap: Capability) -> None:
        self._put(("capability", cap.name, cap.status, cap.reason))


class ThreadWriter(_WriterHandle):
    """The assembler on one daemon thread of this process (fallback)."""

    def __init__(self, config: dict, on_stop, on_warning):
        super().__init__(on_stop, on_warning)
        self._config = config
        self._thread = threading.Thread(target=self._run, name="tessera-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assembler = make_assembler(self._config, self._on_report)
        assembler.open()
        while True:
            msg = self._queue.get()
            if msg[0] == "close":
                break
            assembler.handle(msg)
        assembler.finish()
        self._on_report(("done", assembler_stats(assembler)))

    def close(self, timeout_s: float = 120.0) -> bool:
        try:
            self._queue.put(("close",), timeout=timeout_s)
        except queue.Full:
            return False
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


class ProcessWriter(_WriterHandle):
    """The assembler in a child process, fed through a pipe by one thread of this process."""

    def __init__(self, config: dict, on_stop, on_warning):
        super().__init__(on_stop, on_warning)
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(to_child_w, _F_SETPIPE_SZ, _PIPE_BYTES)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tessera.profile.writer_process",
                 str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w),
                env=_child_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal goes to the trainer, not here
            )  # fmt: skip
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.pid = self.proc.pid
        self._out = Connection(to_child_w, readable=False)
        self._in = Connection(from_child_r, writable=False)
        self._done = threading.Event()
        self._out.send(("open", config))
        self._feeder = threading.Thread(target=self._feed, name="tessera-feeder", daemon=True)
        self._listener = threading.Thread(target=self._listen, name="tessera-listener", daemon=True)
        self._feeder.start()
        self._listener.start()

    def _feed(self) -> None:
        while True:
            msg = self._queue.get()
            try:
                self._out.send(msg)
            except OSError:
                self._lost()
                return
            if msg[0] == "close":
                return

    def _listen(self) -> None:
        try:
            while True:
                msg = self._in.recv()
                self._on_report(msg)
                if msg[0] == "done":
                    return
        except (EOFError, OSError):
            self._lost()
        finally:
            self._done.set()

    def _lost(self) -> None:
        self.nvml_settled.set()
        if not self._done.is_set() and self.stopped is None:
            self.on_warning(
                "writer-lost",
                "tessera capture: the background writer process exited unexpectedly; "
                "capture stopped, training continues",
            )
            self.stopped = "the background writer process exited"
            self.on_stop(self.stopped)

    def close(self, timeout_s: float = 120.0) -> bool:
        try:
            self._queue.put(("close",), timeout=timeout_s)
        except queue.Full:
            return False
        finished = self._done.wait(timeout_s)
        try:
            self.proc.wait(timeout=5 if finished else 1)
        except subprocess.TimeoutExpired:
            return False
        finally:
            with contextlib.suppress(OSError):
                self._out.close()
            with contextlib.suppress(OSError):
                self._in.close()
        return finished


def _child_env() -> dict[str, str]:
    """The child's environment: this process's, with the packages' directories importable."""
    import tessera
    import tessera_tb

    env = dict(os.environ)
    roots = [
        os.path.dirname(os.path.dirname(os.path.abspath(tessera.__file__))),
        os.path.dirname(os.path.dirname(os.path.abspath(tessera_tb.__file__))),
    ]
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots + ([old] if old else [])))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    return env


def start_nvml(config: dict, report: Report):
    """Start the NVML sampler the config asks for (None if it asks for none) and report its
    capability at once: the session waits for it before the first recorded step."""
    if config.get("nvml") is None:
        return None
    from tessera.profile.sources.nvml_source import NvmlSampler

    nv = config["nvml"]
    sampler = NvmlSampler(
        nv["interval_ms"],
        nv["devices"],
        on_error=lambda msg: report(("warn", "nvml-error", f"tessera capture: {msg}")),
    )
    sampler.start()
    cap = sampler.capability
    report(("capability", cap.name, cap.status, cap.reason))
    return sampler


def make_assembler(config: dict, report: Report, nvml=None) -> StepAssembler:
    """Build the assembler from the session's config (with `nvml`, or a sampler it starts)."""
    meta = pb.WorkerMeta.FromString(config["meta"])
    if nvml is None:
        nvml = start_nvml(config, report)
    return StepAssembler(
        config["run_dir"],
        meta,
        expect_trace=config["expect_trace"],
        nvml=nvml,
        max_steps=config["max_steps"],
        max_bytes=config["max_bytes"],
        report=report,
        upload_url=config.get("upload_url"),
    )


def assembler_stats(assembler: StepAssembler) -> dict:
    return {
        "busy_ns": assembler.busy_ns,
        "windows": assembler.windows,
        "steps_written": list(assembler.steps_written),
    }
