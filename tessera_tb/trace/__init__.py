"""The run layout, the step-file writer and the columnar reader."""

from tessera_tb.trace.errors import SchemaVersionError, TraceFormatError
from tessera_tb.trace.reader import Run, WorkerInfo, open_run
from tessera_tb.trace.step import Attr, CounterSeries, StepData, TrackInfo

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
]
