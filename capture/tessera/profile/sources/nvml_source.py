"""The NVML sampler: power, temperature, clocks, utilization, throttle reasons and memory used.

A daemon thread reads NVML (package nvidia-ml-py, import name `pynvml`) every
`sample_interval_ms` for each sampled device and keeps the samples in memory; the background
writer cuts them per step (`samples_for`, then `nvml_csv.counters_between`). Counter names and
units are those of the NVML CSV importer (`tessera_tb.importers.nvml_csv.NVML_COLUMNS`), so a
captured run and an imported one read the same.

Without a driver (or without nvidia-ml-py) nothing is sampled and the capability says why.
A value NVML does not support on the device is NaN (not measured), never 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# What each sample reads, under the column names of the NVML sample CSV; the counter names
# and units come from the CSV importer's table (`nvml_csv.NVML_COLUMNS`) when samples are
# turned into counter tracks. This module imports nothing heavy, so that the sampler starts
# within moments of the writer process.
_COLUMNS = [
    "power_w", "temp_c", "sm_mhz", "mem_mhz", "gpu_util", "mem_util", "throttle", "mem_used",
]  # fmt: skip


@dataclass
class Capability:
    """The sampler's capability (same fields as `tessera_tb.trace.step.Capability`)."""

    name: str
    status: str
    reason: str = ""


def counter_names() -> dict[str, tuple[str, str]]:
    """CSV column -> (counter name, unit), the importer's table."""
    from tessera_tb.importers.nvml_csv import NVML_COLUMNS

    return {c: NVML_COLUMNS[c] for c in _COLUMNS}


def nvml_reason(exc: BaseException) -> str:
    """NVML's own words for a failure (e.g. "NVML Shared Library Not Found")."""
    text = str(exc).strip() or type(exc).__name__
    return f"NVML: {text}"


def init_nvml():
    """Import and initialise NVML; returns the `pynvml` module or raises with NVML's reason."""
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError(
            f"nvidia-ml-py is not installed ({exc}); pip install 'tessera-profiler[nvml]'"
        ) from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses
        raise RuntimeError(nvml_reason(exc)) from None
    return pynvml


def read_device(nv, handle) -> list[float]:
    """One sample of every NVML counter of a device, in `_COLUMNS` order (NaN: not supported)."""

    def get(fn: Callable[[], float]) -> float:
        try:
            return float(fn())
        except Exception:
            return float("nan")

    util = None
    try:
        util = nv.nvmlDeviceGetUtilizationRates(handle)
    except Exception:
        pass
    throttle = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    values = {
        "power_w": get(lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        "temp_c": get(lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)),
        "sm_mhz": get(lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
        "mem_mhz": get(lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM)),
        "gpu_util": float(util.gpu) if util is not None else float("nan"),
        "mem_util": float(util.memory) if util is not None else float("nan"),
        "throttle": get(lambda: throttle(handle)),
        "mem_used": get(lambda: nv.nvmlDeviceGetMemoryInfo(handle).used),
    }
    return [values[c] for c in _COLUMNS]


class NvmlSampler:
    """Samples NVML counters of some devices on a daemon thread.

    `devices` maps the device index used in the trace (CUDA index) to an NVML handle
    lookup: a UUID string ("GPU-...") or an NVML index. `None` samples every NVML device
    under its NVML index.
    """

    def __init__(
        self,
        interval_ms: float,
        devices: dict[int, str | int] | None,
        on_error: Callable[[str], None],
    ):
        self.interval_s = max(float(interval_ms), 1.0) / 1000.0
        self._wanted = devices
        self._on_error = on_error
        self.capability = Capability("nvml", "unavailable", "not started")
        self._handles: dict[int, object] = {}
        self._ts: list[int] = []
        self._rows: dict[int, list[list[float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv = None

    def start(self) -> bool:
        """Initialise NVML and start sampling; False (capability says why) when impossible."""
        try:
            nv = init_nvml()
            if self._wanted is None:
                wanted = {i: i for i in range(nv.nvmlDeviceGetCount())}
            else:
                wanted = self._wanted
            for device, key in wanted.items():
                if isinstance(key, str):
                    self._handles[device] = nv.nvmlDeviceGetHandleByUUID(key)
                else:
                    self._handles[device] = nv.nvmlDeviceGetHandleByIndex(int(key))
            if not self._handles:
                raise RuntimeError("NVML sees no device")
        except Exception as exc:
            reason = str(exc) if isinstance(exc, RuntimeError) else nvml_reason(exc)
            self.capability = Capability("nvml", "unavailable", reason)
            return False
        self._nv = nv
        self._rows = {d: [] for d in self._handles}
        self.capability = Capability("nvml", "ok", "")
        self._thread = threading.Thread(target=self._run, name="tessera-nvml", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        nv, handles = self._nv, self._handles
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                t_ns = time.time_ns()
                rows = {d: read_device(nv, h) for d, h in handles.items()}
                with self._lock:
                    self._ts.append(t_ns)
                    for d, row in rows.items():
                        self._rows[d].append(row)
            except Exception as exc:  # a sampler that raises is disabled, training goes on
                self.capability = Capability("nvml", "unavailable", f"sampler failed: {exc}")
                self._on_error(f"NVML sampler disabled after an error: {exc}")
                return
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
            self._nv = None

    def samples_for(self, device: int):
        """The samples of one device so far, as the CSV importer's `NvmlSamples`."""
        import numpy as np

        from tessera_tb.importers.nvml_csv import NvmlSamples

        with self._lock:
            if device not in self._rows or not self._ts:
                return None
            ts = np.array(self._ts, dtype=np.int64)
            table = np.array(self._rows[device], dtype=np.float64).reshape(len(ts), len(_COLUMNS))
        names = counter_names()
        series = {names[c][0]: (names[c][1], table[:, i]) for i, c in enumerate(_COLUMNS)}
        return NvmlSamples(path="<nvml sampler>", ts_ns=ts, series=series)

    @property
    def devices(self) -> list[int]:
        return list(self._handles)

    def forget_before(self, t_ns: int) -> None:
        """Drop samples older than `t_ns` (already written), so memory stays bounded."""
        import bisect

        with self._lock:
            if not self._ts or self._ts[0] >= t_ns:
                return
            cut = bisect.bisect_left(self._ts, t_ns)
            del self._ts[:cut]
            for rows in self._rows.values():
                del rows[:cut]
