"""`profile.session(tensorboard_dir="s3://...")` writes the run into the bucket as it goes,
and the plugin browses it with the numbers of the local copy (real moto S3 on loopback)."""

from __future__ import annotations

import json
import os
import uuid
import warnings

import pytest

from tessera import profile
from tessera_tb.backend import plugin_data
from tessera_tb.backend.run_index import RunIndex
from tessera_tb.trace import remote
from tessera_tb.trace.reader import open_run
from tests.conftest import assert_same_files, file_contents, run_links_named
from tests.sharing.test_remote_s3 import _objects

torch = pytest.importorskip("torch")


def _train(sess, steps: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        with profile.region("forward"):
            loss = model(torch.randn(32, 64)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        profile.counter(name="loss", value=float(loss.detach()), unit="scalar")
        sess.step()


def test_a_session_writes_its_steps_into_the_bucket(s3_env):
    logdir = f"s3://runs/{uuid.uuid4().hex[:12]}"
    with profile.session(
        activities=["cpu"],
        schedule=profile.schedule(wait=1, warmup=1, active=2, repeat=1),
        tensorboard_dir=f"{logdir}/exp1",
    ) as sess:
        _train(sess, 6)
    assert sess.steps_written == [2, 3]
    staging = sess.run_dir  # the local copy the session wrote before uploading
    bucket, prefix = logdir.removeprefix("s3://").split("/", 1)
    in_bucket = _objects(s3_env, bucket, prefix + "/exp1/")
    local = file_contents(staging)
    assert_same_files(
        {k: v for k, v in in_bucket.items() if not k.startswith(".")},
        {k: v for k, v in local.items() if not k.startswith(".")},
    )
    remote.clear_cache()
    assert open_run(f"{logdir}/exp1").steps == [2, 3]
    on_s3 = RunIndex(logdir, refresh_s=60)
    here = RunIndex(os.path.dirname(staging), refresh_s=60)
    name = os.path.basename(staging)
    for view, params in (("overview", {}), ("topk", {"table": "operators"})):
        got = json.loads(plugin_data.view_json(on_s3, view, {"run": "exp1", **params}))
        want = json.loads(plugin_data.view_json(here, view, {"run": name, **params}))
        got.pop("run", None), want.pop("run", None)
        assert run_links_named(got, "exp1") == run_links_named(want, name), view


def test_an_unwritable_bucket_warns_once_and_training_runs_on(moto_s3, monkeypatch):
    for k, v in moto_s3.env(moto_s3.reader).items():  # reader may not touch `secret`
        monkeypatch.setenv(k, v)
    remote.clear_cache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile.session(activities=[], tensorboard_dir="s3://secret/runs/exp1") as sess:
            for _ in range(3):
                sess.step()
    messages = [str(w.message) for w in caught if "tessera" in str(w.message)]
    assert len(messages) == 1 and "s3://secret/runs/exp1" in messages[0]
    assert "access denied" in messages[0] and "training runs without profiling" in messages[0]
    assert sess.steps_written == []
