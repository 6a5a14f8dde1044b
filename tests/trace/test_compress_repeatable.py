"""An import writes the same step files every time. The same steps are encoded in one thread,
in four threads at once, and in fresh processes whose malloc hands out memory filled with
different bytes (glibc's MALLOC_PERTURB_, its mmap threshold raised so that large buffers come
from the heap too): output that hung on thread timing or on memory left uninitialised would
differ.

The columns are compressed with Zstandard, whose frames pass this. ISA-L's deflate (also 3x
faster than zlib's) did not: run as these tests run it, it gave a few columns of 60-100 bytes
other (valid) streams, 33 bytes in one thread and 36 in another, in about one run of three."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import ROOT, SHARED_TRACES

TRACES = [
    os.path.join(SHARED_TRACES, "pytorch", "fsdp_gpt_4rank"),
    os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack"),
]

_ENCODE = """
import glob, hashlib, sys
from tessera_tb.importers import kineto_decode
from tessera_tb.importers.kineto_columns import StringTable
from tessera_tb.importers.kineto_span import stream_span
from tessera_tb.trace.writer import encode_step

def encoded_steps(directory):
    out = []
    for path in sorted(glob.glob(directory + "/*.json.gz")):
        out += list(stream_span(kineto_decode.read_trace(path), StringTable(), 0, 0).steps)
    return out

if __name__ == "__main__":
    steps = [s for d in sys.argv[1:] for s in encoded_steps(d)]
    print(hashlib.sha256(b"".join(encode_step(s) for s in steps)).hexdigest())
"""


@pytest.fixture(scope="module")
def steps():
    namespace: dict = {}
    exec(compile(_ENCODE, "<encode>", "exec"), namespace)
    found = [s for d in TRACES for s in namespace["encoded_steps"](d)]
    assert len(found) >= 8
    return found


def _digest(blobs) -> str:
    return hashlib.sha256(b"".join(blobs)).hexdigest()


def test_four_threads_write_what_one_writes(steps):
    from tessera_tb.trace.writer import encode_step

    alone = [encode_step(s) for s in steps]
    for _ in range(3):
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(encode_step, steps * 2))
        assert together == alone * 2


@pytest.mark.parametrize("perturb", ["0", "85", "170"])
def test_processes_with_dirty_memory_write_the_same_bytes(steps, perturb):
    from tessera_tb.trace.writer import encode_step

    expected = _digest(encode_step(s) for s in steps)
    env = dict(os.environ, MALLOC_PERTURB_=perturb, MALLOC_MMAP_THRESHOLD_="4294967295")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", _ENCODE, *TRACES],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
