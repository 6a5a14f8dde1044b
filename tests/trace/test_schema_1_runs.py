"""Runs of schema 1.0 (columns compressed with zlib) still read, as the same steps.

The committed demo runs were written by 1.0. The same traces imported today are written by
2.0 (Zstandard). Both are read back and compared by value: events by text (string ids are
local to each file), attributes, flows, counters and tracks. (Regenerating the demo runs would
end this test: keep a 1.0 copy of these two under tests/data first.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tessera_tb.importers.kineto_import import import_traces
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import open_run
from tessera_tb.trace.reader import read_meta
from tessera_tb.trace.schema_version import SCHEMA_MAJOR
from tests.conftest import DEMO_RUNS, SHARED_TRACES


def _codecs(run_dir: str) -> set[int]:
    found = set()
    for root, _, files in os.walk(run_dir):
        for name in files:
            if name.startswith("step_"):
                msg = pb.Step.FromString(open(os.path.join(root, name), "rb").read())
                for _field, value in msg.events.ListFields():
                    if isinstance(value, pb.Column):
                        found.add(value.codec)
                found.add(msg.strings.codec)
    return found


@pytest.mark.parametrize("run", ["ddp_gpt_2rank", "gpt_1gpu"])
def test_a_schema_1_run_reads_as_the_same_steps_as_todays_import(run, tmp_path):
    source = {"ddp_gpt_2rank": "ddp_gpt_2rank", "gpt_1gpu": "gpt_1gpu_stack"}[run]
    import_traces([os.path.join(SHARED_TRACES, "pytorch", source)], str(tmp_path), run)
    old_dir, new_dir = os.path.join(DEMO_RUNS, run), str(tmp_path / run)
    old, new = open_run(old_dir), open_run(new_dir)
    assert sorted(old.workers) == sorted(new.workers) and old.steps == new.steps
    for worker in old.workers:
        meta = os.path.join("plugins", "tessera", worker, "meta.pb")
        assert read_meta(os.path.join(old_dir, meta)).schema_major == 1
        assert read_meta(os.path.join(new_dir, meta)).schema_major == SCHEMA_MAJOR == 2
    assert pb.CODEC_ZLIB in _codecs(old_dir) <= {pb.CODEC_NONE, pb.CODEC_ZLIB}
    assert pb.CODEC_ZSTD in _codecs(new_dir) <= {pb.CODEC_NONE, pb.CODEC_ZSTD}

    for worker in old.workers:
        for step in old.steps:
            a, b = old.load_step(worker, step), new.load_step(worker, step)
            fa, fb = a.frame(), b.frame()
            assert list(fa.columns) == list(fb.columns) and len(fa) == len(fb) > 1000
            for column in fa.columns:
                if fa[column].dtype.name == "category":
                    assert (fa[column].astype(object) == fb[column].astype(object)).all(), column
                else:
                    np.testing.assert_array_equal(fa[column].values, fb[column].values, column)
            assert [x.key for x in a.attrs] == [x.key for x in b.attrs]
            for attr in a.attrs:
                assert a.attr(attr.key).equals(b.attr(attr.key)), attr.key
            assert a.flows.keys() == b.flows.keys()
            for key in a.flows:
                if key == "cat_id":  # string ids: compared by text
                    va, vb = a.string_values(a.flows[key]), b.string_values(b.flows[key])
                    np.testing.assert_array_equal(va, vb, key)
                else:
                    np.testing.assert_array_equal(a.flows[key], b.flows[key], key)
            assert [(c.name, c.ts_ns.tolist(), c.values.tolist()) for c in a.counters] == [
                (c.name, c.ts_ns.tolist(), c.values.tolist()) for c in b.counters
            ]
            assert a.tracks == b.tracks
