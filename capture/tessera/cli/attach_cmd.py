"""Attach to a running process and sample its GPUs' NVML counters until it exits.

Samples every --sample-interval-ms, for each GPU on which the process has a compute context
(every GPU when NVML lists none for it): device-wide power, temperature, SM/memory clocks,
utilization, throttle reasons and memory used (the NVML counters of a capture session), and,
where NVML offers them, the process's own SM and memory utilization and GPU memory. Stops
when the process exits, on Ctrl-C, or after --duration-s. Writes a Chrome/Perfetto trace with
one counter track per counter (--export) and a CSV summary per counter (--summary).

Example:
  tessera-prof attach --pid 4242 --sample-interval-ms 10 --export trace.json --summary perf.csv
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time

HELP = "sample NVML counters of a running process's GPUs"

PROCESS_COUNTERS = {
    "proc_sm_util_pct": "%",
    "proc_mem_util_pct": "%",
    "proc_mem_used_bytes": "bytes",
}
SUMMARY_COLUMNS = ["device", "scope", "counter", "unit", "samples", "min", "mean", "max", "last"]


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pid", type=int, required=True, help="process to attach to")
    p.add_argument(
        "--sample-interval-ms", type=float, default=10.0, help="sampling period (default 10)"
    )
    p.add_argument("--export", metavar="TRACE_JSON", help="write a Chrome/Perfetto trace here")
    p.add_argument("--summary", metavar="CSV", help="write a per-counter summary CSV here")
    p.add_argument(
        "--duration-s", type=float, help="stop after this many seconds (default: until exit)"
    )


def _fail(message: str) -> int:
    print(f"tessera-prof attach: error: {message}", file=sys.stderr)
    return 2


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
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    if args.pid <= 0 or not pid_alive(args.pid):
        return _fail(f"no process with pid {args.pid}")
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
    series = counter_series(ts, rows)
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
        writer.writerows(summary_rows(series))
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
