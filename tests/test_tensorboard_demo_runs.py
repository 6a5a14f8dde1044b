"""A real `tensorboard --logdir demo_runs` lists the three demo runs and their scalars."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import DEMO_RUNS

RUNS = {
    "gpt_1gpu": ["worker0"],
    "ddp_gpt_2rank": ["rank0", "rank1"],
    "fsdp_gpt_4rank": ["rank0", "rank1", "rank2", "rank3"],
}


@pytest.fixture(scope="module")
def tensorboard_url(tmp_path_factory):
    errlog = tmp_path_factory.mktemp("tb") / "stderr.txt"
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                DEMO_RUNS,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--reload_interval",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.time() + 90
        while not (
            m := re.search(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+)/", errlog.read_text())
        ):
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail("tensorboard did not start:\n" + errlog.read_text())
            time.sleep(0.2)
        yield m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def _wait_for(fetch, ok, timeout=60):
    deadline = time.time() + timeout
    while True:
        value = fetch()
        if ok(value) or time.time() > deadline:
            return value
        time.sleep(0.5)


def test_tensorboard_lists_the_three_demo_runs(tensorboard_url):
    runs = _wait_for(lambda: _get(tensorboard_url + "/data/runs"), lambda r: set(RUNS) <= set(r))
    assert set(runs) == set(RUNS)


def test_scalars_are_tagged_per_worker(tensorboard_url):
    want = {
        run: {f"tessera/{m}/{w}" for w in workers for m in ("step_time_ms", "gpu_busy_pct")}
        for run, workers in RUNS.items()
    }
    tags = _wait_for(
        lambda: _get(tensorboard_url + "/data/plugin/scalars/tags"),
        lambda t: all(want[r] <= set(t.get(r, {})) for r in RUNS),
    )
    for run in RUNS:
        assert set(tags[run]) == want[run]
    series = _get(
        tensorboard_url
        + "/data/plugin/scalars/scalars?run=ddp_gpt_2rank&tag=tessera/step_time_ms/rank0"
    )
    assert [step for _, step, _ in series] == [4, 5, 6]
    assert all(40 < value < 60 for _, _, value in series)  # ~50 ms steps in this trace
