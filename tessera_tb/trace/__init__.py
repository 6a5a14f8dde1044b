"""The run layout, the step-file writer and the columnar reader."""

from tessera_tb.trace.errors import SchemaVersionError, TraceFormatError
from tessera_tb.trace.reader import Run, WorkerInfo, open_run
from tessera_tb.trace.step import Attr, CounterSeries, StepData, TrackInfo


def records(run, workers=None, steps=None):
    """Portable records of a run (a `Run` or a run directory, bundle or URL): one
    `tessera.profile.records.Record` per kernel, memcpy, memset and collective."""
    from tessera.profile.records import kernel_records

    if not isinstance(run, Run):
        run = open_run(str(run))
    return kernel_records(run, workers=workers, steps=steps)


def records_frame(run, workers=None, steps=None):
    """`records(run)` as a pandas DataFrame (one row per record)."""
    from tessera.profile.records import records_frame as frame

    return frame(records(run, workers=workers, steps=steps))


__all__ = [
    "Attr",
    "CounterSeries",
    "Run",
    "SchemaVersionError",
    "StepData",
    "TrackInfo",
    "TraceFormatError",
    "WorkerInfo",
    "open_run",
    "records",
    "records_frame",
]
