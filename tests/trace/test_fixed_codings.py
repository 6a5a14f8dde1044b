"""The event and flow columns are stored in a fixed form (writer.EVENT_DELTA, FLOW_DELTA),
not packed both ways: on the real traces that costs almost nothing against packing each
column both ways and keeping the smaller."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from tessera_tb.importers import kineto_decode
from tessera_tb.importers.kineto_columns import StringTable
from tessera_tb.importers.kineto_span import stream_span
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import columns, writer
from tessera_tb.trace.step import ATTR_VALUE_DTYPES, EVENT_COLUMNS, FLOW_COLUMNS
from tests.conftest import SHARED_TRACES

TRACES = [
    "pytorch/gpt_1gpu_stack/worker0.*.pt.trace.json.gz",
    "pytorch/fsdp_gpt_4rank/rank0.*.pt.trace.json.gz",
    "pytorch_2021/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "hta_tests/trace_diff/control/control.json.gz",
]


def _steps(pattern: str):
    (path,) = glob.glob(os.path.join(SHARED_TRACES, pattern))
    trace = kineto_decode.read_trace(path)
    base = int(trace.meta.get("baseTimeNanoseconds") or 0)
    return list(stream_span(trace, StringTable(), 0, base).steps)


def _encoded(steps, monkeypatch, fixed: bool) -> list[pb.Step]:
    with monkeypatch.context() as m:
        if not fixed:  # every integer column packed both ways, the smaller kept
            m.setattr(writer, "EVENT_DELTA", {})
            m.setattr(writer, "FLOW_DELTA", {})
        return [pb.Step.FromString(writer.encode_step(s)) for s in steps]


def _column_bytes(msgs: list[pb.Step]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for msg in msgs:
        for group, names in (("events", EVENT_COLUMNS), ("flows", FLOW_COLUMNS)):
            for name in names:
                col = getattr(getattr(msg, group), name)
                sizes[f"{group}.{name}"] = sizes.get(f"{group}.{name}", 0) + len(col.data)
    return sizes


@pytest.mark.parametrize("pattern", TRACES, ids=lambda p: p.split("/")[-2])
def test_fixed_codings_cost_under_one_percent_of_the_best_choice(pattern, monkeypatch):
    steps = _steps(pattern)
    fixed = _encoded(steps, monkeypatch, fixed=True)
    best = _encoded(steps, monkeypatch, fixed=False)
    fixed_sizes, best_sizes = _column_bytes(fixed), _column_bytes(best)
    assert sum(fixed_sizes.values()) <= 1.01 * sum(best_sizes.values())
    # and no column of any size is more than a tenth larger than its best form
    for name, size in best_sizes.items():
        if size > 2000:
            assert fixed_sizes[name] <= 1.1 * size, name
    # the forms written are the fixed ones
    groups = (("events", writer.EVENT_DELTA), ("flows", writer.FLOW_DELTA))
    for msg in fixed:
        for group, forms in groups:
            for name, delta in forms.items():
                col = getattr(getattr(msg, group), name)
                if col.count > 2:
                    assert col.delta == delta, (group, name)
    # and the columns read back the same either way: the files differ only in the coding
    for a, b in zip(fixed, best):
        for group, names in (("events", EVENT_COLUMNS), ("flows", FLOW_COLUMNS)):
            for name in names:
                np.testing.assert_array_equal(
                    columns.decode(getattr(getattr(a, group), name)),
                    columns.decode(getattr(getattr(b, group), name)),
                )


def test_only_attribute_values_are_left_to_the_encoder(monkeypatch):
    """Packing both ways is what the fixed forms save: of a step's integer columns, only the
    attribute values reach the encoder without a form (the flows' fixed forms are also what
    the encoder would choose on these traces, so the bytes alone cannot tell)."""
    steps = _steps(TRACES[0])
    left: list[int] = []
    job = columns._job

    def counting(values, dtype, delta):
        left.append(delta is None and dtype[0] == "i")
        return job(values, dtype, delta)

    monkeypatch.setattr(columns, "_job", counting)
    for step in steps:
        writer.encode_step(step)  # every column of the step goes through _job once
        integer_attrs = sum(1 for a in step.attrs if ATTR_VALUE_DTYPES[a.type][0] == "i")
        assert sum(left) == integer_attrs
        assert len(left) == 2 * len(step.attrs) + len(EVENT_COLUMNS) + len(FLOW_COLUMNS) * bool(
            step.flows
        )
        left.clear()
