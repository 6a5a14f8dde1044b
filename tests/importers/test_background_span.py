"""A large span's numpy pieces run beside each other (importers/background.py): the
argument columns and the slices' times beside the event columns, the canonical order beside
the numbering of names and categories, the host trees beside the launch links and step
markers, the flow binding beside the step spans, the arguments' step split beside the
events'. The files are those of one piece after the other, and an error in either piece
stops the import with the error it would have raised alone."""

from __future__ import annotations

import gzip
import json
import os
import threading

import pytest

from tessera_tb.importers import background, kineto_span
from tessera_tb.importers.background import Background
from tessera_tb.importers.kineto_import import ImportFailed, import_traces
from tests.conftest import SHARED_TRACES, assert_same_files
from tests.importers.test_parallel_import import _run_files

STACK = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
DDP = os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank")
FSDP = os.path.join(SHARED_TRACES, "pytorch", "fsdp_gpt_4rank")
RESNET = os.path.join(
    SHARED_TRACES,
    "pytorch_2021",
    "resnet50_num_workers_0",
    "worker0.1623143089861.pt.trace.json.gz",
)


def test_pieces_in_threads_make_the_same_files(tmp_path, monkeypatch, started_threads):
    inputs = {"stack": [STACK], "ddp": [DDP], "fsdp": [FSDP], "resnet": [RESNET]}  # 8 spans

    def imported(where: str) -> dict[str, bytes]:
        files = {}
        for run, paths in inputs.items():
            result = import_traces(paths, str(tmp_path / where), run, jobs=1)
            files.update({f"{run}/{p}": data for p, data in _run_files(result.run_dir).items()})
        return files

    monkeypatch.setattr(background, "PARALLEL_ROWS", 10**12)  # every piece in turn
    alone = imported("a")
    assert "tessera-background" not in started_threads
    monkeypatch.setattr(background, "PARALLEL_ROWS", 0)  # two at a time, on every span
    both = imported("b")
    assert started_threads.count("tessera-background") == 6 * 8  # 6 pieces per span
    assert len(alone) > 8 * 2
    assert_same_files(both, alone)


def test_a_large_span_runs_its_pieces_in_threads_and_a_small_one_does_not(
    tmp_path, started_threads
):
    import_traces([STACK], str(tmp_path / "small"), "r")  # 11,404 events
    assert "tessera-background" not in started_threads
    import_traces([RESNET], str(tmp_path / "large"), "r")  # 75,718 events
    assert started_threads.count("tessera-background") == 6


def test_an_error_beside_a_running_piece_is_raised_and_the_piece_ends(tmp_path, monkeypatch):
    """Two ProfilerStep slices of one number: found while the flows are bound in the other
    thread. The import fails with that error, and no thread of the span is left running."""
    monkeypatch.setattr(background, "PARALLEL_ROWS", 0)
    path = next(os.path.join(STACK, f) for f in os.listdir(STACK) if f.endswith(".json.gz"))
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    names = sorted({e["name"] for e in trace["traceEvents"] if "ProfilerStep#" in e["name"]})
    assert len(names) >= 2
    text = json.dumps(trace).replace(f'"{names[1]}"', f'"{names[0]}"')
    bad = tmp_path / "worker0.1.pt.trace.json"
    bad.write_text(text)
    with pytest.raises(ImportFailed, match="two ProfilerStep events carry the same step"):
        import_traces([str(bad)], str(tmp_path / "logdir"), "r")
    assert not [t for t in threading.enumerate() if t.name == "tessera-background"]
    assert os.listdir(tmp_path / "logdir") == []


def test_a_bad_slice_time_is_raised_while_the_arguments_are_read(tmp_path, monkeypatch):
    """A slice without a number for `ts`, found while the arguments are typed in the other
    thread: the import fails with that error, as when the times were checked first, and no
    thread of the span is left running."""
    monkeypatch.setattr(background, "PARALLEL_ROWS", 0)
    path = next(os.path.join(STACK, f) for f in os.listdir(STACK) if f.endswith(".json.gz"))
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    i = next(i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("args"))
    events[i]["ts"] = None
    bad = tmp_path / "worker0.1.pt.trace.json"
    bad.write_text(json.dumps(trace))
    with pytest.raises(ImportFailed, match=rf"traceEvents\[{i}\] has no numeric 'ts'"):
        import_traces([str(bad)], str(tmp_path / "logdir"), "r")
    assert not [t for t in threading.enumerate() if t.name == "tessera-background"]
    assert os.listdir(tmp_path / "logdir") == []


def _fails(message: str):
    raise ValueError(message)


@pytest.mark.parametrize("rows", [0, 10**12])
def test_background_raises_its_error_in_the_caller_and_join_does_not(rows, monkeypatch):
    job = Background(_fails, "in the piece").run_or_start(rows - background.PARALLEL_ROWS)
    job.join()  # waits; the error is kept for result()
    with pytest.raises(ValueError, match="in the piece"):
        job.result()
    assert Background(sum, [1, 2, 3]).run_or_start(rows).result() == 6


def test_the_pieces_memory_is_given_back_before_the_steps_of_a_large_span(tmp_path, monkeypatch):
    """Memory the other thread freed sits in its malloc arena, where the steps' encoding does
    not reuse it: it is trimmed once per large span (the 52x one-step copy peaked 40 MB
    higher without). With glibc's malloc set for imports (one arena, the default) the
    call is made too and trims nothing (tests/importers/test_import_malloc.py); here the
    settings are glibc's own."""
    monkeypatch.setenv("TESSERA_MALLOC", "default")
    trims = []
    monkeypatch.setattr(kineto_span, "release_freed_memory", lambda: trims.append(1))
    import_traces([STACK], str(tmp_path / "small"), "r")
    assert trims == []
    import_traces([RESNET], str(tmp_path / "large"), "r")
    assert trims == [1]
