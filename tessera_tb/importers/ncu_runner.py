"""Run a program under Nsight Compute and read its report back (`tessera-prof counters`).

`profile_program` starts `ncu <sections and filters> -o REPORT <program>` with the program's
session in marker-only mode (`TESSERA_MARKERS_ONLY`, nvtx_markers.py), reports progress per
profiled kernel, and turns what goes wrong into one-line NcuError messages that say what to
change: ncu missing, counters not permitted (ERR_NVGPUCTRPERM), the program failing under ncu
(with its last lines), no kernel in the chosen step, a kernel ncu could not profile.
`export_raw_csv` turns a `.ncu-rep` into the raw-page CSV that `ncu_csv.read_ncu_csv` reads.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

NCU_CANDIDATES = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")
PERM_HELP = (
    "GPU performance counters are not permitted for this user (ERR_NVGPUCTRPERM): run as "
    "root, or let every user read them (`options nvidia NVreg_RestrictProfilingToAdminUsers=0` "
    "in /etc/modprobe.d/, then reload the nvidia module or reboot); in a container, add "
    "--cap-add SYS_ADMIN"
)
_PROFILING = re.compile(
    r'==PROF== Profiling "(?P<name>[^"]*)"(?: - (?P<id>\d+))?.*?(?:(?P<passes>\d+) passes)?\s*$'
)
_ERROR = "==ERROR=="
_APP_FAILED = "The application returned an error code"
_UNKNOWN_METRIC = re.compile(
    r"(?:Failed to find metrics?|[Uu]nknown metrics?|[Ii]nvalid metrics?|metrics? not found)"
    r"\W*(?P<name>[A-Za-z_][\w.]*__[\w.]+)?"
)
_BAD_OPTION = re.compile(r"(?:unrecogni[sz]ed|unknown|invalid) (?:option|argument)", re.IGNORECASE)
_KERNEL_FAILED = re.compile(
    r"Failed to profile|[Pp]rofiling failed|could not be (?:collected|profiled)"
)
TAIL_LINES = 12


class NcuError(Exception):
    """One line for the user: what went wrong and what to change."""


class NcuUnknownMetric(NcuError):
    """ncu refused a metric name this GPU or ncu version does not have (`metric`: the name,
    or "" when ncu's line did not name it)."""

    def __init__(self, message: str, metric: str) -> None:
        super().__init__(message)
        self.metric = metric


class NcuNoKernels(NcuError):
    """ncu ran the program to the end but profiled no kernel (no launch passed its filters)."""


def find_ncu(explicit: str | None = None) -> str:
    """The ncu executable: `explicit`, else `ncu` on PATH, else the usual install places."""
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise NcuError(f"--ncu {explicit}: not an executable file")
    found = shutil.which("ncu")
    if found:
        return found
    for path in NCU_CANDIDATES:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise NcuError(
        "ncu (Nsight Compute) not found on PATH: install Nsight Compute (it comes with the CUDA "
        "toolkit, e.g. /usr/local/cuda/bin) and add it to PATH, or pass --ncu /path/to/ncu"
    )


@dataclass
class NcuRun:
    """What one ncu pass did."""

    report: str  # path of the .ncu-rep
    profiled: int  # kernels ncu said it profiled
    passes: int  # replay passes per kernel (last seen)
    seconds: float
    kernel_errors: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)


def profile_program(
    ncu: str,
    ncu_args: Sequence[str],
    program: Sequence[str],
    report_base: str,
    *,
    expected: int,
    progress: Callable[[str], None] | None = None,
    echo: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
) -> NcuRun:
    """Run `program` under ncu, writing `report_base.ncu-rep`. Raises NcuError."""
    if not program:
        raise NcuError("no program to run: give it after --, e.g. -- python train.py")
    cmd = [ncu, "--force-overwrite", "--export", report_base, *ncu_args, *program]
    run_env = dict(os.environ if env is None else env)
    run_env["TESSERA_MARKERS_ONLY"] = "Nsight Compute"
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            env=run_env,
        )
    except OSError as exc:
        raise NcuError(f"cannot start {ncu} ({exc.strerror or exc})") from None
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    app_tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    profiled, passes, kernel_errors, perm, app_failed = 0, 0, [], False, False
    unknown_metric = bad_option = ""
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.rstrip("\n")
        tail.append(line)
        if "ERR_NVGPUCTRPERM" in line:
            perm = True
        m = _PROFILING.match(line)
        if m:
            profiled += 1
            if m.group("passes"):
                passes = int(m.group("passes"))
            if progress is not None:
                progress(
                    f"[{time.monotonic() - t0:7.1f}s] kernel {profiled}/{expected} "
                    f"{m.group('name')}" + (f" ({passes} passes)" if passes else "")
                )
            continue
        if line.startswith(_ERROR):
            text = line[len(_ERROR) :].strip()
            if _APP_FAILED in text:
                app_failed = True
            elif _UNKNOWN_METRIC.search(text):
                unknown_metric = unknown_metric or text
            elif _BAD_OPTION.search(text):
                bad_option = bad_option or text
            elif _KERNEL_FAILED.search(text):
                kernel_errors.append(text)
            continue
        if line.startswith("==PROF==") or line.startswith("==WARNING=="):
            continue
        app_tail.append(line)
        if echo is not None:
            echo(line)
    rc = proc.wait()
    seconds = time.monotonic() - t0
    if perm:
        raise NcuError(PERM_HELP)
    if bad_option:
        raise NcuError(
            f"ncu refused an option ({bad_option}): this needs Nsight Compute 2023.1 or newer "
            "(NVTX filters, --filter-mode per-launch-config); update it, or try --all-launches"
        )
    if unknown_metric:
        m = _UNKNOWN_METRIC.search(unknown_metric)
        raise NcuUnknownMetric(
            f"ncu does not know a metric it was asked for on this GPU: {unknown_metric}",
            (m.group("name") or "") if m else "",
        )
    if rc != 0 or app_failed:
        last = " | ".join(x for x in app_tail if x.strip())[-600:] or " | ".join(tail)[-600:]
        raise NcuError(
            f"the program failed under ncu (exit status {rc or 'nonzero'}); its last lines: "
            f"{last} -- fix the program (it must run as it did for the run) and try again"
        )
    report = report_base + ".ncu-rep"
    if profiled == 0 or not os.path.isfile(report):
        raise NcuNoKernels(
            "ncu profiled no kernel in the chosen step: the program opened no NVTX range "
            "tessera_step_N for it (does it run under profile.session with CUDA, for as many "
            "steps as the run recorded?); ncu said: " + " | ".join(tail)[-300:]
        )
    if kernel_errors:
        raise NcuError(
            f"ncu could not collect the counters of a kernel: {kernel_errors[0]} -- leave it out "
            "with --kernels REGEX (a regular expression the other kernels match) and try again"
        )
    return NcuRun(report, profiled, passes, seconds, kernel_errors, list(tail))


def export_raw_csv(ncu: str, report: str, csv_path: str) -> None:
    """`ncu --import REPORT --csv --page raw > csv_path`. Raises NcuError."""
    try:
        with open(csv_path, "w", encoding="utf-8") as out:
            proc = subprocess.run(
                [ncu, "--import", report, "--csv", "--page", "raw"],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
    except OSError as exc:
        raise NcuError(f"cannot run {ncu} --import {report} ({exc.strerror or exc})") from None
    if proc.returncode != 0:
        msg = " ".join(proc.stderr.split())[-300:]
        raise NcuError(f"{report}: ncu could not read the report (exit {proc.returncode}): {msg}")
