"""The run's event file is what TensorBoard's own writer and reader make of it."""

from __future__ import annotations

import glob
import os

import pytest
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import summary_v2
from tensorboard.summary.writer.record_writer import RecordWriter

from tessera_tb.importers.kineto_import import import_traces
from tessera_tb.trace import scalars
from tests.conftest import SHARED_TRACES


def _tensorboard_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    summary = summary_pb2.Summary()
    summary.value.append(summary_v2.scalar_pb(tag, value).value[0])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


@pytest.mark.parametrize(
    "tag,value,step,wall_time",
    [
        ("tessera/step_time_ms/rank0", 49.633, 5, 1790857026.0421),
        ("tessera/gpu_busy_pct/worker0", 100.0, 0, 0.0),
        ("tessera/step_time_ms/" + "w" * 200, -1.5e-9, -3, 1.0),
        ("tessera/step_time_ms/r\u00e9", 3.4e38, 2**40, 2e9),
    ],
)
def test_scalar_events_are_byte_identical_to_tensorboards(tag, value, step, wall_time):
    ours = scalars._event(wall_time, step, summary=scalars.scalar_summary(tag, value))
    assert ours == _tensorboard_event(tag, value, step, wall_time)


def test_records_are_framed_as_tensorboards_record_writer_frames_them(tmp_path):
    payload = _tensorboard_event("t", 1.0, 1, 2.0)
    path = tmp_path / "records"
    with open(path, "wb") as f:
        RecordWriter(f).write(payload)
    assert path.read_bytes() == scalars.tfrecord(payload)
    assert scalars.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_tensorboards_loader_reads_an_imported_runs_scalars(tmp_path):
    traces = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")
    run_dir = import_traces([traces], str(tmp_path), "ddp").run_dir
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    assert [f.rsplit(".", 1)[-1] for f in files] == ["rank0", "rank1"]
    for path in files:
        events = [event_pb2.Event.FromString(e) for e in RawEventFileLoader(path).Load()]
        assert events[0].file_version == scalars.FILE_VERSION
        values = {(v.tag, e.step) for e in events[1:] for v in e.summary.value}
        worker = path.rsplit(".", 1)[-1]
        assert values == {
            (f"tessera/{name}/{worker}", step)
            for name in ("step_time_ms", "gpu_busy_pct")
            for step in (4, 5, 6)
        }
