"""At the end of a session the exporters write their files, and report() gives the op table."""

from __future__ import annotations

import csv
import json

import pytest

from tessera import profile
from tessera_tb.backend.topk import op_table
from tessera_tb.trace import open_run

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model):
    out = tmp_path_factory.mktemp("exports")
    with profile.session(
        activities=["cpu", "gpu"],
        record_shapes=True,
        schedule=profile.schedule(wait=0, warmup=1, active=2, repeat=1),
        exporters=[
            profile.chrome(str(out / "trace.{rank}.json")),
            profile.summary(str(out / "summary.{worker}.csv")),
        ],
        tensorboard_dir=str(out / "run"),
    ) as sess:
        for i in range(4):
            with profile.region("train"):
                tiny_model()
            sess.mark("after-train")
            profile.counter(name="loss", value=float(i), unit="scalar")
            sess.step()
    return sess, out


def test_exporter_paths_expand_rank_and_worker(finished):
    _, out = finished
    assert (out / "trace.0.json").is_file()
    assert (out / "summary.worker0.csv").is_file()


def test_the_chrome_export_holds_regions_marks_ops_and_counters(finished):
    _, out = finished
    events = json.loads((out / "trace.0.json").read_text())["traceEvents"]
    regions = [e for e in events if e["ph"] == "X" and e["cat"] == "region"]
    assert [e["name"] for e in regions] == ["train", "train"]
    marks = [e for e in events if e["ph"] == "i" and e["name"] == "after-train"]
    assert len(marks) == 2
    assert any(e["ph"] == "X" and e["cat"] == "cpu_op" for e in events)
    loss = [e["args"]["loss"] for e in events if e["ph"] == "C" and e["name"] == "loss (scalar)"]
    assert loss == [1.0, 2.0]
    steps = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert steps == ["Step 1", "Step 2"]


def test_the_summary_csv_is_the_top_k_op_table(finished):
    sess, out = finished
    with open(out / "summary.worker0.csv") as f:
        rows = list(csv.DictReader(f))
    ops = op_table(open_run(sess.run_dir), by_input_dims=True, k=None)
    ops = ops[~ops["is_other"]]
    assert len(rows) == len(ops)
    ours = {(r["name"], r["input_dims"]): int(r["host_self_ns"]) for r in rows}
    theirs = dict(zip(zip(ops["name"], ops["input_dims"]), ops["host_self_ns"].tolist()))
    assert ours == theirs
    assert {r["latency_source"] for r in rows} == {"host"}
    assert all(r["flops"] == "" and r["note"].startswith("no device work") for r in rows)


def test_report_prints_and_returns_the_op_table(finished, capsys):
    sess, _ = finished
    table = sess.report()
    printed = capsys.readouterr().out
    assert "latency_us" in printed and "aten::" in printed
    assert {"latency_mean_ns", "flops", "dram_bytes_per_s", "efficiency_pct"} <= set(table)
    assert table["flops"].isna().all()


def test_records_of_a_cpu_run_are_empty(finished):
    sess, _ = finished
    assert list(sess.records()) == []
