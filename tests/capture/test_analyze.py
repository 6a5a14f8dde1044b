"""`tessera.analyze` returns the backend's own tables, whatever form the trace is given in."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from tessera import analyze
from tessera_tb.backend import collectives, roofline, stalls, topk
from tessera_tb.trace import open_run
from tests.conftest import DEMO_RUNS, SHARED_TRACES

GPT = os.path.join(DEMO_RUNS, "gpt_1gpu")
FSDP = os.path.join(DEMO_RUNS, "fsdp_gpt_4rank")


def test_ops_and_kernels_are_the_backend_tables():
    run = open_run(GPT)
    pd.testing.assert_frame_equal(analyze.ops(trace=GPT, k=7), topk.op_table(run, k=7))
    pd.testing.assert_frame_equal(
        analyze.topk(trace=GPT, what="kernels", k=3), topk.kernel_table(run, k=3)
    )
    with pytest.raises(ValueError, match="'ops' or 'kernels'"):
        analyze.topk(trace=GPT, what="streams")


def test_roofline_names_the_device_chosen_for_a_bare_compute_capability():
    table = analyze.roofline(trace=GPT, arch="sm90")
    pd.testing.assert_frame_equal(table, roofline.roofline(open_run(GPT), arch="sm90"))
    assert table.attrs["device"] == "H100 SXM" and "likeliest" in table.attrs["peaks_note"]
    roofs = table.attrs["roofs"]
    assert (roofs["device"] == "H100 SXM").all()
    assert set(roofs["path"]) >= {"hbm", "fp32", "tf32", "bf16", "fp8"}


def test_stalls_carry_the_collect_command_when_there_are_no_counters():
    measured = analyze.stalls(trace=GPT, group_by="kernel")
    assert measured.attrs["available"] and not measured.empty
    expected = stalls.stall_breakdown(open_run(GPT), group_by="kernel").table
    pd.testing.assert_frame_equal(measured, expected, check_like=True)
    none = analyze.stalls(trace=FSDP)
    assert not none.attrs["available"] and none.empty
    assert "smsp__inst_issued.sum" in none.attrs["collect_command"]


def test_collectives_filter_by_size_and_keep_mismatches_aside():
    big = analyze.collectives(trace=FSDP, min_bytes=64 << 20)
    instances, mismatches = collectives.collective_instances(open_run(FSDP), None, None, 64 << 20)
    pd.testing.assert_frame_equal(big, instances)
    assert (big["size_bytes"] >= 64 << 20).all() and len(big) < len(analyze.collectives(trace=FSDP))
    assert big.attrs["mismatches"].empty


def test_a_kineto_json_gives_the_same_numbers_as_its_imported_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    src = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")
    rank0 = next(os.path.join(src, f) for f in sorted(os.listdir(src)) if f.startswith("rank0"))
    from_json = analyze.breakdown(trace=rank0)
    from_run = analyze.breakdown(trace=os.path.join(DEMO_RUNS, "ddp_gpt_2rank"), workers=["rank0"])
    pd.testing.assert_frame_equal(from_json.reset_index(drop=True), from_run.reset_index(drop=True))
