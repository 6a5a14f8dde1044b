"""Large traces are read in bounded memory (kineto_stream): scanned in batches spilled to a
scratch directory, steps decided on whole-file tables, built a run of steps at a time. The
run equals the whole-file import's byte for byte, on every shared trace, whatever the batch
and part sizes; a step larger than memory allows fails with a message naming it; damage
in the middle of the file leaves nothing behind (no run, no scratch directory)."""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import threading

import pytest

from tessera_tb.importers import kineto_decode, kineto_import, kineto_stream
from tessera_tb.importers.kineto_span import StringTable, stream_span
from tessera_tb.trace.writer import step_to_proto
from tests.conftest import (
    SHARED_TRACES,
    assert_same_files,
    file_contents,
    live_threads,
    needs_scanner,
    shared_trace_files,
    trace_id,
)
from tests.importers.test_streaming_import import _big_gzip

pytestmark = needs_scanner()

DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")
FSDP = os.path.join(SHARED_TRACES, "pytorch", "fsdp_gpt_4rank")
GPT = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")


def _whole(path: str) -> list[tuple[int, bytes]]:
    trace = kineto_decode.read_trace(path)
    base = int(trace.meta.get("baseTimeNanoseconds") or 0)
    span = stream_span(trace, StringTable(), 0, base)
    return [(s.step, step_to_proto(s).SerializeToString()) for s in span.steps]


def _bounded(path: str, scratch, **sizes) -> tuple[list[tuple[int, bytes]], object]:
    os.makedirs(scratch, exist_ok=True)
    f = kineto_stream.StreamedFile(path, StringTable(), 0, str(scratch), **sizes)
    steps = [(s.step, step_to_proto(s).SerializeToString()) for s in f.steps()]
    return steps, f


@pytest.mark.parametrize("path", shared_trace_files(), ids=trace_id)
def test_every_step_equals_the_whole_file_import_byte_for_byte(path, tmp_path):
    want = _whole(path)
    # One step per part, batches of 2,000 events: every boundary the reader has is crossed.
    got, f = _bounded(path, tmp_path, part_events=1, batch_events=2000)
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [b for _, b in got] == [b for _, b in want]
    assert f.parts == [(i, i + 1) for i in range(len(want))]
    assert f.warnings == []
    # One part for the whole file.
    got, f = _bounded(path, tmp_path, part_events=10**9, batch_events=10**9)
    assert got == want and len(f.parts) == 1
    assert os.listdir(tmp_path) == []  # the scratch directories are gone


@pytest.mark.parametrize("path", shared_trace_files(), ids=trace_id)
def test_without_the_scanner_the_steps_are_the_scanners_byte_for_byte(path, tmp_path, monkeypatch):
    want = _whole(path)  # the C scanner's whole-file import
    monkeypatch.setenv("TESSERA_PURE_PYTHON", "1")
    assert not kineto_decode.scanner_available()
    got, f = _bounded(path, tmp_path, part_events=1, batch_events=2000)
    assert got == want
    with gzip.open(path) as fh:  # every entry of traceEvents went through the reader
        assert f.pure_reader.events == len(json.load(fh)["traceEvents"]) > 0


def test_the_pure_reader_holds_one_piece_of_text_and_cuts_only_between_events(
    tmp_path, monkeypatch
):
    # Events whose strings hold what separates two events ("},{"), read in pieces of 64 KB:
    # a cut inside a string does not read, and the reader cuts at a later event instead.
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "op},{" + str(i % 7), "pid": 1, "tid": 1,
         "ts": 1000.0 + i, "dur": 0.5, "args": {"note": "a}, {b" * (i % 3), "External id": i}}
        for i in range(40000)
    ]  # fmt: skip
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1,
                   "tid": 1, "ts": 999.0, "dur": 50000.0})  # fmt: skip
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "t"}))
    want = _whole(str(path))
    monkeypatch.setenv("TESSERA_PURE_PYTHON", "1")
    monkeypatch.setattr(kineto_decode, "TEXT_CHUNK", 64 << 10)
    got, f = _bounded(str(path), tmp_path / "scratch", batch_events=5000)
    assert got == want and len(got) == 1
    assert f.meta == {"schemaVersion": 1, "traceName": "t"}
    # The first read of a plain file is 1 MB (kineto_decode.READ_CHUNK), then 64 KB pieces.
    held = kineto_decode.READ_CHUNK + 4 * (64 << 10)
    assert f.pure_reader.max_text < held < os.path.getsize(path) / 4


# Two files of one worker (successive spans, one string table): the 2021 ResNet-50 traces.
RESNET_2021 = os.path.join(SHARED_TRACES, "pytorch_2021", "resnet50_num_workers_0")


@pytest.mark.parametrize("traces", [DDP, FSDP, GPT, RESNET_2021], ids=os.path.basename)
def test_an_import_read_in_bounded_memory_writes_the_same_run(traces, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_IMPORT_STREAM", "never")
    whole = kineto_import.import_traces([traces], str(tmp_path / "a"), "r")
    monkeypatch.setenv("TESSERA_IMPORT_STREAM", "always")
    monkeypatch.setattr(kineto_stream, "PROGRESS_BYTES", 1 << 20)
    monkeypatch.setattr(kineto_stream, "BATCH_EVENTS", 2000)
    monkeypatch.setattr(kineto_decode, "TEXT_CHUNK", 256 << 10)
    monkeypatch.setattr(kineto_import, "PROGRESS_SECONDS", 0.0)
    lines: list[str] = []
    bounded = kineto_import.import_traces([traces], str(tmp_path / "b"), "r", progress=lines.append)
    assert any("read in bounded memory" in line for line in lines)
    assert any(line.endswith("events spilled; grouping them by step") for line in lines)
    # While steps are written, a line at most every PROGRESS_SECONDS (here: after each).
    per_file: dict[str, list[tuple[int, int]]] = {}
    for line in lines:
        m = re.search(r"(\S+\.json(?:\.gz)?): ([\d,]+) of ([\d,]+) steps written \(", line)
        if m:
            done, count = (int(g.replace(",", "")) for g in m.group(2, 3))
            per_file.setdefault(m.group(1), []).append((done, count))
    assert len(per_file) == sum(len(w.files) for w in bounded.workers)
    for seen in per_file.values():
        count = seen[0][1]
        assert seen == [(k, count) for k in range(1, count + 1)]
    # A line per MB of JSON read (per GB by default), naming the worker and file.
    read = [line for line in lines if " MB of JSON read, " in line and "events spilled" in line]
    assert len(read) >= int(bounded.json_bytes / (1 << 20)) - len(bounded.workers)
    spilled = [int(line.split(", ")[-1].split()[0].replace(",", "")) for line in read]
    assert max(spilled) > 2000
    # NVML counters, capabilities, the index and scalars too; event files differ only in
    # their first record (the time they were opened).
    a, b = file_contents(whole.run_dir), file_contents(bounded.run_dir)
    a, b = ({k: v for k, v in d.items() if "tfevents" not in k} for d in (a, b))
    assert_same_files(b, a)
    assert [w.steps for w in bounded.workers] == [w.steps for w in whole.workers]
    assert bounded.events == whole.events and bounded.json_bytes == whole.json_bytes
    assert sorted(os.listdir(tmp_path / "b")) == ["r"]  # no scratch directory left


def test_the_size_estimate_reads_the_gzip_trailer(tmp_path):
    text = b'{"traceEvents": []}' * 1000
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(text))
    plain = tmp_path / "t.json"
    plain.write_bytes(text)
    assert kineto_stream.text_bytes_estimate(str(gz)) == len(text)
    assert kineto_stream.text_bytes_estimate(str(plain)) == len(text)
    # A small file whose gzip is larger than its text is not taken for one past 4 GiB.
    tiny = tmp_path / "tiny.json.gz"
    tiny.write_bytes(gzip.compress(b"[]"))
    assert kineto_stream.text_bytes_estimate(str(tiny)) == 2


def test_auto_reads_large_files_or_files_too_large_for_free_memory_bounded(tmp_path, monkeypatch):
    path = os.path.join(GPT, sorted(f for f in os.listdir(GPT) if f.endswith(".gz"))[0])
    monkeypatch.delenv("TESSERA_IMPORT_STREAM", raising=False)
    assert not kineto_stream.should_stream(path)  # 3.6 MB of JSON
    monkeypatch.setattr(kineto_stream, "STREAM_ABOVE_BYTES", 1 << 20)
    assert kineto_stream.should_stream(path)
    monkeypatch.setattr(kineto_stream, "STREAM_ABOVE_BYTES", 1 << 30)
    monkeypatch.setattr(kineto_stream, "available_memory_bytes", lambda: 4 << 20)
    assert kineto_stream.should_stream(path)  # 3.6 MB x 1.5 does not fit in 4 MB
    monkeypatch.setenv("TESSERA_IMPORT_STREAM", "never")
    assert not kineto_stream.should_stream(path)


def test_a_step_larger_than_memory_allows_fails_naming_it(tmp_path):
    path = os.path.join(GPT, sorted(f for f in os.listdir(GPT) if f.endswith(".gz"))[0])
    fits = kineto_stream.StreamedFile(path, StringTable(), 0, str(tmp_path))
    fits.close()
    counts = dict(zip(fits._plan.numbers.tolist(), fits.step_events.tolist()))
    biggest = max(counts, key=counts.get)
    # Every slice and flow point of the file counts in one step (counted here from the JSON).
    with gzip.open(path) as fh:
        events = json.load(fh)["traceEvents"]
    assert sum(counts.values()) == sum(e["ph"] in ("X", "i", "I", "s", "t", "f") for e in events)
    need = counts[biggest] * kineto_stream.STEP_BYTES_PER_EVENT
    with pytest.raises(kineto_stream.StepTooLarge) as err:
        kineto_stream.StreamedFile(path, StringTable(), 0, str(tmp_path), memory_bytes=need - 1)
    message = str(err.value)
    assert message.startswith(f"{path}: step {biggest} holds {counts[biggest]:,} events")
    assert "MB are free" in message and "\n" not in message
    # Exactly enough memory: it is read.
    kineto_stream.StreamedFile(path, StringTable(), 0, str(tmp_path), memory_bytes=need).close()
    assert os.listdir(tmp_path) == []


def test_a_too_large_step_fails_the_import_and_leaves_the_old_run(tmp_path, monkeypatch):
    logdir = tmp_path / "logdir"
    kineto_import.import_traces([DDP], str(logdir), "r")
    before = file_contents(logdir / "r")
    monkeypatch.setenv("TESSERA_IMPORT_STREAM", "always")
    monkeypatch.setattr(kineto_stream, "available_memory_bytes", lambda: 1 << 20)
    with pytest.raises(kineto_import.ImportFailed) as err:
        kineto_import.import_traces([GPT], str(logdir), "r", overwrite=True)
    assert "holds" in str(err.value) and "MB are free" in str(err.value)
    assert_same_files(file_contents(logdir / "r"), before)
    assert sorted(os.listdir(logdir)) == ["r"]


@pytest.mark.parametrize("reader", ["scanner", "pure"])
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damage_in_the_middle_leaves_no_run_and_no_scratch(damage, reader, tmp_path, monkeypatch):
    if reader == "pure":
        monkeypatch.setenv("TESSERA_PURE_PYTHON", "1")
    text, packed = _big_gzip(8)
    if damage == "truncated":
        packed = packed[: len(packed) * 2 // 3]
    else:
        at = len(packed) * 2 // 3
        packed = packed[:at] + bytes(b ^ 0x5A for b in packed[at : at + 64]) + packed[at + 64 :]
    traces = tmp_path / "traces"
    traces.mkdir()
    bad = traces / "rank0.1.pt.trace.json.gz"
    bad.write_bytes(packed)
    logdir = tmp_path / "logdir"
    kineto_import.import_traces([DDP], str(logdir), "run")
    before = file_contents(logdir / "run")
    monkeypatch.setenv("TESSERA_IMPORT_STREAM", "always")
    monkeypatch.setattr(kineto_stream, "BATCH_EVENTS", 5000)
    batches = []
    real_add = kineto_stream._FirstPass.add

    def counting(self, batch):
        batches.append(int(batch["n"]))
        return real_add(self, batch)

    monkeypatch.setattr(kineto_stream._FirstPass, "add", counting)
    with pytest.raises(kineto_import.ImportFailed) as err:
        kineto_import.import_traces([str(bad)], str(logdir), "run", overwrite=True)
    message = str(err.value)
    assert str(bad) in message and "\n" not in message
    assert ("truncated gzip" in message) if damage == "truncated" else ("corrupt gzip" in message)
    assert sum(batches) > 8 * 5000  # batches were spilled before the damage was met
    assert_same_files(file_contents(logdir / "run"), before)
    assert sorted(os.listdir(logdir)) == ["run"]  # no staging, no scratch directory
    assert not [t for t in threading.enumerate() if t.name == "tessera-gunzip"]


def test_a_full_disk_while_spilling_fails_in_one_line_leaving_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_IMPORT_STREAM", "always")
    monkeypatch.setattr(kineto_stream, "BATCH_EVENTS", 3000)
    real_spill = kineto_stream._spill
    spilled = []

    def spill(path, arrays):
        spilled.append(path)
        if len(spilled) == 3:  # a batch of the first pass: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_spill(path, arrays)

    monkeypatch.setattr(kineto_stream, "_spill", spill)
    logdir = tmp_path / "runs"
    before = live_threads()
    with pytest.raises(kineto_import.ImportFailed) as err:
        kineto_import.import_traces([GPT], str(logdir), "r")
    assert str(err.value) == f"{spilled[2]}: No space left on device"
    assert os.listdir(logdir) == []  # no run, no staging, no scratch directory
    assert live_threads() <= before  # the reading and scratch threads ended


def test_scratch_files_are_removed_once_read_for_the_last_time(tmp_path):
    """A batch's file goes once it is regrouped by part, a part's files once the part is
    built: the scratch directory holds the file's columns about once, not twice."""
    path = os.path.join(FSDP, sorted(f for f in os.listdir(FSDP) if f.endswith(".gz"))[0])
    f = kineto_stream.StreamedFile(path, StringTable(), 0, str(tmp_path), part_events=1)
    f._deleter.finish()  # (removals run in a thread: wait for those asked for so far)
    names = os.listdir(f.spill_dir)
    assert names and all(n.startswith("part_") for n in names)  # no batch file left
    assert len(f.parts) >= 3
    first_of_part = {lo: p for p, (lo, _) in enumerate(f.parts)}
    for k, _ in enumerate(f.steps()):
        p = first_of_part.get(k)
        if p is not None and p >= 1:  # part p handed out; part p + 1 may be building
            f._deleter.finish()
            left = {int(n.split("_")[1]) for n in os.listdir(f.spill_dir)}
            assert all(q >= p for q in left)  # the files of parts before p are gone
    assert not os.path.exists(f.spill_dir)
