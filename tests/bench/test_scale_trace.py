"""bench/scale_trace.py: a scaled copy keeps each event's text as the source spells it.

The copies stand for real traces of their size in bench/ingest.py (MB/s of JSON), so each
event must keep Kineto's indentation and line breaks, with only the values a copy changes
spelled anew, and must still read back as the copy `scale_events` describes.
"""

from __future__ import annotations

import gzip
import os
import sys

import msgspec
import pytest

from tests.conftest import ROOT, shared_trace_files, trace_id

sys.path.insert(0, os.path.join(ROOT, "bench"))
try:
    import scale_trace
finally:
    sys.path.pop(0)


def _events_text(data: bytes) -> list[bytes]:
    top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    return [bytes(r) for r in msgspec.json.decode(top["traceEvents"], type=list[msgspec.Raw])]


def _source(path: str) -> tuple[bytes, dict]:
    with gzip.open(path, "rb") as f:
        data = f.read()
    return data, msgspec.json.decode(data)


def _one_step_cases() -> list:
    """One shared trace of each folder (the ranks of one job are laid out alike) as it
    is; the single-GPU one also put in one step."""
    first_of: dict[str, str] = {}
    for p in shared_trace_files():
        first_of.setdefault(os.path.dirname(p), p)
    cases = [pytest.param(p, False, id=trace_id(p)) for p in first_of.values()]
    gpt = [p for p in shared_trace_files() if "gpt_1gpu_stack" in p]
    return cases + [pytest.param(p, True, id=f"{trace_id(p)}-one-step") for p in gpt]


@pytest.mark.parametrize(("path", "one_step"), _one_step_cases())
def test_a_copy_reads_back_as_scale_events_says(path, one_step, tmp_path, capsys):
    """Each producer of the shared traces lays events out its own way (Kineto of 2021 and
    of now, HTA's test traces, ROCm): two copies read back as scale_events' copies, none
    written compact."""
    data, trace = _source(path)
    out = str(tmp_path / "x2.json.gz")
    n = scale_trace.scale_trace(path, out, 2, one_step=one_step, level=1)
    with gzip.open(out, "rb") as f:
        copied = msgspec.json.decode(f.read())
    expected = scale_trace.scale_events(trace["traceEvents"], 2, one_step=one_step)
    assert n == len(expected) == len(copied["traceEvents"])
    assert copied["traceEvents"] == expected
    assert {k: v for k, v in copied.items() if k != "traceEvents"} == {
        k: v for k, v in trace.items() if k != "traceEvents"
    }
    # No event fell back to compact JSON: each kept the source's text.
    assert "compact JSON" not in capsys.readouterr().err


def test_a_copy_has_the_sources_text_and_bytes_per_event(tmp_path):
    (path,) = [p for p in shared_trace_files() if "gpt_1gpu_stack" in p]
    data, trace = _source(path)
    source = _events_text(data)
    out = str(tmp_path / "x4.json.gz")
    scale_trace.scale_trace(path, out, 4, level=1)
    with gzip.open(out, "rb") as f:
        copied = _events_text(f.read())
    meta = sum(e.get("ph") == "M" for e in trace["traceEvents"])
    per_copy = len(source) - meta
    assert len(copied) == meta + 4 * per_copy
    # The first copy is the source's own text, event for event (metadata events first).
    src_meta = [t for t, e in zip(source, trace["traceEvents"]) if e.get("ph") == "M"]
    src_rest = [t for t, e in zip(source, trace["traceEvents"]) if e.get("ph") != "M"]
    assert copied[:meta] == src_meta
    first, last = copied[meta : meta + per_copy], copied[-per_copy:]
    same = sum(a == b for a, b in zip(first, src_rest))
    assert same >= 0.95 * per_copy  # all but the step markers, whose copy 0 is rewritten too
    # A later copy keeps the layout: the same lines, only numbers changed, so within a few
    # bytes per event of the source (Kineto's ~313 bytes; compact JSON would be ~258).
    src_bytes = sum(map(len, src_rest))
    assert abs(sum(map(len, last)) - src_bytes) < 0.01 * src_bytes
    assert all(a.count(b"\n") == b.count(b"\n") for a, b in zip(last, src_rest))


def test_an_event_the_substitution_cannot_spell_is_written_compact_and_counted():
    respell = scale_trace._Respeller()
    old = {"args": {"External id": 5}, "ph": "X", "ts": 10.5, "dur": 1.0}
    new = {**old, "ts": 20.5, "args": {"External id": 9}}
    # Kineto writes "args" last; here it comes first, so "ts" lies in the part read as args.
    raw = b'{\n  "args": {"External id": 5},\n  "ph": "X", "ts": 10.500, "dur": 1.000\n}'
    text = respell.text(raw, old, new)
    assert msgspec.json.decode(text) == new
    assert respell.fallbacks == 1
    kineto = (
        b'{\n  "ph": "X", "ts": 10.500, "dur": 1.000,\n  "args": {\n    "External id": 5\n  }\n}'
    )
    text = respell.text(kineto, old, new)
    assert text == kineto.replace(b"10.500", b"20.500").replace(b": 5", b": 9")
    assert respell.fallbacks == 1
