"""`tessera.analyze` and `tessera-prof report` on what users have: a directory of per-rank
Kineto traces (as `tensorboard_trace_handler` writes them), and a `profile.chrome` trace."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from tessera import analyze
from tessera_tb.importers.kineto_import import import_traces
from tessera_tb.trace.errors import TraceFormatError
from tests.conftest import ROOT, SHARED_TRACES

DDP_DIR = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")
FSDP_DIR = os.path.join(SHARED_TRACES, "pytorch", "fsdp_gpt_4rank")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private cache for on-the-fly imports (the test imports each directory afresh)."""
    path = str(tmp_path_factory.mktemp("cache"))
    old = os.environ.get("TESSERA_CACHE_DIR")
    os.environ["TESSERA_CACHE_DIR"] = path
    yield path
    if old is None:
        del os.environ["TESSERA_CACHE_DIR"]
    else:
        os.environ["TESSERA_CACHE_DIR"] = old


@pytest.mark.parametrize("trace_dir", [DDP_DIR, FSDP_DIR], ids=["ddp_2rank", "fsdp_4rank"])
def test_a_directory_of_rank_traces_gives_what_importing_it_first_gives(
    trace_dir, cache, tmp_path, capfd
):
    imported = import_traces([trace_dir], str(tmp_path), "imported")
    run = os.path.join(str(tmp_path), "imported")
    assert len(imported.workers) >= 2
    on_dir = analyze.collectives(trace=trace_dir, min_bytes=64 << 20)
    on_run = analyze.collectives(trace=run, min_bytes=64 << 20)
    pd.testing.assert_frame_equal(on_dir, on_run)
    pd.testing.assert_frame_equal(on_dir.attrs["stragglers"], on_run.attrs["stragglers"])
    pd.testing.assert_frame_equal(
        analyze.collectives(trace=trace_dir), analyze.collectives(trace=run)
    )
    pd.testing.assert_frame_equal(analyze.breakdown(trace=trace_dir), analyze.breakdown(trace=run))
    pd.testing.assert_frame_equal(analyze.summary(trace=trace_dir), analyze.summary(trace=run))
    assert not analyze.collectives(trace=trace_dir).empty
    err = capfd.readouterr().err
    assert "tessera: " in err  # the importer's progress, once (then the cache answers)
    analyze.breakdown(trace=trace_dir)
    assert capfd.readouterr().err == ""


def test_report_on_a_trace_directory(cache):
    out = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "report", DDP_DIR, "--section", "collectives"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "workers rank0, rank1" in out.stdout and "all_reduce" in out.stdout


def test_a_directory_without_traces_is_one_line_and_exit_2(tmp_path, cache):
    (tmp_path / "notes.txt").write_text("no traces here")
    cached = sorted(os.listdir(cache))
    with pytest.raises(TraceFormatError, match="holds no .json or .json.gz trace files"):
        analyze.collectives(trace=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "report", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"tessera-prof report: error: {tmp_path}: not a Tessera run (no plugins/tessera "
        "directory) and holds no .json or .json.gz trace files"
    ]
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    assert sorted(os.listdir(cache)) == cached


def test_a_chrome_trace_written_by_profile_chrome(tmp_path, cache, tiny_model):
    from tessera import profile

    path = str(tmp_path / "trace.{rank}.json")
    with profile.session(
        activities=["cpu"],
        exporters=[profile.chrome(path)],
        tensorboard_dir=str(tmp_path / "run"),
    ) as sess:
        for _ in range(6):
            tiny_model()
    chrome = str(tmp_path / "trace.0.json")
    assert os.path.isfile(chrome)
    table = analyze.breakdown(trace=chrome)
    assert sorted(table.step.unique().tolist()) == sess.steps_written == [2, 3, 4]
    ops = analyze.ops(trace=chrome, k=50)
    assert "aten::linear" in set(ops.iloc[:, 0].astype(str)) or "aten::linear" in ops.to_string()
