"""TensorBoard event files for a run: per-step scalars, tagged per worker.

Tags are `tessera/step_time_ms/<worker>` and `tessera/gpu_busy_pct/<worker>`, so ranks
do not interleave in TensorBoard's Scalars tab. Each worker writes its own event file.
"""

from __future__ import annotations

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import summary_v2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tessera_tb.backend.utilization import gpu_busy_pct
from tessera_tb.trace.step import StepData


class ScalarWriter:
    def __init__(self, run_dir: str, worker: str):
        self.worker = worker
        suffix = f".tessera.{worker}"
        self._writer = EventFileWriter(run_dir, filename_suffix=suffix)

    def _add(self, tag: str, value: float, step: int, wall_time: float) -> None:
        summary = summary_pb2.Summary()
        summary.value.append(summary_v2.scalar_pb(tag, float(value)).value[0])
        event = event_pb2.Event(wall_time=wall_time, step=int(step), summary=summary)
        self._writer.add_event(event)

    def write_step(self, step: StepData) -> None:
        wall_time = step.end_ns / 1e9
        self._add(f"tessera/step_time_ms/{self.worker}", step.span_ns / 1e6, step.step, wall_time)
        busy = gpu_busy_pct(step)
        if busy is not None:
            self._add(f"tessera/gpu_busy_pct/{self.worker}", busy, step.step, wall_time)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
