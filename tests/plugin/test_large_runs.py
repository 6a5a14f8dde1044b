"""The plugin on runs of many ranks: cross-rank views answer from the run's derived index
(no step file read), per-step views and the timeline are capped to a few ranks and say so,
findings name the straggler. A 16-rank run made by bench/synth_ranks.py (rank 11 the
straggler) stands in for a large one: the thresholds are lowered to 8 ranks here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tessera_tb.backend import cross_rank, plugin_data
from tessera_tb.backend.run_index import RunIndex
from tessera_tb.importers.kineto_import import import_traces
from tessera_tb.trace.reader import open_run
from tests.conftest import ROOT

STRAGGLER = 11


@pytest.fixture(scope="module")
def logdir16(tmp_path_factory) -> str:
    traces = tmp_path_factory.mktemp("synth") / "t"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "synth_ranks.py"), "16", str(traces)]
        + ["--stragglers", str(STRAGGLER)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    logdir = tmp_path_factory.mktemp("logdir")
    import_traces([str(traces)], str(logdir), "r", jobs=2)
    return str(logdir)


@pytest.fixture(scope="module")
def indexed16(logdir16) -> str:
    """The same run with its derived index written (as a Dask import leaves it)."""
    cross_rank.ensure_run_summary(open_run(os.path.join(logdir16, "r")), write=True)
    return logdir16


@pytest.fixture
def large(monkeypatch):
    """16 ranks count as a large run."""
    monkeypatch.setattr(plugin_data, "LARGE_RUN_WORKERS", 8)
    monkeypatch.setattr(plugin_data, "OVERVIEW_MAX_WORKERS", 4)
    monkeypatch.setattr(plugin_data, "TIMELINE_MAX_WORKERS", 4)
    monkeypatch.setattr("tessera_tb.backend.run_index.WRITE_SUMMARY_WORKERS", 8)


def _view(index: RunIndex, name: str, **args) -> dict:
    return json.loads(plugin_data.view_json(index, name, {"run": "r", **args}))


def _loaded_workers(index: RunIndex) -> set[str]:
    """Workers whose step files the index has loaded so far."""
    keys = list(index._steps._items)
    return {os.path.basename(os.path.dirname(k[0])) for k in keys}


def test_the_whole_run_collectives_view_from_the_index_equals_the_live_one(logdir16, monkeypatch):
    from_index = _view(RunIndex(logdir16, refresh_s=600), "collectives", metric="wait")
    assert "derived index" in from_index.pop("index")["note"]
    monkeypatch.setattr(plugin_data, "_summary_for", lambda *a, **k: None)
    live = _view(RunIndex(logdir16, refresh_s=600), "collectives", metric="wait")
    assert from_index == live
    strag = from_index["tables"]["stragglers"]
    assert strag["data"][strag["columns"].index("rank")][0] == STRAGGLER


def test_a_subset_of_a_large_run_is_answered_from_the_index_without_reading_step_files(
    logdir16, large
):
    index = RunIndex(logdir16, refresh_s=600)
    index.run_summary(index.entry("r").run)  # built once (reads every step file) and written
    assert os.path.isfile(cross_rank.summary_path(os.path.join(logdir16, "r")))
    fresh = RunIndex(logdir16, refresh_s=600)
    answer = _view(fresh, "collectives", workers="ranks:8-12", steps="5")
    assert _loaded_workers(fresh) == set()  # the written index answered
    rs = answer["tables"]["rank_step"]
    assert sorted(set(rs["data"][rs["columns"].index("rank")])) == [8, 9, 10, 11, 12]
    assert set(rs["data"][rs["columns"].index("step")]) == {5}
    strag = answer["tables"]["stragglers"]
    col = dict(zip(strag["columns"], strag["data"], strict=True))
    # Instances matched over all 16 ranks: rank 11 is last in each of step 5's 16.
    assert col["rank"][0] == STRAGGLER and col["n_straggler"][0] == 16
    assert col["n_instances"][0] == 16
    assert answer["heatmaps"]["rank_step"]["rows"] == [8, 9, 10, 11, 12]


def test_the_overview_of_a_large_run_reads_a_few_ranks_and_names_the_straggler(indexed16, large):
    logdir16 = indexed16
    index = RunIndex(logdir16, refresh_s=600)
    answer = _view(index, "overview")
    capped = answer["capped"]
    assert capped["of"] == 16 and len(capped["shown"]) == 4
    assert f"rank{STRAGGLER}" in capped["shown"] and "4 of the 16" in capped["note"]
    assert _loaded_workers(index) == set(capped["shown"])
    found = answer["tables"]["findings"]
    kinds = found["data"][found["columns"].index("kind")]
    assert kinds.count("collective_straggler") == 1
    at = kinds.index("collective_straggler")
    first = {c: v[at] for c, v in zip(found["columns"], found["data"], strict=True)}
    assert first["worker"] == f"rank{STRAGGLER}"
    # Each other rank waited the straggler's others_wait_ns / 3 steps / 15 ranks per step:
    # the same number the live analysis of all 16 ranks gives.
    summary = cross_rank.read_run_summary(open_run(os.path.join(logdir16, "r")))
    others = summary.tables["stragglers"].set_index("rank").loc[STRAGGLER, "others_wait_ns"]
    assert first["win_ms_per_step"] == pytest.approx(others / 3 / 15 / 1e6)
    assert first["title"] == (
        f"rank{STRAGGLER} arrives last at 100% of collectives: the other ranks wait "
        f"{others / 3 / 15 / 1e6:.2f} ms per step for it"
    )
    from tessera_tb.backend import findings

    live = findings.findings(open_run(os.path.join(logdir16, "r")), steps=[4, 5, 6])
    live = live[live["kind"] == "collective_straggler"].iloc[0]
    assert live["worker"] == first["worker"] and live["title"] == first["title"]
    assert live["win_ms_per_step"] == pytest.approx(first["win_ms_per_step"])

    rank_step = answer["tables"]["rank_step"]
    assert rank_step["total_rows"] == 16 * 3
    steps = answer["tables"]["step_times"]
    assert steps["total_rows"] == 16  # the distribution covers every selected rank


def test_the_timeline_of_a_large_selection_draws_the_first_ranks_and_says_so(logdir16, large):
    index = RunIndex(logdir16, refresh_s=600)
    answer = _view(index, "timeline", steps="5")
    assert answer["shown_workers"] == ["rank0", "rank1", "rank2", "rank3"]
    assert "first 4 of the 16 selected ranks" in answer["workers_note"]
    assert _loaded_workers(index) == {"rank0"}  # one request, one rank's step file


def test_the_derived_index_is_rebuilt_when_a_step_index_changes(logdir16, large, tmp_path):
    import shutil

    from tessera_tb.trace import layout
    from tessera_tb.trace.reader import read_meta

    run_dir = str(tmp_path / "r")
    shutil.copytree(os.path.join(logdir16, "r"), run_dir)
    built = cross_rank.ensure_run_summary(open_run(run_dir))
    assert cross_rank.read_run_summary(open_run(run_dir)).key == built.key
    meta_path = os.path.join(layout.worker_dir(run_dir, "rank3"), layout.META_FILE)
    meta = read_meta(meta_path)
    meta.steps[0].end_ns += 1_000_000  # a step file of rank3 was rewritten
    with open(meta_path, "wb") as f:
        f.write(meta.SerializeToString(deterministic=True))
    assert cross_rank.read_run_summary(open_run(run_dir)) is None  # stale: not used
    rebuilt = cross_rank.ensure_run_summary(open_run(run_dir))
    assert rebuilt.key != built.key
    rs = rebuilt.tables["rank_step"]
    row = rs[(rs["worker"] == "rank3") & (rs["step"] == meta.steps[0].step)].iloc[0]
    assert row["step_time_ns"] == meta.steps[0].end_ns - meta.steps[0].start_ns
    assert cross_rank.read_run_summary(open_run(run_dir)).key == rebuilt.key


def test_the_listing_gives_large_process_groups_as_rank_ranges(logdir16, monkeypatch):
    monkeypatch.setattr(plugin_data, "LISTED_GROUP_RANKS", 8)
    listing = plugin_data.runs_listing(RunIndex(logdir16, refresh_s=600))
    pg = listing["runs"][0]["workers"][0]["process_groups"][0]
    assert pg["ranks"] is None and pg["ranks_text"] == "0-15" and pg["size"] == 16
