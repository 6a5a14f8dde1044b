"""NVTX ranges for steps and regions, and detection of the Nsight tools' injection.

When CUDA is there, a running session opens an NVTX range per step and per region, so Nsight
Systems and Nsight Compute see the session's names (`ncu --nvtx --nvtx-include` filters on
them; `tessera-prof counters` relies on it):

- step N: a start/end range named `tessera_step_{N}` (`tessera_tb.nvtx_names`) in NVTX's
  default domain.
  A start/end range, not push/pop: autograd launches backward kernels from its own thread,
  and a push/pop range belongs to the thread that pushed it, so a push/pop step range would
  miss every backward kernel. ncu selects it with `--nvtx-include "tessera_step_3"` (no
  trailing slash: the start/end form of the filter).
- a region: a push/pop range with the region's own name on the thread that entered it.

Under Nsight Compute or Nsight Systems (their injection library holds CUPTI, so Kineto would
record no device activity) a session records these markers only: `injected_tool()` says which
tool injected itself, from the environment the tools set in the profiled process.
"""

from __future__ import annotations

import os

from tessera_tb.nvtx_names import step_range_name

# Set by `tessera-prof counters` in the program it runs under ncu; the injection variables
# below are the tools' own.
MARKERS_ENV = "TESSERA_MARKERS_ONLY"
_INJECTION_ENV = "CUDA_INJECTION64_PATH"
_NSYS_SESSION_ENV = "NSYS_PROFILING_SESSION_ID"  # set by nsys in the processes it profiles
_TOOLS = (
    # (substring of the injection library's path, lower case) -> tool
    ("nsight-compute", "Nsight Compute"),
    ("nsight_compute", "Nsight Compute"),
    ("treelauncher", "Nsight Compute"),
    ("nsight-systems", "Nsight Systems"),
    ("nsight_systems", "Nsight Systems"),
    ("toolsinjection", "Nsight Systems"),
)


def injected_tool(environ: dict[str, str] | None = None) -> str | None:
    """ "Nsight Compute", "Nsight Systems", another injected CUPTI tool's library name, or None.

    `TESSERA_MARKERS_ONLY=<tool>` (set by `tessera-prof counters`) names the tool directly;
    otherwise `CUDA_INJECTION64_PATH`, which ncu and nsys set in the process they profile,
    names the tool's library (`none`, a common setting, is no tool); nsys also sets
    `NSYS_PROFILING_SESSION_ID`. Any injected library is taken as a tool holding CUPTI.
    """
    env = os.environ if environ is None else environ
    forced = env.get(MARKERS_ENV, "").strip()
    if forced:
        return forced
    path = env.get(_INJECTION_ENV, "").strip()
    if not path or path.lower() == "none":  # `none` is a common "no injection" setting
        return "Nsight Systems" if env.get(_NSYS_SESSION_ENV, "").strip() else None
    low = path.lower()
    for needle, tool in _TOOLS:
        if needle in low:
            return tool
    return f"a CUDA injection library ({os.path.basename(path)})"


class NvtxMarkers:
    """Opens the session's NVTX ranges through `torch.cuda.nvtx` (a no-op without a tool).

    `api` is an object with `range_start(name) -> id`, `range_end(id)`, `range_push(name)`
    and `range_pop()` (torch.cuda.nvtx's functions).
    """

    def __init__(self, api) -> None:
        self.api = api
        self._step_id = None

    def start_step(self, step: int) -> None:
        self.end_step()
        self._step_id = self.api.range_start(step_range_name(step))

    def end_step(self) -> None:
        if self._step_id is not None:
            step_id, self._step_id = self._step_id, None
            self.api.range_end(step_id)

    def push(self, name: str) -> None:
        self.api.range_push(name)

    def pop(self) -> None:
        self.api.range_pop()


def torch_nvtx_markers(torch) -> NvtxMarkers | None:
    """Markers through torch's NVTX bindings when CUDA is available, else None."""
    try:
        if not torch.cuda.is_available():
            return None
        import torch.cuda.nvtx as nvtx

        return NvtxMarkers(nvtx)
    except Exception:  # a broken or CPU-only build: no markers, training goes on
        return None
