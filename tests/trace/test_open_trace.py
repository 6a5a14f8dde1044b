from __future__ import annotations

import os
import shutil

import pytest

from tessera_tb.trace import TraceFormatError
from tessera_tb.trace.open_trace import open_trace
from tests.conftest import DEMO_RUNS, SHARED_TRACES

GPT_DIR = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
GPT_FILE = next(os.path.join(GPT_DIR, f) for f in os.listdir(GPT_DIR) if f.endswith(".json.gz"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_run_directory_opens_as_is(cache):
    run = open_trace(os.path.join(DEMO_RUNS, "gpt_1gpu"))
    assert run.steps == [4, 5]
    assert not cache.exists()


def test_a_kineto_json_is_imported_once_and_cached(cache, tmp_path):
    local = tmp_path / os.path.basename(GPT_FILE)
    shutil.copy(GPT_FILE, local)
    first = open_trace(local)
    assert first.steps == [4, 5]
    (cached,) = os.listdir(cache)
    mtime = os.stat(os.path.join(cache, cached)).st_mtime_ns
    second = open_trace(str(local))
    assert second.path == first.path
    assert os.stat(os.path.join(cache, cached)).st_mtime_ns == mtime
    os.utime(local, ns=(1, 1))  # a changed file is imported again
    assert open_trace(local).path != first.path


def test_bad_inputs_name_the_file(cache, tmp_path):
    with pytest.raises(TraceFormatError, match="no such file"):
        open_trace(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(TraceFormatError) as err:
        open_trace(bad)
    assert str(bad) in str(err.value) and "traceEvents" in str(err.value)
    # A directory of traces is imported: its bad trace is named.
    with pytest.raises(TraceFormatError, match="traceEvents"):
        open_trace(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceFormatError, match="not a Tessera run .* holds no .json"):
        open_trace(tmp_path / "empty")


def test_a_bundle_opens_as_the_run_it_holds(cache, tmp_path):
    from tessera_tb.trace.bundle import pack_run

    bundle = tmp_path / "gpt.tessera.zip"
    pack_run(os.path.join(DEMO_RUNS, "gpt_1gpu"), str(bundle))
    run = open_trace(bundle)
    assert run.steps == [4, 5] and sorted(run.workers) == ["worker0"]
    assert run.load_step("worker0", 5).num_events == (
        open_trace(os.path.join(DEMO_RUNS, "gpt_1gpu")).load_step("worker0", 5).num_events
    )
