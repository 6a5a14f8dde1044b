"""Bad input gives a one-line error naming the file and the problem, exit status 2, and
leaves no half-written run behind; an existing run stays intact."""

from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest

from tests.conftest import SHARED_TRACES, assert_same_files, file_contents, tessera_prof

GOOD = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
GOOD_FILE = next(os.path.join(GOOD, f) for f in os.listdir(GOOD) if f.endswith(".json.gz"))


def _cli(*args: str):
    return tessera_prof("import", *args)


def _good_events() -> dict:
    with gzip.open(GOOD_FILE, "rt") as f:
        return json.load(f)


def _truncated_gzip(path):
    with open(GOOD_FILE, "rb") as f:
        data = f.read()
    path.write_bytes(data[: len(data) // 2])


def _not_json(path):
    path.write_bytes(gzip.compress(b"this is not JSON {"))


def _no_trace_events(path):
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": []}))


def _event_missing_ts(path):
    trace = _good_events()
    x = next(e for e in trace["traceEvents"] if e.get("ph") == "X")
    del x["ts"]
    path.write_text(json.dumps(trace))


def _event_missing_dur(path):
    trace = _good_events()
    x = next(e for e in trace["traceEvents"] if e.get("ph") == "X")
    del x["dur"]
    path.write_text(json.dumps(trace))


def _newer_kineto_schema(path):
    trace = _good_events()
    trace["schemaVersion"] = 2
    path.write_text(json.dumps(trace))


def _events_not_a_list(path):
    path.write_text(json.dumps({"traceEvents": {"ph": "X"}}))


def _name_not_utf8(path):
    text = json.dumps(_good_events()).replace('"ProfilerStep#', '"\\u00e9ProfilerStep#', 1)
    path.write_bytes(text.encode().replace(b"\\u00e9", b"\xff", 1))


def _number_out_of_range(path):
    trace = _good_events()
    x = next(e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("args"))
    x["args"]["huge"] = "HUGE"
    path.write_text(json.dumps(trace).replace('"HUGE"', "1e400"))


def _event_not_an_object(path):
    trace = _good_events()
    trace["traceEvents"].insert(5, 42)
    path.write_text(json.dumps(trace))


CASES = {
    "truncated_gzip": (_truncated_gzip, "truncated gzip", ".json.gz"),
    "not_json": (_not_json, "not valid JSON", ".json.gz"),
    "no_trace_events": (_no_trace_events, "no 'traceEvents'", ".json"),
    "event_missing_ts": (_event_missing_ts, "has no numeric 'ts'", ".json"),
    "event_missing_dur": (_event_missing_dur, "has no numeric 'dur'", ".json"),
    "newer_kineto_schema": (_newer_kineto_schema, "schemaVersion 2", ".json"),
    "events_not_a_list": (_events_not_a_list, "not a list of events", ".json"),
    "name_not_utf8": (_name_not_utf8, "not valid UTF-8", ".json"),
    "number_out_of_range": (_number_out_of_range, "Number out of range", ".json"),
    "event_not_an_object": (_event_not_an_object, "traceEvents[5]", ".json"),
}


@pytest.mark.parametrize("memory", ["whole", "bounded"])
@pytest.mark.parametrize("reader", ["scanner", "pure_python"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_file_is_one_line_error_with_exit_2_and_no_run_left(case, reader, memory, tmp_path):
    """Both event readers: the C scanner declines what it does not read and the pure-Python
    path names the problem; with TESSERA_PURE_PYTHON=1 that path reads everything. The same
    errors whether the file is read whole or in bounded memory (kineto_stream)."""
    make, problem, suffix = CASES[case]
    bad = tmp_path / f"worker0.1.pt.trace{suffix}"
    make(bad)
    logdir = tmp_path / "logdir"
    env = {
        "TESSERA_PURE_PYTHON": "1" if reader == "pure_python" else "0",
        "TESSERA_IMPORT_STREAM": "always" if memory == "bounded" else "never",
    }
    proc = tessera_prof("import", str(bad), "--logdir", str(logdir), "--run", "r", "-q", env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(bad) in lines[0] and problem in lines[0]
    assert "Traceback" not in proc.stderr
    assert os.listdir(logdir) == []  # no run, no hidden temporary directory


@pytest.mark.parametrize("case", ["truncated_gzip", "event_missing_ts"])
def test_failed_overwrite_leaves_the_existing_run_intact(case, tmp_path):
    logdir = tmp_path / "logdir"
    ok = _cli(GOOD, "--logdir", str(logdir), "--run", "r", "-q")
    assert ok.returncode == 0, ok.stderr
    before = file_contents(logdir / "r")
    # A directory with one good file and one bad file of another worker: the bad one is
    # read after the good one was already converted.
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(GOOD_FILE, mixed / "a_worker.1.pt.trace.json.gz")
    make, problem, suffix = CASES[case]
    make(mixed / f"z_worker.1.pt.trace{suffix}")
    proc = _cli(str(mixed), "--logdir", str(logdir), "--run", "r", "--overwrite", "-q")
    assert proc.returncode == 2
    assert problem in proc.stderr
    assert_same_files(file_contents(logdir / "r"), before)
    assert sorted(os.listdir(logdir)) == ["r"]


def test_existing_run_is_not_replaced_without_overwrite(tmp_path):
    logdir = tmp_path / "logdir"
    assert _cli(GOOD, "--logdir", str(logdir), "--run", "r", "-q").returncode == 0
    proc = _cli(GOOD, "--logdir", str(logdir), "--run", "r", "-q")
    assert proc.returncode == 2
    assert "already exists" in proc.stderr and "--overwrite" in proc.stderr


@pytest.mark.parametrize("run", ["../escape", "/abs", "a/../b", ".hidden", ""])
def test_hostile_run_names_are_refused(run, tmp_path):
    proc = _cli(GOOD, "--logdir", str(tmp_path / "logdir"), "--run", run, "-q")
    assert proc.returncode == 2
    assert "invalid run name" in proc.stderr
    assert not (tmp_path / "escape").exists()


def test_missing_path_is_a_clear_error(tmp_path):
    proc = _cli(str(tmp_path / "nope.json"), "--logdir", str(tmp_path / "l"), "-q")
    assert proc.returncode == 2
    assert "no such file or directory" in proc.stderr


def test_an_imported_run_has_the_permissions_of_a_plain_directory(tmp_path):
    """The run is built in a hidden staging directory and renamed into place: it must not
    keep an owner-only mode that would hide it from a TensorBoard run by another user."""
    logdir = tmp_path / "logdir"
    assert _cli(GOOD, "--logdir", str(logdir), "--run", "r", "-q").returncode == 0
    umask = os.umask(0)
    os.umask(umask)
    assert (logdir / "r").stat().st_mode & 0o777 == 0o777 & ~umask
    assert os.listdir(logdir) == ["r"]
