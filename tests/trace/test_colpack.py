"""The C column packer (trace/_colpack.c) gives the Python path's bytes, byte for byte.

Its two ways, the whole packing in C with the zstandard package's Zstandard ("c") and the C
layout with Python compressing and choosing ("c-layout"), run beside the numpy path on every
step of every shared trace and on arrays made to sit on each rule's edge: the 64-byte
compression floor, the size where the delta choice moves to probe blocks, columns that
compress to nothing and columns that Zstandard cannot shrink, and sizes around the sixteen
values that the C byte planes take at a time.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import zstandard

from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import columns, writer
from tessera_tb.trace.step import empty_events
from tests.conftest import ROOT, SHARED_TRACES, needs_colpack, shared_trace_files, trace_id

pytestmark = needs_colpack()

RNG = np.random.default_rng(11)
PROBE_ABOVE = columns._DELTA_PROBE_BLOCKS * columns._DELTA_PROBE_VALUES * 2
# up to 3 values each side of 16 and 32 (the C planes take sixteen at a time), and longer
SMALL_SIZES = (0, 1, 2, 3, 7, 8, 9, 13, 15, 16, 17, 19, 32, 33, 35, 100, 5000)


PACKERS = ("python", "c-layout", "c")


def _both(values, dtype, delta) -> tuple[pb.Column, pb.Column]:
    """The column as numpy packs it and as the C packer does, both of its ways alike."""
    made = []
    for packer in PACKERS:
        col = pb.Column()
        columns.encode_many([(values, dtype, delta, col)], packer=packer)
        made.append(col)
    assert made[1] == made[2], "the C layout with Python's Zstandard differs from C's"
    return made[0], made[2]


def _arrays():
    """(name, values, dtype): every dtype, sizes on the rules' edges, values of every kind."""
    out = []
    for n in (*SMALL_SIZES, PROBE_ABOVE, PROBE_ABOVE + 1, 40_000):
        out.append(
            (f"ns{n}", np.cumsum(RNG.integers(0, 5000, n)) + 1_795_329_702_837_034_000, "int64")
        )
        out.append((f"random64_{n}", RNG.integers(-(2**62), 2**62, n), "int64"))
        out.append((f"ids{n}", RNG.integers(0, 400, n), "int32"))
        out.append((f"small{n}", RNG.integers(-3, 3, n), "int8"))
        out.append((f"kinds{n}", RNG.integers(0, 17, n), "uint8"))
        out.append((f"floats{n}", RNG.normal(size=n), "float64"))
        out.append((f"zeros{n}", np.zeros(n, np.int64), "int64"))
    # ascending in places and random in others: the probe blocks decide
    mixed = np.cumsum(RNG.integers(0, 50, 60_000))
    mixed[10_000:30_000] = RNG.integers(0, 2**40, 20_000)
    out.append(("mixed", mixed, "int64"))
    out.append(
        (
            "extremes",
            np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max] * 40),
            "int64",
        )
    )
    out.append(("wrap32", np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max] * 50), "int32"))
    return out


@pytest.mark.parametrize("delta", [None, True, False])
def test_same_bytes_as_numpy(delta):
    for name, values, dtype in _arrays():
        if delta and np.dtype(dtype).kind != "i":
            continue
        py, c = _both(values, dtype, delta)
        assert c.SerializeToString() == py.SerializeToString(), (name, delta)
        back = columns.decode(pb.Column.FromString(c.SerializeToString()))
        np.testing.assert_array_equal(back, values.astype(dtype), err_msg=name)


def test_the_rules_are_all_met():
    """The arrays above reach every outcome, so the comparison covers each branch."""
    seen = set()
    for _, values, dtype in _arrays():
        _, c = _both(values, dtype, None)
        seen.add((c.delta, c.shuffle, c.codec))
    assert {(True, True, pb.CODEC_ZSTD), (False, True, pb.CODEC_ZSTD)} <= seen
    assert (False, True, pb.CODEC_NONE) in seen  # random 64-bit values: compression does not pay
    assert (False, False, pb.CODEC_NONE) in seen  # one value


def test_many_columns_in_one_call_match_one_at_a_time():
    arrays = _arrays()
    together = [pb.Column() for _ in arrays]
    columns.encode_many([(v, d, None, col) for (_, v, d), col in zip(arrays, together)], packer="c")
    for (name, values, dtype), col in zip(arrays, together):
        _, alone = _both(values, dtype, None)
        assert col == alone, name


@pytest.mark.parametrize("dtype", ["<i2", "<i4", "<i8", "<f8"])
def test_every_value_width_is_laid_out_as_numpy_does(dtype):
    """Byte planes and differences of 2, 4 and 8-byte values (the file format has no 2-byte
    column, but the C layout takes one), at every size around its sixteen-value blocks."""
    for n in SMALL_SIZES:
        values = RNG.integers(-(2**14), 2**14, n).astype(dtype)
        mode = columns._PLAIN if values.dtype.kind == "f" else columns._CHOOSE
        made = columns._colpack.layout_columns(
            [(values, mode)], columns._MIN_COMPRESS_BYTES, columns._DELTA_PROBE_VALUES
        )[0]
        assert made == columns._layout(values, mode), (dtype, n)


def test_unpackable_input_is_refused():
    with pytest.raises(ValueError, match="16 bytes"):
        columns._colpack.layout_columns([(np.zeros(4, np.complex128), 0)], 64, 2048)
    with pytest.raises(ValueError, match="unknown mode"):
        columns._colpack.layout_columns([(np.zeros(4, np.int64), 7)], 64, 2048)
    with pytest.raises(TypeError):
        columns._colpack.layout_columns([np.zeros(4, np.int64)], 64, 2048)
    with pytest.raises(ValueError, match="contiguous"):
        columns._colpack.layout_columns([(np.zeros(8, np.int64)[::2], 0)], 64, 2048)
    with pytest.raises(ValueError, match="outside the column"):
        columns._colpack.layout_columns([(np.zeros(3000, np.int64), 2, (0, 1000))], 64, 2048)


def test_unpackable_steps_are_refused():
    """pack_step and pack_columns refuse malformed input with an error, not a crash."""
    assert columns._c_zstd()
    pack = columns._colpack.pack_step
    col = (np.arange(10, dtype=np.int64), 0, None, pb.INT64)
    good = ((10, [col]), [(b"k", pb.ATTR_INT64, col, col)], None, b"[]", 64, 2048, 3)
    assert pack(*good)[2]  # the well-formed call packs
    bad = [
        ((10, [col[:3]]), [], None, b"[]", 64, 2048, 3),  # a column without its dtype
        ((10, col), [], None, b"[]", 64, 2048, 3),  # columns not in a list
        (None, [], None, b"[]", 64, 2048, 3),  # no events table
        ((10, [col]), [(b"k", 1, col)], None, b"[]", 64, 2048, 3),  # an attribute's values
        ((10, [col]), [], (3, [(np.zeros(8, np.int64)[::2], 0, None, 3)]), b"[]", 64, 2048, 3),
        ((10, [(np.zeros(4, np.complex128), 0, None, 3)]), [], None, b"[]", 64, 2048, 3),
        ((10, [(np.zeros(4, np.int64), 9, None, 3)]), [], None, b"[]", 64, 2048, 3),
        ((10, [col]), [], None, "not bytes", 64, 2048, 3),
    ]
    for args in bad:
        with pytest.raises((TypeError, ValueError)):
            pack(*args)
    with pytest.raises(TypeError):
        columns._colpack.pack_columns([np.zeros(4, np.int64)], 64, 2048, 3)


def _shared_steps(path: str) -> list:
    from tessera_tb.importers import kineto_decode
    from tessera_tb.importers.kineto_columns import StringTable
    from tessera_tb.importers.kineto_span import stream_span

    trace = kineto_decode.read_trace(path)
    base = int(trace.meta.get("baseTimeNanoseconds") or 0)
    steps = list(stream_span(trace, StringTable(), 0, base).steps)
    assert steps
    return steps


def _serialised(steps, packer: str, monkeypatch) -> list[bytes]:
    """The steps as step_to_proto makes them, its columns packed by `packer`."""
    encode_many = columns.encode_many
    with monkeypatch.context() as m:
        m.setattr(columns, "encode_many", lambda jobs, p=packer: encode_many(jobs, packer=p))
        return [writer.step_to_proto(step).SerializeToString() for step in steps]


@pytest.mark.parametrize("path", shared_trace_files(), ids=trace_id)
def test_shared_trace_steps_are_the_same_files(path, monkeypatch):
    """Every step of every shared trace is the same bytes whichever way it is packed: the
    protobuf message filled column by column by each packer (step_to_proto), and the step
    packed in one C call with the fields that hold its columns written there
    (encode_step's path, pack_step)."""
    steps = _shared_steps(path)
    files = {packer: _serialised(steps, packer, monkeypatch) for packer in PACKERS}
    assert all(columns.packs_steps(step.num_events) for step in steps)
    calls = []
    pack_step = columns._colpack.pack_step
    monkeypatch.setattr(columns._colpack, "pack_step", lambda *a: calls.append(1) or pack_step(*a))
    files["c-step"] = [writer.encode_step(step) for step in steps]
    assert len(calls) == len(steps)  # every step took the one-call path
    assert files["c"] == files["python"]
    assert files["c-layout"] == files["python"]
    assert files["c-step"] == files["python"]


def test_a_step_with_counters_capabilities_and_nothing_else_packs_the_same(monkeypatch):
    """The fields around the ones pack_step writes (NVML counters, capabilities, the span
    index) and a step with no events, attributes or flows at all: the same bytes both ways."""
    from tessera_tb.importers import nvml_csv
    from tessera_tb.trace.step import Capability

    directory = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")
    (path,) = glob.glob(os.path.join(directory, "*.json.gz"))
    step = _shared_steps(path)[0]
    samples = nvml_csv.read_nvml_csv(os.path.join(directory, "nvml_worker0.csv"))
    counters = nvml_csv.counters_between(samples, step.start_ns, step.end_ns, 0)
    assert counters  # the file's samples inside the step, as the importer attaches them
    extra = dataclasses.replace(
        step,
        span_index=3,
        counters=counters,
        capabilities=[Capability("nvml", "ok", ""), Capability("ncu.counters", "unavailable", "x")],
    )
    empty = dataclasses.replace(
        step, events=empty_events(), attrs=[], flows={}, counters=[], capabilities=[]
    )
    no_flows = dataclasses.replace(step, flows={})
    for case in (extra, empty, no_flows):
        want = writer.step_to_proto(case).SerializeToString()
        assert writer.encode_step(case) == want
        assert pb.Step.FromString(want) == writer.step_to_proto(case)


def test_a_large_step_is_packed_in_rounds_the_same_bytes(monkeypatch):
    """A step too large for one call (columns.packs_steps) is packed by encode_many in
    rounds of _BATCH_BYTES: the same file."""
    path = sorted(glob.glob(os.path.join(SHARED_TRACES, "pytorch", "fsdp_gpt_4rank", "*.json.gz")))[
        0
    ]
    steps = _shared_steps(path)
    one_call = [writer.encode_step(step) for step in steps]
    monkeypatch.setattr(columns, "_BATCH_BYTES", 100_000)
    assert not any(columns.packs_steps(step.num_events) for step in steps)
    assert [writer.encode_step(step) for step in steps] == one_call


def test_pack_step_writes_the_fields_the_messages_have(monkeypatch, request):
    """The field numbers _colpack.pack_step writes are the messages' (from their
    descriptors); where they were not, encode_step would not use it."""
    assert columns._colpack.STEP_SCHEMA == columns._step_schema()
    columns._step_packing.cache_clear()  # found again, with the changed schema below
    request.addfinalizer(columns._step_packing.cache_clear)
    monkeypatch.setattr(
        columns._colpack, "STEP_SCHEMA", ((9, 10, 12),) + columns._step_schema()[1:]
    )
    assert not columns.packs_steps(10)


def test_the_packages_zstandard_is_bound():
    """Where _colpack is built, it packs whole with the zstandard package's own library (the
    default packer): the cases above test the path an import takes."""
    assert columns._c_zstd()
    major, minor, patch = zstandard.ZSTD_VERSION
    origin = importlib.util.find_spec("zstandard._cffi").origin
    assert columns._colpack.bind_zstd(origin, major * 10000 + minor * 100 + patch)
    assert not columns._colpack.bind_zstd(origin, major * 10000 + minor * 100 + patch + 1)


_UNBOUND = """
import importlib.util, sys
import numpy as np
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "zstandard._cffi" else real(name, *a)
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import columns
assert not columns._c_zstd()
col = pb.Column()
columns.encode_many([(np.arange(5000) * 7, "int64", None, col)])
sys.stdout.write(col.SerializeToString().hex())
"""


def test_without_the_packages_library_python_compresses_the_same_bytes():
    """A zstandard without its CFFI module (or one that cannot be loaded) leaves the C packer
    unbound: columns.encode_many then lays out in C and compresses in Python, the same
    bytes, rather than failing."""
    out = subprocess.run(
        [sys.executable, "-c", _UNBOUND], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    col = pb.Column()
    columns.encode_many([(np.arange(5000) * 7, "int64", None, col)], packer="c")
    assert bytes.fromhex(out) == col.SerializeToString()


_JUNK = """
import importlib.util, sys
import zstandard
from tessera_tb.trace import _colpack
major, minor, patch = zstandard.ZSTD_VERSION
version = major * 10000 + minor * 100 + patch
real = importlib.util.find_spec("zstandard._cffi").origin
print(_colpack.bind_zstd(sys.argv[1], version), _colpack.bind_zstd(sys.argv[2], version),
      _colpack.bind_zstd(real, version + 1), _colpack.bind_zstd(real, version))
"""


def test_a_library_that_is_not_there_or_not_the_version_binds_nothing(tmp_path):
    """In a fresh process: a file that is no library, a path with nothing there and the
    package's library with another version number bind nothing; the right one then does."""
    junk = tmp_path / "not_a_library.so"
    junk.write_bytes(b"not an ELF file")
    out = subprocess.run(
        [sys.executable, "-c", _JUNK, str(junk), str(tmp_path / "missing.so")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert out.split() == ["False", "False", "False", "True"]


class _OneFrameAtATime:
    """A zstandard compressor without the batch call (as a build might lack it)."""

    def __init__(self, compressor):
        self.compress = compressor.compress


@pytest.mark.parametrize("packer", PACKERS)
def test_one_compress_call_per_form_writes_the_batch_calls_frames(packer, monkeypatch):
    """_compress_many uses zstandard's batch call where there is one, else a call per form:
    the steps of a real trace come out the same either way."""
    path = [p for p in shared_trace_files() if "fsdp_gpt_4rank" in p][0]
    steps = _shared_steps(path)
    assert hasattr(columns._compressor(), "multi_compress_to_buffer")
    batched = _serialised(steps, packer, monkeypatch)
    single = columns._compressor()
    monkeypatch.setattr(columns, "_compressor", lambda: _OneFrameAtATime(single))
    assert _serialised(steps, packer, monkeypatch) == batched


@pytest.mark.parametrize("packer", PACKERS)
def test_columns_packed_in_small_rounds_are_the_same_bytes(packer, monkeypatch):
    """A huge step's columns are laid out and compressed a few MB at a time
    (columns._BATCH_BYTES): the rounds change nothing in the file."""
    arrays = _arrays()
    alone = []
    for _, values, dtype in arrays:
        col = pb.Column()
        columns.encode_many([(values, dtype, None, col)], packer=packer)
        alone.append(col.SerializeToString())
    for limit in (1, 100_000):
        monkeypatch.setattr(columns, "_BATCH_BYTES", limit)
        together = [pb.Column() for _ in arrays]
        jobs = [(v, d, None, col) for (_, v, d), col in zip(arrays, together)]
        columns.encode_many(jobs, packer=packer)
        assert [c.SerializeToString() for c in together] == alone, limit
