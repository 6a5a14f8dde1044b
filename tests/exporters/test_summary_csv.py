"""The summary CSV joins the top-k latency table with the roofline's FLOPs and efficiency."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from tessera_tb.backend.topk import op_table
from tessera_tb.exporters.summary_csv import COLUMNS, export_summary_csv, op_summary
from tessera_tb.trace import open_run

from ..conftest import DEMO_RUNS


@pytest.fixture(scope="module")
def run():
    return open_run(os.path.join(DEMO_RUNS, "gpt_1gpu"))


def test_latency_columns_are_the_top_k_tables(run):
    table = op_summary(run)
    ops = op_table(run, by_input_dims=True, k=None)
    ops = ops[~ops["is_other"]].set_index(["name", "input_dims"])
    mine = table.set_index(["name", "input_dims"])
    assert len(mine) == len(ops)
    for col in ("calls", "host_self_ns", "device_self_ns", "device_total_ns"):
        assert (mine[col] == ops.loc[mine.index, col]).all()
    device = mine["device_total_ns"] > 0
    expected = np.where(device, ops.loc[mine.index, "device_total_mean_ns"],
                        ops.loc[mine.index, "host_total_mean_ns"])  # fmt: skip
    assert np.allclose(mine["latency_mean_ns"], expected)


def test_a_gemm_gets_shape_derived_flops_and_its_achieved_rate(run):
    table = op_summary(run)
    mm = table[
        (table["name"] == "aten::mm") & (table["input_dims"] == "[[32000,8192],[8192,1024]]")
    ]
    assert len(mm) == 1
    row = mm.iloc[0]
    # 2*M*N*K per call (METRICS.md), two calls in the two steps.
    assert row["flops"] == 2 * (2 * 32000 * 8192 * 1024)
    assert row["flops_source"] == "derived"
    assert row["flops_per_s"] == pytest.approx(row["flops"] / (row["kernel_ns"] / 1e9))
    assert 0 < row["efficiency_pct"] <= 100


def test_the_csv_has_every_column_and_row(run, tmp_path):
    path = export_summary_csv(run, str(tmp_path / "s.csv"))
    with open(path) as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == COLUMNS
    assert len(rows) == len(op_summary(run))
