"""Records are objects with the portable schema's names (`rec.kernel_name`, `rec.start_us`,
`rec.capability`), checked against the source Kineto events; `to_dict()` and a DataFrame."""

from __future__ import annotations

import os

import pytest

from tessera.profile.records import EXTRA_FIELDS, GUIDE_FIELDS, Record
from tessera_tb import trace as tt

from ..conftest import DEMO_RUNS
from .test_records import _by_start, _source


@pytest.fixture(scope="module")
def ddp():
    run_dir = os.path.join(DEMO_RUNS, "ddp_gpt_2rank")
    records = list(tt.records(run_dir, workers=["rank0"]))
    trace, _ = _source("ddp_gpt_2rank", "rank0")
    return run_dir, records, trace


def test_attribute_access_with_the_guides_names_matches_the_trace(ddp):
    _, records, trace = ddp
    src = _by_start(trace, ("kernel",))
    kernels = [r for r in records if r.kind == "kernel"]
    assert len(kernels) > 100
    for rec in kernels:
        assert isinstance(rec, Record)
        e = src[rec.start_ns]
        assert rec.kernel_name == e["name"]
        assert rec.stream_id == int(e["args"]["stream"])
        # Epoch µs as a float: exact to 0.25 µs today (start_ns is exact).
        base_ns = int(trace["baseTimeNanoseconds"])
        start_ns = base_ns + int(e["ts"] * 1000)
        assert rec.start_us == pytest.approx(start_ns / 1e3, abs=0.25)
        assert rec.end_us == pytest.approx((start_ns + int(e["dur"] * 1000)) / 1e3, abs=0.25)
        assert rec.end_us - rec.start_us == pytest.approx(float(e["dur"]), abs=0.5)
        # No Nsight Compute counters in this run: None with the reason, never 0.
        assert rec.tc_util_pct is None and rec.capability["tc_util_pct"] == "unavailable:no-ncu"
        assert rec.sm_occupancy == float(e["args"]["est. achieved occupancy %"])
        assert rec.memcpy_dir is None and rec.capability["memcpy_dir"].startswith("n/a:")
        assert (rec.step, rec.rank, rec.worker) == (rec["step"], 0, "rank0")
        assert rec.grid == list(e["args"]["grid"]) and rec.registers is not None


def test_every_field_is_an_attribute_and_null_fields_say_why(ddp):
    _, records, _ = ddp
    for rec in records:
        d = rec.to_dict()
        assert list(d) == [*GUIDE_FIELDS, *EXTRA_FIELDS, "capability"]
        for f in GUIDE_FIELDS:
            assert getattr(rec, f) == d[f]
            if d[f] is None:
                assert d["capability"][f]  # a reason for every null
        assert rec["name"] == rec.kernel_name  # the trace's keys still work
    colls = [r for r in records if r.kind == "collective"]
    assert colls
    assert all(r.collective_type == "all_reduce" and r.collective_bytes > 0 for r in colls)
    with pytest.raises(AttributeError):
        records[0].no_such_field  # noqa: B018
    with pytest.raises(AttributeError):
        records[0].kind = "x"


def test_records_frame_is_one_row_per_record(ddp):
    run_dir, records, _ = ddp
    frame = tt.records_frame(run_dir, workers=["rank0"])
    assert len(frame) == len(records)
    assert list(frame.columns) == [*GUIDE_FIELDS, *EXTRA_FIELDS, "capability"]
    kernels = frame[frame.kind == "kernel"]
    assert kernels.tc_util_pct.isna().all()
    assert kernels.kernel_name.tolist() == [r.kernel_name for r in records if r.kind == "kernel"]
