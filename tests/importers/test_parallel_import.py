"""Importing several workers at once (jobs > 1) writes exactly what one at a time writes."""

from __future__ import annotations

import os

import pytest
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

from tessera_tb.importers.kineto_import import ImportFailed, import_traces
from tests.conftest import SHARED_TRACES, assert_same_files, file_contents

FSDP = os.path.join(SHARED_TRACES, "pytorch", "fsdp_gpt_4rank")
DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")


def _run_files(run_dir: str) -> dict[str, bytes]:
    """Every file of a run; event files by worker, without their first record (it holds the
    time the file was opened)."""
    out = {}
    for name, data in file_contents(run_dir).items():
        if name.startswith("events.out.tfevents."):
            records = list(RawEventFileLoader(os.path.join(run_dir, name)).Load())
            out["events:" + name.rsplit(".", 1)[-1]] = b"".join(records[1:])
        else:
            out[name] = data
    return out


@pytest.mark.parametrize("jobs", [2, 4, 0])
def test_parallel_import_writes_the_same_run_as_a_serial_one(jobs, tmp_path):
    serial = import_traces([FSDP], str(tmp_path / "a"), "r", jobs=1)
    parallel = import_traces([FSDP], str(tmp_path / "b"), "r", jobs=jobs)
    assert [w.worker for w in parallel.workers] == ["rank0", "rank1", "rank2", "rank3"]
    assert [w.steps for w in parallel.workers] == [w.steps for w in serial.workers]
    a, b = _run_files(serial.run_dir), _run_files(parallel.run_dir)
    assert sorted(a) == sorted(b) and len(a) == 4 * 4 + 4  # 3 steps + meta per rank, 4 event files
    assert_same_files(a, b)


def test_a_failing_worker_fails_the_parallel_import_and_leaves_nothing(tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in os.listdir(DDP):
        if f.endswith(".json.gz"):
            os.symlink(os.path.join(DDP, f), mixed / f)
    (mixed / "rank2.1.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": "x"}]}')
    logdir = tmp_path / "logdir"
    with pytest.raises(ImportFailed) as err:
        import_traces([str(mixed)], str(logdir), "r", jobs=3)
    assert "rank2.1.pt.trace.json" in str(err.value) and "traceEvents[0]" in str(err.value)
    assert os.listdir(logdir) == []
