"""What `tessera-prof counters` attached on an H100 (tests/data/counters_run): every distinct
kernel of the profiled step has counters of its own, every kernel record says where its
counters come from, and the views built on them hold together."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tessera import analyze
from tessera.profile.records import kernel_records
from tessera_tb.importers.ncu_selection import kernel_counter_coverage
from tessera_tb.trace import open_run
from tessera_tb.trace.bundle import unpack_bundle
from tests.conftest import ROOT

DATA = os.path.join(ROOT, "tests", "data", "counters_run")


@pytest.fixture(scope="module", params=["gpt2", "resnet50"])
def model_run(request, tmp_path_factory) -> tuple[str, str]:
    run_dir = str(tmp_path_factory.mktemp("counters") / request.param)
    unpack_bundle(os.path.join(DATA, f"{request.param}.tessera.zip"), run_dir)
    return request.param, run_dir


def test_every_distinct_kernel_of_the_step_has_its_own_counters(model_run):
    model, run_dir = model_run
    wanted, missing = kernel_counter_coverage(run_dir, "worker0")
    if model == "gpt2":
        assert len(wanted) == 83 and missing == set()
    else:  # one cuDNN CUTLASS kernel whose name the trace keeps mangled (README.md)
        assert len(wanted) == 185
        assert len(missing) == 1 and next(iter(missing)).startswith("_ZN17cutlass__5x_cudnn6Kernel")


def test_kernel_records_say_whether_their_counters_are_their_own(model_run):
    model, run_dir = model_run
    records = [r for r in kernel_records(open_run(run_dir)) if r.kind == "kernel"]
    tags = [r.capability.get("sm_occupancy", "") for r in records]
    own = sum(t == "measured" for t in tags)
    same = sum(t == "measured:same-kernel-instance" for t in tags)
    assert own > 0 and same > own
    if model == "gpt2":  # every kernel of every recorded step carries counters
        assert own + same == len(records)
        assert all(r.sm_occupancy is not None for r in records)


def test_stall_shares_of_each_kernel_sum_to_100_pct(model_run):
    _, run_dir = model_run
    stalls = analyze.stalls(trace=run_dir, group_by="kernel")
    assert stalls.attrs.get("available")
    sums = stalls[stalls.category != "not a stall"].groupby("kernel_name").share_pct.sum()
    assert sums.size > 40
    assert np.allclose(sums.to_numpy(), 100.0, atol=1e-6)


def test_divergence_and_measured_roofline_points_appear(model_run):
    _, run_dir = model_run
    assert len(analyze.divergence(trace=run_dir, threshold=0.0)) > 0
    roof = analyze.roofline(trace=run_dir)
    assert roof.flops_source.isin(["measured", "partial"]).sum() > 40
