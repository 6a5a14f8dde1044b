"""A worker's capabilities say which kinds of events its steps hold: read back from the step
files of each shared trace's import, not from the importer's own bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tb.trace import open_run
from tessera_tb.trace.step import KIND_NAMES
from tests.conftest import shared_trace_files, trace_id


def _kinds_in_steps(run) -> dict[str, set[str]]:
    kinds: dict[str, set[str]] = {}
    for worker, step in run.iter_steps():
        present = np.unique(step.events["kind"]).tolist()
        kinds.setdefault(worker, set()).update(KIND_NAMES[present].tolist())
    return kinds


@pytest.mark.parametrize("path", shared_trace_files(), ids=trace_id)
def test_capabilities_follow_the_kinds_the_steps_hold(path, imported_runs):
    run = open_run(imported_runs(path))
    for worker, kinds in _kinds_in_steps(run).items():
        caps = {c.name: c.status for c in run.worker(worker).meta.capabilities}
        device = bool(kinds & {"kernel", "collective", "memcpy", "memset"})
        assert caps["device_activity"] == ("ok" if device else "unavailable")
        assert caps["stacks"] == ("ok" if "python" in kinds else "unavailable")
        assert caps["memory"] == ("ok" if "memory" in kinds else "unavailable")
        want = "ok" if "profiler_range" in kinds else "unavailable"
        assert caps["cupti_range_counters"] == want


def test_the_stack_trace_has_device_activity_and_stacks(imported_runs):
    """Not every capability is off: the single-GPU trace recorded with stacks has both."""
    (path,) = [p for p in shared_trace_files() if "gpt_1gpu_stack" in p]
    run = open_run(imported_runs(path))
    (worker,) = run.workers
    kinds = _kinds_in_steps(run)[worker]
    assert {"kernel", "python"} <= kinds and len(kinds) >= 4
    caps = {c.name: c.status for c in run.worker(worker).meta.capabilities}
    assert caps["device_activity"] == caps["stacks"] == "ok"
