"""Run discovery and caches: new runs and steps show up, broken files stay contained."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tessera_tb.backend.run_index import RunIndex, step_nbytes
from tessera_tb.proto import trace_pb2 as pb
from tests.conftest import DEMO_RUNS


def _copy(run: str, dest) -> str:
    path = os.path.join(str(dest), run)
    shutil.copytree(os.path.join(DEMO_RUNS, run), path)
    return path


def _meta_path(run_dir: str, worker: str) -> str:
    return os.path.join(run_dir, "plugins", "tessera", worker, "meta.pb")


def _drop_last_step_from_index(run_dir: str, worker: str) -> bytes:
    """Rewrite the worker's meta.pb without its last step; returns the original bytes."""
    path = _meta_path(run_dir, worker)
    with open(path, "rb") as f:
        original = f.read()
    meta = pb.WorkerMeta.FromString(original)
    del meta.steps[-1]
    with open(path, "wb") as f:
        f.write(meta.SerializeToString())
    return original


def test_runs_are_found_by_walking_for_the_plugin_directory(tmp_path):
    _copy("gpt_1gpu", tmp_path)
    os.makedirs(tmp_path / "group")
    _copy("ddp_gpt_2rank", tmp_path / "group")
    os.makedirs(tmp_path / "not_a_run" / "plugins" / "scalars")
    index = RunIndex(str(tmp_path), refresh_s=60)
    assert sorted(index.entries()) == ["gpt_1gpu", "group/ddp_gpt_2rank"]
    entry = index.entry("group/ddp_gpt_2rank")
    assert sorted(entry.run.workers) == ["rank0", "rank1"]
    with pytest.raises(KeyError):
        index.entry("group/../gpt_1gpu")


def test_a_step_written_after_discovery_shows_up_on_the_next_request(tmp_path):
    run_dir = _copy("gpt_1gpu", tmp_path)
    original = _drop_last_step_from_index(run_dir, "worker0")
    index = RunIndex(str(tmp_path), refresh_s=60)  # the thread will not rescan in this test
    assert index.entry("gpt_1gpu").run.steps == [4]
    with open(_meta_path(run_dir, "worker0"), "wb") as f:  # the writer lands step 5
        f.write(original)
    os.utime(_meta_path(run_dir, "worker0"), ns=(time.time_ns(), time.time_ns() + 10**9))
    entry = index.entry("gpt_1gpu")
    entry.checked_at = 0.0  # older than the one-second revalidation interval
    assert index.entry("gpt_1gpu").run.steps == [4, 5]


def test_the_background_thread_finds_a_run_created_later(tmp_path):
    index = RunIndex(str(tmp_path), refresh_s=0.05)
    assert index.entries() == {}
    _copy("gpt_1gpu", tmp_path)
    deadline = time.time() + 10
    while "gpt_1gpu" not in index.entries() and time.time() < deadline:
        time.sleep(0.05)
    assert "gpt_1gpu" in index.entries()


def test_a_corrupt_worker_metadata_hides_only_that_worker(tmp_path):
    run_dir = _copy("ddp_gpt_2rank", tmp_path)
    with open(_meta_path(run_dir, "rank1"), "wb") as f:
        f.write(b"\x0a\xff\xff garbage")
    entry = RunIndex(str(tmp_path), refresh_s=60).entry("ddp_gpt_2rank")
    assert sorted(entry.run.workers) == ["rank0"]
    assert "corrupt worker metadata" in entry.worker_errors["rank1"]
    assert entry.error is None


def test_a_run_without_readable_workers_is_listed_with_its_error(tmp_path):
    run_dir = _copy("gpt_1gpu", tmp_path)
    with open(_meta_path(run_dir, "worker0"), "wb") as f:
        f.write(b"junk")
    entry = RunIndex(str(tmp_path), refresh_s=60).entries()["gpt_1gpu"]
    assert entry.run is None
    assert "worker0" in entry.error


def test_a_corrupt_step_file_is_left_out_of_the_selection_with_its_error(tmp_path):
    run_dir = _copy("ddp_gpt_2rank", tmp_path)
    bad = os.path.join(run_dir, "plugins", "tessera", "rank1", "step_00000005.pb")
    with open(bad, "r+b") as f:
        f.truncate(100)
    index = RunIndex(str(tmp_path), refresh_s=60)
    entry = index.entry("ddp_gpt_2rank")
    run, errs = index.usable_run(entry, ["rank0", "rank1"], [4, 5, 6])
    assert list(errs) == [("rank1", 5)]
    assert run.worker("rank1").steps == [4, 6]
    assert run.worker("rank0").steps == [4, 5, 6]
    assert index.known_step_errors(entry) == errs
    assert run.load_step("rank0", 5).num_events > 0


def test_loaded_steps_are_cached_and_the_cache_stays_within_its_bound(tmp_path):
    _copy("fsdp_gpt_4rank", tmp_path)
    index = RunIndex(str(tmp_path), refresh_s=60, step_cache_bytes=3 << 20)
    run = index.entry("fsdp_gpt_4rank").run
    first = run.load_step("rank0", 4)
    assert run.load_step("rank0", 4) is first
    sizes = [step_nbytes(run.load_step(w, s)) for w in run.workers for s in run.steps]
    assert sum(sizes) > 3 << 20  # more than fits
    stats = index.cache_stats()
    assert 0 < stats["step_bytes"] <= 3 << 20
    assert stats["steps"] < len(sizes)
