"""GPU busy % (METRICS.md, "Time": GPU busy % of a device in a step)."""

from __future__ import annotations

import numpy as np

from tessera_tb.backend.intervals import union_length_ns
from tessera_tb.trace.step import IS_DEVICE_WORK, StepData

# Device work that makes a GPU busy. gpu_user_annotation labels are excluded (METRICS.md).


def gpu_busy_pct_by_device(step: StepData) -> dict[int, float]:
    """busy_pct per device: |union of kernel, memcpy, memset intervals| / step span x 100."""
    span = step.span_ns
    if span <= 0:
        return {}
    ev = step.events
    busy = IS_DEVICE_WORK[ev["kind"]]
    if not busy.any():
        return {}
    device_of_track = np.array([t.device for t in step.tracks], dtype=np.int64)
    devices = device_of_track[ev["track_id"][busy]]
    starts = ev["start_ns"][busy]
    ends = starts + ev["dur_ns"][busy]
    if devices.min() == devices.max():  # one device (most steps): no np.unique, no masks
        length = union_length_ns(starts, ends, step.start_ns, step.end_ns)
        return {int(devices[0]): 100.0 * length / span}
    out = {}
    for d in np.unique(devices):
        m = devices == d
        out[int(d)] = 100.0 * union_length_ns(starts[m], ends[m], step.start_ns, step.end_ns) / span
    return out


def gpu_busy_pct(step: StepData) -> float | None:
    """The busiest device's GPU busy % in the step; None when the step has no device work."""
    by_device = gpu_busy_pct_by_device(step)
    return max(by_device.values()) if by_device else None
