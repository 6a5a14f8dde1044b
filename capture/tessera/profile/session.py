"""`profile.session(...)`: capture per-step traces into a TensorBoard run while training runs.

The session numbers steps from 0 (`sess.step()` ends one and starts the next), asks its
schedule which steps are recorded, and runs the sources the machine has:

- PyTorch (`sources/torch_source.py`) when torch is importable and a torch activity is
  asked for: Kineto CPU ops, kernels, copies, collectives, memory, shapes, stacks;
- NVML (`sources/nvml_source.py`) for `power` when a driver is present;
- the host source (`sources/host.py`): regions, marks, user counters, step timing, always;
- NVTX ranges per step and per region when CUDA is there (`nvtx_markers.py`).

Under Nsight Compute or Nsight Systems (`nvtx_markers.injected_tool`) the session records
the NVTX markers only: no Kineto (the tool holds CUPTI, Kineto would see no device work),
no writer, nothing written to the run directory, and one line on stderr says so.

What a source could not capture is a capability tag in the worker's `meta.pb`. Everything
after the hand-over (decoding, merging, writing) runs on the background writer
(`background.py`). No failure of the capture stops training: a failing source is disabled,
a write failure stops the capture, each with one `TesseraWarning`.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence

from tessera.profile import scheduling as sched
from tessera.profile.failures import WarningBox
from tessera.profile.nvtx_markers import injected_tool, torch_nvtx_markers
from tessera.profile.sources import host

ACTIVITIES = ("cpu", "gpu", "memcpy", "collective", "memory", "power")
_TORCH_ACTIVITIES = ("cpu", "gpu", "memcpy", "collective", "memory")
DEFAULT_MAX_STEPS = 1000
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB of step files per worker
# How long the step before the first recorded step may wait for the NVML sampler to start
# in the writer process (interpreter start and imports), so recorded steps have samples.
NVML_START_TIMEOUT_S = 10.0
STEP_CALLS_KEPT = 100_000


def _is_url(path: str) -> bool:
    """An fsspec URL such as s3://bucket/runs (tessera_tb.trace.layout.is_url, without
    importing the trace package at session construction)."""
    from tessera_tb.trace.layout import is_url

    return is_url(path)


def detect_rank() -> tuple[int, int, bool]:
    """(rank, world_size, distributed): torch.distributed if initialised, else RANK, else 0.

    torch is consulted only if the program imported it already.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size()), True
        except Exception:
            pass
    env = os.environ.get("RANK", "").strip()
    if env.isdigit():
        world = os.environ.get("WORLD_SIZE", "").strip()
        return int(env), int(world) if world.isdigit() else 0, True
    return 0, 1, False


def worker_name(rank: int, distributed: bool) -> str:
    """`rank{r}` for a distributed process (or one with RANK set), else `worker0`."""
    return f"rank{rank}" if distributed else "worker0"


class Session:
    """A capture session; use it as a context manager (or call `start()` / `stop()`)."""

    def __init__(
        self,
        activities: Sequence[str] | None = None,
        *,
        record_shapes: bool = False,
        with_stack: bool = False,
        sample_interval_ms: float = 10,
        schedule: sched.Schedule | None = None,
        ranks: Iterable[int] | None = None,
        exporters: Sequence = (),
        tensorboard_dir: str | os.PathLike | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        writer: str = "process",
        overwrite: bool = False,
    ):
        acts = list(activities) if activities is not None else ["cpu", "gpu"]
        unknown = [a for a in acts if a not in ACTIVITIES]
        if unknown:
            raise ValueError(f"unknown activities {unknown}; known: {list(ACTIVITIES)}")
        if max_steps < 1 or max_bytes < 1:
            raise ValueError("max_steps and max_bytes must be positive")
        if writer not in ("process", "thread"):
            raise ValueError("writer must be 'process' or 'thread'")
        if sample_interval_ms <= 0:
            raise ValueError("sample_interval_ms must be positive")
        self.activities = set(acts)
        self.record_shapes = bool(record_shapes)
        self.with_stack = bool(with_stack)
        self.sample_interval_ms = float(sample_interval_ms)
        self.schedule = schedule if schedule is not None else sched.Schedule()
        self.ranks = None if ranks is None else {int(r) for r in ranks}
        self.exporters = list(exporters)
        self.max_steps = int(max_steps)
        self.max_bytes = int(max_bytes)
        self.overwrite = bool(overwrite)
        self._own_dir = tensorboard_dir is None
        self.run_dir = str(tensorboard_dir) if tensorboard_dir is not None else None
        # tensorboard_dir="s3://bucket/runs/exp1" (any fsspec URL): steps are written to a
        # local staging directory and uploaded there file by file as they are written.
        self.run_url: str | None = None
        if self.run_dir is not None and _is_url(self.run_dir):
            self.run_url, self.run_dir = self.run_dir.rstrip("/"), None
        self.rank, self.world_size, self.distributed = 0, 1, False
        self.worker = "worker0"
        self.enabled = False  # this rank profiles and the run directory is writable
        self.step_num = 0
        self.box = WarningBox()
        self.recorder = host.HostRecorder()
        self.writer = None  # background.ProcessWriter or ThreadWriter
        self.torch_source = None
        self.writer_mode = writer
        self.capabilities: list = []  # tessera_tb.trace.step.Capability
        # (step ended, ns spent in step(), window handed over), for the last STEP_CALLS_KEPT steps.
        self.step_call_ns: collections.deque[tuple[int, int, bool]] = collections.deque(
            maxlen=STEP_CALLS_KEPT
        )
        self._running = False
        self._stopped = False
        self._tmpdir: str | None = None
        self._step_start_ns = 0
        self._active_seen = 0
        self._last_action = sched.NONE
        self._action_cache: tuple[int, str] = (-1, sched.NONE)
        self._windows_handed = 0
        self.handed_over_at: list[float] = []  # time.monotonic() of each window's hand-over
        self._torch_missing = ""
        self._await_nvml = False
        # Under Nsight Compute / Systems: the tool's name, and only NVTX markers are recorded.
        self.markers_only: str | None = None
        self.nvtx = None  # nvtx_markers.NvtxMarkers when CUDA is there
        # Where step boundaries come from: "pending" until the first sess.step() call
        # ("explicit") or the first torch.optim.Optimizer.step ("optimizer"). While pending,
        # step 0 is recorded provisionally so a block with neither (inference) is one step.
        self.step_source = "pending"
        self._provisional = False
        self._opt_hook = None  # RemovableHandle of torch's global optimizer step post-hook
        # (weakref to the optimizer whose steps end steps, our step wrapper, what it replaced)
        self._wrapped_optimizer = None
        self._optimizer_steps_seen = 0
        self.exit_line: str | None = None

    # ---- life cycle -----------------------------------------------------------------------

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop()
        return False

    def start(self) -> Session:
        self.rank, self.world_size, self.distributed = detect_rank()
        self.worker = worker_name(self.rank, self.distributed)
        if self.ranks is not None and self.rank not in self.ranks:
            return self  # this rank runs untouched: no profiler, step() does nothing
        tool = injected_tool()
        if tool is not None:
            return self._start_markers_only(tool)
        if self.run_dir is None:
            self.run_dir = tempfile.mkdtemp(prefix="tessera-run-")
        if not self._prepare_dir():
            return self
        self.enabled = True
        torch = self._import_torch()
        self.capabilities = self._base_capabilities(torch)
        meta = self._new_meta(torch)
        for cap in self.capabilities:
            meta.capabilities.add(name=cap.name, status=cap.status, reason=cap.reason)
        want_torch = torch is not None and bool(self.activities & set(_TORCH_ACTIVITIES))
        if want_torch:
            from tessera.profile.sources.torch_source import capture_tmpdir

            self._tmpdir = capture_tmpdir()
        config = {
            "run_dir": os.path.abspath(self.run_dir),
            "upload_url": self.run_url,
            "meta": meta.SerializeToString(deterministic=True),
            "expect_trace": want_torch,
            "max_steps": self.max_steps,
            "max_bytes": self.max_bytes,
            "nvml": self._nvml_config(torch),
            "tmpdir": self._tmpdir,
        }
        self.writer = self._start_writer(config)
        self._await_nvml = config["nvml"] is not None
        if self._await_nvml and self.schedule.is_active(0):
            self._wait_for_nvml()
        self.nvtx = torch_nvtx_markers(torch or sys.modules.get("torch"))
        host.set_current(self.recorder, self.nvtx)
        self._running = True
        self._hook_optimizer(torch or sys.modules.get("torch"))
        atexit.register(self.stop)  # a session never stopped is still flushed at exit
        if self.nvtx is not None:
            self.nvtx.start_step(0)
        if want_torch:
            self._start_torch(torch)
        if self.torch_source is None:
            self.recorder.recording = self._is_recorded(self._action(0))
        self._step_start_ns = time.time_ns()
        self.box.emit(stacklevel=3)
        return self

    def step(self) -> None:
        """End the current step and start the next (calls `prof.step()` under torch).

        Explicit calls win over optimizer steps: the first one turns the optimizer hook off,
        and from then on only `step()` calls end steps.
        """
        if self.step_source != "explicit":
            self.step_source = "explicit"
            self._unhook_optimizer()
        self._advance()

    def _advance(self, to: int | None = None) -> None:
        """End the current step and start step `to` (default: the next); a jump drops what
        the current step recorded."""
        if not self._running:
            return
        if self.markers_only is not None:
            self.step_num += 1
            self.nvtx.start_step(self.step_num)
            return
        t0 = time.perf_counter_ns()
        now = time.time_ns()
        ending = self.step_num
        nxt = ending + 1 if to is None else to
        if self.nvtx is not None:
            self.nvtx.start_step(nxt)
        recorder = self.recorder
        provisional = self._provisional or to is not None
        self._provisional = False
        if provisional:
            # Step 0 was recorded in case the block had no steps; it has them: drop it and
            # follow the schedule from the next step.
            recorder.take(ending, self._step_start_ns, now)
            self._last_action = sched.NONE
            self._action_cache = (-1, sched.NONE)
        elif recorder.recording:
            self.writer.submit_host(recorder.take(ending, self._step_start_ns, now))
        self._active_seen += self._last_action in (sched.RECORD, sched.RECORD_AND_SAVE)
        self.step_num = nxt
        if self._await_nvml and self.schedule.is_active(self.step_num):
            self._wait_for_nvml()  # before the recorded step starts, not inside it
            now = time.time_ns()
        self._step_start_ns = now
        windows = self._windows_handed
        source = self.torch_source
        if source is not None:
            try:
                if provisional:
                    source.restart_at(self.step_num)
                else:
                    source.step()
            except Exception as exc:
                self._disable_torch(exc)
        if self.torch_source is None:
            self._action(self.step_num)
        recorder.recording = self._is_recorded(self._last_action) and not self._stopped
        self.step_call_ns.append(
            (ending, time.perf_counter_ns() - t0, self._windows_handed != windows)
        )
        if self.box:
            self.box.emit(stacklevel=3)

    def mark(self, name: str) -> None:
        """An instant event named `name` on the calling thread's track, in the current step."""
        self.recorder.add_mark(str(name))

    def stop(self) -> None:
        """End the session: flush the profiler, finish writing, run the exporters."""
        if not self._running:
            self.box.emit(stacklevel=3)
            return
        self._running = False
        atexit.unregister(self.stop)
        self._unhook_optimizer()
        if self.nvtx is not None:
            self.nvtx.end_step()
        if self.markers_only is not None:
            host.set_current(None)
            return
        now = time.time_ns()
        if self.recorder.recording:
            self.writer.submit_host(self.recorder.take(self.step_num, self._step_start_ns, now))
        self.recorder.recording = False
        if self.torch_source is not None:
            try:
                self.torch_source.stop()
            except Exception as exc:
                self._disable_torch(exc)
        host.set_current(None)
        if not self.writer.close():
            self.box.add(
                "close-timeout",
                "tessera capture: the background writer did not finish in time; the last "
                "steps may be missing",
            )
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        self.box.emit(stacklevel=3)
        for exporter in self.exporters:
            try:
                exporter.export(self)
            except Exception as exc:
                self.box.add(
                    f"export-{id(exporter)}",
                    f"tessera capture: exporter {exporter!r} failed ({type(exc).__name__}: {exc})",
                )
        self.box.emit(stacklevel=3)
        self.exit_line = self._exit_line()
        print(self.exit_line, file=sys.stderr, flush=True)

    # ---- results --------------------------------------------------------------------------

    @property
    def steps_written(self) -> list[int]:
        return list(self.writer.steps_written) if self.writer is not None else []

    def run(self):
        """The run as written so far (`tessera_tb.trace.Run`), or None when nothing was."""
        from tessera_tb.trace import open_run

        if not self.enabled or not self.steps_written:
            return None
        return open_run(self.run_dir)

    def records(self) -> Iterator:
        """Portable records (`tessera.profile.records.Record`): one per kernel, memcpy, memset
        and collective, with attribute access (`rec.kernel_name`, `rec.tc_util_pct`)."""
        from tessera.profile.records import kernel_records

        run = self.run()
        if run is None or self.worker not in run.workers:
            return iter(())
        return kernel_records(run, workers=[self.worker])

    def records_frame(self):
        """The records as a pandas DataFrame (one row per record, `Record.to_dict()`)."""
        from tessera.profile.records import records_frame

        return records_frame(self.records())

    def report(self, *, print_table: bool = True):
        """Per-op table (latency, FLOPs, bandwidth, efficiency), printed and returned."""
        from tessera.profile.report import op_report, print_report

        run = self.run()
        table = op_report(run, workers=[self.worker] if run is not None else None)
        if print_table:
            print_report(table)
        return table

    # ---- internals ------------------------------------------------------------------------

    def _hook_optimizer(self, torch) -> None:
        """Until the first `sess.step()`, each `torch.optim.Optimizer.step` ends a step.

        torch's global optimizer step post-hook finds the optimizer (the first one that
        steps; a program with two optimizers still gets one step per iteration). The hook
        runs inside torch's `Optimizer.step#...` record_function, and switching profiler
        steps there (stopping or starting a Kineto trace while that range is open) crashes
        torch, so the step is not ended in the hook: the optimizer's `step` is wrapped on
        the instance and the step ends when it has returned.
        """
        if torch is None:
            return
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except Exception:
            return
        self._opt_hook = register_optimizer_step_post_hook(self._on_first_optimizer_step)

    def _unhook_optimizer(self) -> None:
        hook, self._opt_hook = self._opt_hook, None
        if hook is not None:
            hook.remove()
        wrapped, self._wrapped_optimizer = self._wrapped_optimizer, None
        if wrapped is not None:
            optimizer, ours, before = wrapped
            opt = optimizer()
            if opt is not None and opt.__dict__.get("step") is ours:
                if before is None:
                    del opt.__dict__["step"]
                else:
                    opt.__dict__["step"] = before

    def _on_first_optimizer_step(self, optimizer, args, kwargs) -> None:
        """The global post-hook: the first optimizer step seen wraps that optimizer's
        `step` (this step itself ends nothing; see `_after_optimizer_step`)."""
        import weakref

        hook, self._opt_hook = self._opt_hook, None
        if hook is not None:
            hook.remove()
        if self.step_source == "explicit" or not self._running:
            return
        self._optimizer_steps_seen = 1
        before = optimizer.__dict__.get("step")
        inner = optimizer.step  # the bound method, or a scheduler's wrapper of it
        session = self

        def step(*a, **k):
            out = inner(*a, **k)
            session._after_optimizer_step()
            return out

        optimizer.__dict__["step"] = step
        self._wrapped_optimizer = (weakref.ref(optimizer), step, before)

    def _after_optimizer_step(self) -> None:
        """After the wrapped optimizer's step has returned.

        A loop that calls `sess.step()` after `opt.step()` must get exactly the steps it
        asks for, so the first optimizer step ends nothing: the session waits for a
        `sess.step()`. At the second optimizer step with no `sess.step()` in between, steps
        come from the optimizer: step 0 (the first two optimizer steps, recorded only
        provisionally) is dropped, step 2 starts, and from then on step N ends at the
        (N+1)-th optimizer step, so the schedule's numbers mean what they say.
        """
        if self.step_source == "explicit" or not self._running:
            return
        if self.step_source == "pending":
            self._optimizer_steps_seen += 1
            if self._optimizer_steps_seen < 2:
                return
            self.step_source = "optimizer"
            self._advance(to=2)
            return
        self._advance()

    def _exit_line(self) -> str:
        """One line for stderr at exit: which steps were recorded, where, how to view them."""
        steps = self.steps_written
        where = self.run_url or self.run_dir
        how = {
            "explicit": "sess.step() calls",
            "optimizer": "each optimizer.step() ended a step",
            "pending": "no sess.step() or optimizer.step(): the whole block is one step",
        }[self.step_source]
        seen = self.step_num + 1
        if steps:
            logdir = os.path.dirname(os.path.abspath(where)) if self.run_url is None else where
            return (
                f"tessera capture: recorded steps {_step_list(steps)} of 0-{self.step_num} "
                f"({how}) in "
                f"{where}; view: tensorboard --logdir {logdir}"
            )
        if not self.enabled:
            why = "this rank is not profiled" if self._rank_skipped() else "capture disabled"
        elif self._stopped:
            why = "the capture stopped (see the warning above)"
        else:
            first_cycle = self.schedule.skip_first + self.schedule.cycle_steps
            wanted = self.schedule.active_steps(first_cycle)
            why = (
                f"the schedule records steps {_step_list(wanted)} but the session saw "
                f"{seen} step{'s' if seen != 1 else ''}"
            )
        return f"tessera capture: nothing recorded ({how}): {why}"

    def _rank_skipped(self) -> bool:
        return self.ranks is not None and self.rank not in self.ranks

    def _start_markers_only(self, tool: str) -> Session:
        """Under an Nsight tool: NVTX step and region ranges only, nothing written."""
        self.markers_only = tool
        torch = sys.modules.get("torch")
        if torch is None and self.activities & set(_TORCH_ACTIVITIES):
            with contextlib.suppress(Exception):
                import torch
        self.nvtx = torch_nvtx_markers(torch) if torch is not None else None
        where = self.run_url or self.run_dir or "the run directory"
        if self.nvtx is None:
            what = "no CUDA, so no NVTX markers either"
        else:
            what = "recording NVTX step and region ranges only (tessera_step_N)"
        print(
            f"tessera capture: running under {tool}: {what}; no Kineto trace, nothing written "
            f"to {where}",
            file=sys.stderr,
            flush=True,
        )
        if self.nvtx is None:
            return self
        host.set_current(None, self.nvtx)
        self._running = True
        atexit.register(self.stop)
        self.nvtx.start_step(0)
        return self

    def _prepare_dir(self) -> bool:
        from tessera_tb.trace import layout

        if self.run_url is not None:
            from tessera_tb.trace.remote import RemoteStorageError, files_for

            try:
                files_for(self.run_url).check_reachable(self.run_url)
            except (RemoteStorageError, ImportError) as exc:
                self.box.add(
                    "unwritable",
                    f"tessera capture: cannot write to {self.run_url} ({exc}); "
                    "training runs without profiling",
                )
                self.box.emit(stacklevel=4)
                return False
        elif not self.overwrite:
            # An earlier session's capture is kept: this one gets a capture (run) of its own.
            earlier = self.run_dir
            self.run_dir = layout.new_capture_dir(earlier, self.worker)
            if self.run_dir != earlier:
                self.box.add(
                    "new_capture",
                    f"tessera capture: {earlier} holds an earlier capture of {self.worker}; "
                    f"it is kept and this session writes to {self.run_dir} "
                    "(overwrite=True replaces it instead)",
                )
                self.box.emit(stacklevel=4)
        directory = layout.worker_dir(self.run_dir, self.worker)
        try:
            os.makedirs(directory, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".probe.", dir=directory)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            self.box.add(
                "unwritable",
                f"tessera capture: cannot write to {self.run_dir} ({exc.strerror or exc}); "
                "training runs without profiling",
            )
            self.box.emit(stacklevel=4)
            return False
        return True

    def _import_torch(self):
        if not self.activities & set(_TORCH_ACTIVITIES) and "power" not in self.activities:
            return None
        try:
            import torch
            import torch.profiler  # noqa: F401
        except Exception as exc:  # ImportError, or a broken install
            self._torch_missing = f"torch is not importable ({type(exc).__name__}: {exc})"
            return None
        return torch

    def _base_capabilities(self, torch) -> list:
        from tessera_tb.trace.step import Capability

        caps = [Capability("host_regions", "ok")]
        if torch is None and self.activities & set(_TORCH_ACTIVITIES):
            reason = self._torch_missing or "torch is not importable"
            for name, activity in (
                ("cpu_ops", "cpu"),
                ("device_activity", "gpu"),
                ("memcpy", "memcpy"),
                ("collectives", "collective"),
                ("memory", "memory"),
            ):
                wanted = activity in self.activities
                caps.append(
                    Capability(
                        name, "unavailable", reason if wanted else f"not requested ({activity!r})"
                    )
                )
            caps.append(Capability("torch_profiler", "unavailable", reason))
        if "power" not in self.activities:
            caps.append(Capability("nvml", "unavailable", "not requested (activity 'power')"))
        caps.append(
            Capability(
                "ncu_counters", "unavailable", "no-ncu: run tessera-prof counters RUN -- PROGRAM"
            )
        )
        return caps

    def _new_meta(self, torch):
        from tessera_tb.trace.writer import new_worker_meta

        meta = new_worker_meta(
            self.worker,
            host=socket.gethostname(),
            pid=os.getpid(),
            rank=self.rank,
            world_size=self.world_size,
            source_format="capture",
            origin="capture",
        )
        if torch is not None:
            meta.versions["torch"] = str(torch.__version__)
            with contextlib.suppress(Exception):
                if torch.distributed.is_available() and torch.distributed.is_initialized():
                    meta.backend = str(torch.distributed.get_backend())
        return meta

    def _nvml_config(self, torch) -> dict | None:
        """What the NVML sampler (in the writer) samples: this process's CUDA device by UUID
        when torch sees one, else every NVML device."""
        if "power" not in self.activities:
            return None
        devices = None
        if torch is not None:
            with contextlib.suppress(Exception):
                if torch.cuda.is_available():
                    index = torch.cuda.current_device()
                    devices = {index: f"GPU-{torch.cuda.get_device_properties(index).uuid}"}
        return {"interval_ms": self.sample_interval_ms, "devices": devices}

    def _start_writer(self, config: dict):
        from tessera.profile.background import ProcessWriter, ThreadWriter

        def on_warning(key: str, message: str) -> None:
            self.box.add(key, message)

        if self.writer_mode == "process":
            try:
                return ProcessWriter(config, self._on_capture_stopped, on_warning)
            except Exception as exc:
                self.box.add(
                    "writer-process",
                    f"tessera capture: could not start the writer process ({exc}); writing "
                    "on a thread of this process instead (slower steps while windows are "
                    "written)",
                )
        return ThreadWriter(config, self._on_capture_stopped, on_warning)

    def _start_torch(self, torch) -> None:
        from tessera.profile.sources.torch_source import TorchSource
        from tessera_tb.trace.step import Capability

        try:
            source = TorchSource(
                torch,
                self.activities,
                record_shapes=self.record_shapes,
                with_stack=self.with_stack,
                schedule_fn=self._action,
                handover=self._handover,
                tmpdir=self._tmpdir,
            )
            for cap in source.capabilities:
                self.writer.submit_capability(cap)
            source.start()
        except Exception as exc:
            self.torch_source = None
            self._disable_torch(exc)
            return
        self.torch_source = source
        self.writer.submit_capability(Capability("torch_profiler", "ok"))
        self.recorder.recording = self._is_recorded(self._last_action)

    def _handover(self, path: str, index: int) -> None:
        self._windows_handed += 1
        self.handed_over_at.append(time.monotonic())
        if self._stopped:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return
        self.writer.submit_window(path, index)

    def _disable_torch(self, exc: BaseException) -> None:
        from tessera_tb.trace.step import Capability

        source, self.torch_source = self.torch_source, None
        if source is not None and source.prof is not None and not source.stopped:
            source.stopped = True
            with contextlib.suppress(Exception):
                source.prof.stop()
        reason = f"disabled after an error at step {self.step_num} ({type(exc).__name__}: {exc})"
        self.box.add(
            "torch-error",
            f"tessera capture: the PyTorch profiler source is {reason}; regions, marks, "
            "counters and step times are still recorded",
        )
        if self.writer is not None:
            self.writer.submit_capability(Capability("torch_profiler", "unavailable", reason))
            self.writer.submit_no_trace(reason)

    def _wait_for_nvml(self) -> None:
        self._await_nvml = False
        if not self.writer.nvml_settled.wait(NVML_START_TIMEOUT_S):
            self.box.add(
                "nvml-slow",
                f"tessera capture: the NVML sampler did not start within "
                f"{NVML_START_TIMEOUT_S:g} s; the first recorded steps may have no NVML samples",
            )

    def _on_capture_stopped(self, reason: str) -> None:
        self._stopped = True

    @staticmethod
    def _is_recorded(action: str) -> bool:
        return action in (sched.RECORD, sched.RECORD_AND_SAVE)

    def _action(self, step: int) -> str:
        """The schedule's action for `step`, cut short by the caps or a stopped capture.

        A window that has to end early is ended with RECORD_AND_SAVE (torch drops a window
        that goes from RECORD straight to NONE). Called once per step by torch (or by
        `step()` without torch); repeated calls for one step give the same answer.
        """
        if self._action_cache[0] == step:
            return self._action_cache[1]
        action = self.schedule.action(step)
        if (
            step == 0
            and self.step_source == "pending"
            and action not in (sched.RECORD, sched.RECORD_AND_SAVE)
        ):
            # Provisional: if the block never ends a step, step 0 is the whole block.
            self._provisional = True
            action = sched.RECORD
        prev = self._last_action
        open_window = prev in (sched.WARMUP, sched.RECORD)
        if self._stopped:
            out = sched.RECORD_AND_SAVE if open_window else sched.NONE
        elif action in (sched.RECORD, sched.RECORD_AND_SAVE):
            if self._active_seen >= self.max_steps:
                out = sched.RECORD_AND_SAVE if open_window else sched.NONE
                self._cap_reached()
            elif self._active_seen == self.max_steps - 1:
                out = sched.RECORD_AND_SAVE
            else:
                out = action
        elif action == sched.WARMUP and self._active_seen >= self.max_steps:
            out = sched.NONE
            self._cap_reached()
        else:
            out = action
        self._last_action = out
        self._action_cache = (step, out)
        return out

    def _cap_reached(self) -> None:
        self.box.add(
            "stopped",
            f"tessera capture: capture stopped: max_steps={self.max_steps} steps recorded; "
            f"they are in {self.run_dir}, training continues without profiling",
        )


def _step_list(steps: Sequence[int]) -> str:
    """`2-4` for a run of consecutive steps, `12-14, 17-19` for several (at most 8 shown)."""
    runs: list[list[int]] = []
    for s in sorted(steps):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    parts = [f"{a}-{b}" if b > a else str(a) for a, b in runs]
    shown = ", ".join(parts[:8])
    return shown + (f", ... ({len(steps)} steps)" if len(parts) > 8 else "")


def session(
    activities: Sequence[str] | None = None,
    *,
    record_shapes: bool = False,
    with_stack: bool = False,
    sample_interval_ms: float = 10,
    schedule: sched.Schedule | None = None,
    ranks: Iterable[int] | None = None,
    exporters: Sequence = (),
    tensorboard_dir: str | os.PathLike | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    writer: str = "process",
    overwrite: bool = False,
) -> Session:
    """A capture session: `with profile.session(tensorboard_dir="runs/exp1") as sess: ...`.

    `tensorboard_dir` is the run directory (`tensorboard --logdir` it or its parent); without
    one a temporary directory is used (`sess.run_dir`). `writer="thread"` writes on a thread
    of this process instead of a child process (docs/CAPTURE.md says when that costs).

    A `tensorboard_dir` that already holds a capture of this worker keeps it: the session
    writes to `<tensorboard_dir>/capture-2` (then `capture-3`, ...), a run of its own, and
    warns where. `overwrite=True` replaces the earlier capture instead.
    """
    return Session(
        activities,
        record_shapes=record_shapes,
        with_stack=with_stack,
        sample_interval_ms=sample_interval_ms,
        schedule=schedule,
        ranks=ranks,
        exporters=exporters,
        tensorboard_dir=tensorboard_dir,
        max_steps=max_steps,
        max_bytes=max_bytes,
        writer=writer,
        overwrite=overwrite,
    )
