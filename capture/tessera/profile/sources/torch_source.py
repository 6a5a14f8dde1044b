"""The PyTorch source: Kineto/CUPTI through `torch.profiler`, driven by the session's steps.

Activities map onto torch: `cpu` -> `ProfilerActivity.CPU`; `gpu`, `memcpy`, `collective`
-> `ProfilerActivity.CUDA` (one switch in Kineto: asking for any of them records kernels,
copies, memsets and NCCL kernels) when CUDA is available; `memory` -> `profile_memory=True`.
CPU activity is on whenever the source runs: the step markers and the runtime calls that
link kernels to their ops are CPU events.
The session's schedule is torch's schedule (same step numbers: `ProfilerStep#N` = our step
N; `sess.step()` calls `prof.step()`).

Hand-over: torch calls `on_trace_ready` inside the `step()` that ends a window. There the
window's trace is written by Kineto to a temporary JSON file (on tmpfs when there is room)
and the file's path goes to the background writer; decoding, merging and writing happen
there. Kineto's JSON writer holds the GIL, so running it on the background thread would not
take its cost off the training thread; it runs in the callback, and the time it takes is
recorded as the hand-over cost (`handover_ns`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable

from tessera.profile import scheduling as sched
from tessera_tb.trace.step import Capability

DEVICE_ACTIVITIES = ("gpu", "memcpy", "collective")
TORCH_ACTIVITIES = ("cpu", *DEVICE_ACTIVITIES, "memory")
_TMPFS = "/dev/shm"
_TMPFS_MIN_FREE_BYTES = 1 << 30


def capture_tmpdir() -> str:
    """A private directory for window traces: on tmpfs when it has 1 GiB free, else $TMPDIR."""
    root = None
    try:
        if os.path.isdir(_TMPFS) and os.access(_TMPFS, os.W_OK):
            if shutil.disk_usage(_TMPFS).free >= _TMPFS_MIN_FREE_BYTES:
                root = _TMPFS
    except OSError:
        root = None
    _remove_stale(root or tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"tessera-capture-{os.getpid()}-", dir=root)


def _remove_stale(root: str) -> None:
    """Remove window directories left by capture processes that no longer exist (SIGKILL)."""
    try:
        names = [n for n in os.listdir(root) if n.startswith("tessera-capture-")]
    except OSError:
        return
    for name in names:
        pid = name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except OSError:
            pass


class TorchSource:
    """Runs `torch.profiler.profile` with the session's schedule and hands windows over."""

    def __init__(
        self,
        torch,
        activities: set[str],
        *,
        record_shapes: bool,
        with_stack: bool,
        schedule_fn: Callable[[int], str],
        handover: Callable[[str, int], None],
        tmpdir: str,
    ):
        self.torch = torch
        self.tmpdir = tmpdir
        self._handover = handover
        self._window = 0
        self.handover_ns: list[int] = []  # time spent in on_trace_ready, per window
        self.prof = None  # the torch.profiler.profile object, kept after stop()
        self.stopped = False
        from torch.profiler import ProfilerAction, ProfilerActivity

        self.cuda = bool(torch.cuda.is_available())
        self.capabilities: list[Capability] = []
        # CPU is always on: the step markers (ProfilerStep#N) and the launching runtime calls
        # that link kernels to ops are CPU activity.
        kinds = [ProfilerActivity.CPU]
        device_wanted = activities & set(DEVICE_ACTIVITIES)
        if device_wanted and self.cuda:
            kinds.append(ProfilerActivity.CUDA)
        self._add_caps(activities, record_shapes, with_stack)
        self.activities = kinds
        actions = {
            sched.NONE: ProfilerAction.NONE,
            sched.WARMUP: ProfilerAction.WARMUP,
            sched.RECORD: ProfilerAction.RECORD,
            sched.RECORD_AND_SAVE: ProfilerAction.RECORD_AND_SAVE,
        }
        self._schedule = lambda step: actions[schedule_fn(step)]
        self._kwargs = dict(
            record_shapes=bool(record_shapes),
            with_stack=bool(with_stack),
            profile_memory="memory" in activities,
        )

    def _add_caps(self, activities: set[str], record_shapes: bool, with_stack: bool) -> None:
        caps = self.capabilities
        ok = Capability
        caps.append(ok("cpu_ops", "ok"))
        why_no_cuda = (
            f"torch.cuda.is_available() is False (torch {self.torch.__version__}: "
            "CPU-only build or no GPU visible)"
        )
        for name, activity in (
            ("device_activity", "gpu"),
            ("memcpy", "memcpy"),
            ("collectives", "collective"),
        ):
            if activity not in activities:
                caps.append(ok(name, "unavailable", f"not requested (activity {activity!r})"))
            elif not self.cuda:
                caps.append(ok(name, "unavailable", why_no_cuda))
            else:
                caps.append(ok(name, "ok"))
        if "memory" in activities:
            caps.append(ok("memory", "ok"))
        else:
            caps.append(ok("memory", "unavailable", "not requested (activity 'memory')"))
        caps.append(
            ok("shapes", "ok")
            if record_shapes
            else ok("shapes", "unavailable", "record_shapes=False")
        )
        caps.append(
            ok("stacks", "ok") if with_stack else ok("stacks", "unavailable", "with_stack=False")
        )

    def start(self) -> None:
        # torch warns that each cycle's events are cleared at its end: the session hands each
        # cycle over before that, so the warning would only mislead.
        warnings.filterwarnings(
            "ignore", message="Warning: Profiler clears events at the end of each cycle"
        )
        self.prof = self._new_profile()
        self.prof.start()

    def _new_profile(self):
        from torch.profiler import profile

        return profile(
            activities=self.activities,
            schedule=self._schedule,
            on_trace_ready=self._on_trace_ready,
            **self._kwargs,
        )

    def step(self) -> None:
        self.prof.step()

    def restart_at(self, step: int) -> None:
        """Drop what the profiler recorded so far (nothing is exported) and run a fresh one
        from `step` on: the session's provisional step 0 when the program turned out to have
        steps. torch has no "start at step N", so the fresh profiler's step counter (the
        `ProfilerStep#N` names and the schedule's argument) is set before it starts."""
        old = self.prof
        old.on_trace_ready = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            old.stop()
        self.prof = prof = self._new_profile()  # asks the schedule for step 0: no effect
        action = prof.schedule(step)
        prof.step_num = step
        prof.current_action = action
        if hasattr(prof, "_prev_schedule_action"):
            prof._prev_schedule_action = action
        prof.start()

    def stop(self) -> None:
        if self.prof is not None and not self.stopped:
            self.stopped = True
            self.prof.stop()

    def _on_trace_ready(self, prof) -> None:
        t0 = time.perf_counter_ns()
        path = os.path.join(self.tmpdir, f"window_{self._window:06d}.json")
        index = self._window
        self._window += 1
        prof.export_chrome_trace(path)
        self._handover(path, index)
        self.handover_ns.append(time.perf_counter_ns() - t0)
