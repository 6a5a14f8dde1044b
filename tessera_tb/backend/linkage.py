"""Launch linkage (METRICS.md, "Time"): device event -> launching call -> owning cpu op."""

from __future__ import annotations

import numpy as np

from tessera_tb.trace.step import DEVICE_KINDS, KIND, StepData


def owning_op_rows(step: StepData) -> np.ndarray:
    """For every event row: the row of its owning cpu op, -1 where there is none.

    A device event's owner is the innermost cpu_op of the host op tree that contains its
    launching runtime/driver call. A host event's owner is the innermost cpu_op containing
    it (itself when it is a cpu_op).
    """
    ev = step.events
    kind, parent = ev["kind"], ev["parent"]
    start = np.where(ev["launch"] >= 0, ev["launch"], np.arange(kind.size, dtype=np.int32))
    owner = start.astype(np.int64)
    active = np.flatnonzero(kind[owner] != KIND["cpu_op"])
    # Climb the tree one level per pass, only for rows still below a non-op.
    while active.size:
        nxt = parent[owner[active]].astype(np.int64)
        owner[active] = nxt
        active = active[nxt >= 0]
        active = active[kind[owner[active]] != KIND["cpu_op"]]
    device_or_host = (ev["launch"] >= 0) | ~np.isin(kind, DEVICE_KINDS)
    owner[~device_or_host] = -1
    return owner.astype(np.int32)
