"""Attach to a running process and sample its GPUs' NVML counters until it exits.

Samples every --sample-interval-ms, for each GPU on which the process has a compute context
(every GPU when NVML lists none for it): device-wide power, temperature, SM/memory clocks,
utilization, throttle reasons and memory used (the NVML counters of a capture session), and,
where NVML offers them, the process's own SM and memory utilization and GPU memory. Stops
when the process exits, on Ctrl-C, or after --duration-s. Writes a Chrome/Perfetto trace with
one counter track per counter (--export) and a CSV summary per counter (--summary).

Domain flags choose what is sampled (none given: all of them): --gpu (power, temperature,
SM clock, utilization, throttle reasons, the process's SM utilization), --mem (memory clock,
memory utilization, memory used, the process's memory), --tc and --collectives. Tensor-core
utilization and collectives cannot be sampled from outside the process (they need counters or
the process's own trace): they appear in the summary with no samples and the reason in its
`capability` column, and are said once on stderr.

Examples (`tessera-prof --pid ...` is the same command as `tessera-prof attach --pid ...`):
  tessera-prof attach --pid 4242 --sample-interval-ms 10 --export trace.json --summary perf.csv
  tessera-prof --pid 4242 --sample-ms 10 --gpu --mem --tc --collectives --export trace.json \
      --summary perf.csv
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time

PROCESS_COUNTERS = {
    "proc_sm_util_pct": "%",
    "proc_mem_util_pct": "%",
    "proc_mem_used_bytes": "bytes",
}
SUMMARY_COLUMNS = [
    "device", "scope", "counter", "unit", "samples", "min", "mean", "max", "last", "capability",
]  # fmt: skip
DOMAIN_COUNTERS = {
    "gpu": (
        "power_w", "temp_c", "sm_clock_mhz", "gpu_util_pct", "throttle_reasons",
        "proc_sm_util_pct",
    ),
    "mem": (
        "mem_clock_mhz", "mem_util_pct", "mem_used_bytes", "proc_mem_util_pct",
        "proc_mem_used_bytes",
    ),
}  # fmt: skip
# What no sampler outside the process can measure: (counter, unit, capability reason).
UNSAMPLED = {
    "tc": [
        (
            "tc_util_pct",
            "%",
            "unavailable: tensor-core utilization needs hardware counters inside the process "
            "(tessera-prof counters RUN -- PROGRAM); NVML has none",
        )
    ],
    "collectives": [
        (
            name,
            unit,
            "unavailable: collectives are seen only in the process's own trace "
            "(profile.session with activity 'collective'); NVML has no collective counters",
        )
        for name, unit in (("collective_bytes", "bytes"), ("collective_overlap_pct", "%"))
    ],
}


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pid", type=int, required=True, help="process to attach to")
    p.add_argument(
        "--sample-interval-ms",
        "--sample-ms",
        dest="sample_interval_ms",
        type=float,
        default=10.0,
        help="sampling period (default 10)",
    )
    for flag, what in (
        ("gpu", "power, temperature, SM clock, utilization, throttle reasons"),
        ("mem", "memory clock, utilization and use"),
        ("tc", "tensor-core utilization (not measurable from outside: reported as null)"),
        ("collectives", "collectives (not measurable from outside: reported as null)"),
    ):
        p.add_argument(f"--{flag}", action="store_true", help=f"sample {what}")
    p.add_argument("--export", metavar="TRACE_JSON", help="write a Chrome/Perfetto trace here")
    p.add_argument("--summary", metavar="CSV", help="write a per-counter summary CSV here")
    p.add_argument(
        "--duration-s", type=float, help="stop after this many seconds (default: until exit)"
    )


def _fail(message: str) -> int:
    print(f"tessera-prof attach: error: {message}", file=sys.stderr)
    return 2


def pid_problem(pid: int) -> str | None:
    """Why `pid` cannot be attached to (dead, a zombie, another user's), or None."""
    if pid <= 0 or not pid_alive(pid):
        return f"no process with pid {pid}"
    try:
        os.kill(pid, 0)
    except PermissionError:
        return f"pid {pid} belongs to another user (run as that user)"
    except ProcessLookupError:
        return f"no process with pid {pid}"
    return None


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return os.path.exists(f"/proc/{pid}") or sys.platform != "linux"


def compute_devices(nv, pid: int) -> list[int]:
    """NVML indices of the devices on which `pid` has a compute context."""
    found = []
    for i in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            continue
        if any(int(p.pid) == pid for p in procs):
            found.append(i)
    return found


class ProcessSampler:
    """Per-process NVML values of one device: memory used, SM and memory utilization."""

    def __init__(self, nv, handle, pid: int):
        self.nv, self.handle, self.pid = nv, handle, pid
        self.last_seen_us = 0
        self.util_supported = True

    def read(self) -> list[float]:
        nv, nan = self.nv, float("nan")
        sm = mem_util = nan
        if self.util_supported:
            try:
                samples = nv.nvmlDeviceGetProcessUtilization(self.handle, self.last_seen_us)
                mine = [s for s in samples if int(s.pid) == self.pid]
                if mine:
                    latest = max(mine, key=lambda s: s.timeStamp)
                    sm, mem_util = float(latest.smUtil), float(latest.memUtil)
                    self.last_seen_us = int(latest.timeStamp)
            except nv.NVMLError_NotSupported:
                self.util_supported = False
            except Exception:
                pass  # NVML_ERROR_NOT_FOUND: no sample since the last one
        used = nan
        try:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if int(p.pid) == self.pid and p.usedGpuMemory is not None:
                    used = float(p.usedGpuMemory)
        except Exception:
            pass
        return [sm, mem_util, used]


def sample(nv, pid: int, devices: list[int], interval_s: float, duration_s: float | None):
    """Sample until the process exits, Ctrl-C or the duration; returns (ts_ns, rows, stop)."""
    from tessera.profile.sources.nvml_source import read_device

    handles = {d: nv.nvmlDeviceGetHandleByIndex(d) for d in devices}
    per_process = {d: ProcessSampler(nv, h, pid) for d, h in handles.items()}
    ts: list[int] = []
    rows: dict[int, list[list[float]]] = {d: [] for d in devices}
    t_end = None if duration_s is None else time.monotonic() + duration_s
    next_t = time.monotonic()
    reason = "process exited"
    try:
        while pid_alive(pid):
            if t_end is not None and time.monotonic() >= t_end:
                reason = f"{duration_s:g} s elapsed"
                break
            ts.append(time.time_ns())
            for d, h in handles.items():
                rows[d].append(read_device(nv, h) + per_process[d].read())
            next_t += interval_s
            time.sleep(max(0.0, next_t - time.monotonic()))
    except KeyboardInterrupt:
        reason = "interrupted"
    return ts, rows, reason


def counter_series(ts: list[int], rows: dict[int, list[list[float]]]):
    """CounterSeries per device and counter (NaN samples: not measured)."""
    import numpy as np

    from tessera.profile.sources.nvml_source import counter_names
    from tessera_tb.trace.step import CounterSeries

    device_counters = list(counter_names().values())
    names = device_counters + list(PROCESS_COUNTERS.items())
    sources = ["nvml"] * len(device_counters) + ["nvml_process"] * len(PROCESS_COUNTERS)
    t = np.array(ts, dtype=np.int64)
    out = []
    for d, table in rows.items():
        values = np.array(table, dtype=np.float64).reshape(len(ts), len(names))
        for j, ((name, unit), source) in enumerate(zip(names, sources)):
            out.append(CounterSeries(name, unit, source, d, t, values[:, j]))
    return out


def summary_rows(series) -> list[dict]:
    import numpy as np

    out = []
    for c in series:
        v = np.asarray(c.values, dtype=np.float64)
        ok = v[np.isfinite(v)]
        out.append(
            {
                "device": c.device,
                "scope": "process" if c.source == "nvml_process" else "device",
                "counter": c.name,
                "unit": c.unit,
                "samples": int(ok.size),
                "min": float(ok.min()) if ok.size else "",
                "mean": float(ok.mean()) if ok.size else "",
                "max": float(ok.max()) if ok.size else "",
                "last": float(ok[-1]) if ok.size else "",
                "capability": "ok" if ok.size else "unavailable: NVML returned no value",
            }
        )
    return out


def chosen_domains(args: argparse.Namespace) -> list[str]:
    """The domain flags given; none given means every domain."""
    given = [d for d in ("gpu", "mem", "tc", "collectives") if getattr(args, d, False)]
    return given or ["gpu", "mem", "tc", "collectives"]


def select_series(series, domains: list[str]):
    """The series of the sampled domains (--gpu, --mem)."""
    keep = {name for d in domains for name in DOMAIN_COUNTERS.get(d, ())}
    return [c for c in series if c.name in keep]


def unsampled_rows(domains: list[str], devices: list[int]) -> list[dict]:
    """Summary rows for what was asked but cannot be sampled from outside: null values and
    the reason."""
    out = []
    for d in domains:
        for name, unit, reason in UNSAMPLED.get(d, ()):
            for dev in devices:
                out.append(
                    {
                        "device": dev, "scope": "process", "counter": name, "unit": unit,
                        "samples": 0, "min": "", "mean": "", "max": "", "last": "",
                        "capability": reason,
                    }
                )  # fmt: skip
    return out


def run(args: argparse.Namespace) -> int:
    problem = pid_problem(args.pid)
    if problem:
        return _fail(problem)
    if args.sample_interval_ms <= 0:
        return _fail("--sample-interval-ms must be positive")
    from tessera.profile.sources.nvml_source import init_nvml

    try:
        nv = init_nvml()
    except RuntimeError as exc:
        return _fail(f"cannot read GPU counters ({exc}): attach needs an NVIDIA driver")
    try:
        devices = compute_devices(nv, args.pid)
        note = ""
        if not devices:
            devices = list(range(nv.nvmlDeviceGetCount()))
            note = f"pid {args.pid} has no compute context NVML can see; sampling every GPU"
            print(f"tessera-prof attach: {note}", file=sys.stderr)
        if not devices:
            return _fail("NVML sees no GPU")
        print(
            f"tessera-prof attach: sampling GPU(s) {devices} of pid {args.pid} every "
            f"{args.sample_interval_ms:g} ms (Ctrl-C to stop)",
            file=sys.stderr,
        )
        ts, rows, reason = sample(
            nv, args.pid, devices, args.sample_interval_ms / 1000.0, args.duration_s
        )
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    if not ts:
        return _fail(f"no sample was taken ({reason})")
    domains = chosen_domains(args)
    series = select_series(counter_series(ts, rows), domains)
    nulls = unsampled_rows(domains, devices)
    for d in domains:
        if UNSAMPLED.get(d):
            names = ", ".join(name for name, _u, _w in UNSAMPLED[d])
            why = UNSAMPLED[d][0][2]
            print(f"tessera-prof attach: {names} null: {why}", file=sys.stderr)
    if args.export:
        from tessera_tb.exporters.chrome_trace import export_chrome_trace
        from tessera_tb.trace.step import StepData, empty_events

        step = StepData(0, ts[0], ts[-1], [""], [], empty_events(), counters=series)
        export_chrome_trace(
            [step], args.export, process_name=f"attach pid {args.pid}", step_slices=False
        )
    if args.summary:
        from tessera_tb.trace.atomic import write_bytes_atomic

        text = io.StringIO()
        writer = csv.DictWriter(text, SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(summary_rows(series) + nulls)
        os.makedirs(os.path.dirname(os.path.abspath(args.summary)), exist_ok=True)
        write_bytes_atomic(args.summary, text.getvalue().encode())
    span_s = (ts[-1] - ts[0]) / 1e9
    print(
        f"attached to pid {args.pid}: {len(ts)} samples of GPU(s) {devices} over {span_s:.2f} s "
        f"({reason})"
        + (f"; trace {args.export}" if args.export else "")
        + (f"; summary {args.summary}" if args.summary else "")
    )
    return 0
