"""Runs on S3 through fsspec, against a real S3-compatible server (moto) on loopback: the
importer writes there, the plugin lists and reads from there with the same numbers as a local
copy, and storage problems are one clear error that breaks nothing else."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import time
import uuid

import pytest

from tessera_tb.backend import plugin_data
from tessera_tb.backend.run_index import RunIndex
from tessera_tb.importers.kineto_import import ImportFailed, import_traces
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import remote
from tessera_tb.trace.reader import open_run
from tessera_tb.trace.writer import WorkerWriter
from tests.conftest import SHARED_TRACES, assert_same_files, file_contents, tessera_prof
from tests.plugin.conftest import get_json, http_get, start_tensorboard, stop_tensorboard

DDP_TRACES = sorted(glob.glob(os.path.join(SHARED_TRACES, "pytorch", "ddp_gpt_2rank", "*.json.gz")))
VIEWS = [
    ("overview", {}),
    ("topk", {"table": "operators"}),
    ("topk", {"table": "kernels"}),
    ("collectives", {"metric": "busbw"}),
    ("roofline", {"group": "kernel"}),
    ("memory", {}),
]


def _boto_s3(server, keys):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name=server.region,
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
    )


def _objects(server, bucket: str, prefix: str) -> dict[str, bytes]:
    s3 = _boto_s3(server, server.admin)
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]
    return {k[len(prefix) :]: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


@pytest.fixture(scope="module")
def local_ddp(tmp_path_factory) -> str:
    """The DDP traces imported into a local logdir (the reference copy)."""
    logdir = tmp_path_factory.mktemp("local_logdir")
    import_traces(DDP_TRACES, str(logdir), "ddp")
    return str(logdir)


@pytest.fixture
def s3_ddp(s3_env) -> str:
    """The DDP traces imported into s3://runs/<unique>/ddp with the importer; the logdir URL."""
    logdir = f"s3://runs/{uuid.uuid4().hex[:12]}"
    result = remote.import_traces_to_url(DDP_TRACES, logdir, "ddp")
    assert result.run_dir == f"{logdir}/ddp"
    return logdir


def test_an_imported_run_lands_in_the_bucket_file_for_file(s3_ddp, local_ddp, s3_env):
    bucket, prefix = s3_ddp.removeprefix("s3://").split("/", 1)
    in_bucket = _objects(s3_env, bucket, prefix + "/ddp/")
    local = file_contents(os.path.join(local_ddp, "ddp"))
    # Event file names carry the host, time and pid of the writer: compare the run's own files.
    step_files = {k: v for k, v in local.items() if k.startswith("plugins/")}
    assert_same_files({k: v for k, v in in_bucket.items() if k.startswith("plugins/")}, step_files)
    events = [k for k in in_bucket if k.startswith("events.out.tfevents.")]
    assert sorted(e.rsplit(".", 1)[1] for e in events) == ["rank0", "rank1"]


def test_the_plugin_browses_the_bucket_with_the_numbers_of_the_local_copy(s3_ddp, local_ddp):
    on_s3 = RunIndex(s3_ddp, refresh_s=60)
    local = RunIndex(local_ddp, refresh_s=60)
    listing = plugin_data.runs_listing(on_s3)
    assert listing["logdir_error"] is None
    assert [r["name"] for r in listing["runs"]] == ["ddp"]
    assert listing["runs"] == plugin_data.runs_listing(local)["runs"]
    for view, params in VIEWS:
        args = {"run": "ddp", **params}
        assert plugin_data.view_json(on_s3, view, args) == plugin_data.view_json(
            local, view, args
        ), view
    header = plugin_data.run_header(on_s3, on_s3.entry("ddp"))
    assert header == plugin_data.run_header(local, local.entry("ddp"))


def test_tessera_prof_import_writes_a_run_into_a_bucket(s3_env, local_ddp):
    logdir = f"s3://runs/{uuid.uuid4().hex[:12]}"
    proc = _cli("import", *DDP_TRACES, "--logdir", logdir, "--run", "cli", "-q", env={})
    assert proc.returncode == 0, proc.stderr
    assert f"into {logdir}/cli:" in proc.stdout
    on_s3, local = open_run(f"{logdir}/cli"), open_run(os.path.join(local_ddp, "ddp"))
    assert on_s3.steps == local.steps
    for w in local.workers:
        assert on_s3.worker(w).meta == local.worker(w).meta
    again = _cli("import", *DDP_TRACES, "--logdir", logdir, "--run", "cli", "-q", env={})
    _one_line_error(again, f"{logdir}/cli: run already exists")


def test_the_index_never_lists_step_files_and_rereads_meta_only_when_its_etag_changes(
    s3_ddp, monkeypatch
):
    files = remote.files_for(s3_ddp)
    listed: list[str] = []
    reads: list[str] = []
    real_ls, real_cat = files.fs.ls, files.fs.cat_file
    monkeypatch.setattr(files.fs, "ls", lambda p, **kw: listed.append(p) or real_ls(p, **kw))
    monkeypatch.setattr(files.fs, "cat_file", lambda p, **kw: reads.append(p) or real_cat(p, **kw))
    index = RunIndex(s3_ddp, refresh_s=60)
    entry = index.entry("ddp")
    assert sorted(entry.run.workers) == ["rank0", "rank1"]
    assert not [p for p in listed if p.rstrip("/").endswith(("/rank0", "/rank1"))]
    assert sorted(p.rsplit("/", 2)[-2] for p in reads if p.endswith("meta.pb")) == [
        "rank0",
        "rank1",
    ]
    # A rescan with nothing changed reads no meta.pb again (cached versions, same ETags).
    reads.clear()
    files.invalidate()
    index.refresh()
    assert [p for p in reads if p.endswith("meta.pb")] == []
    # The writer drops step 6 from rank1's index: that meta.pb is read again, the other not.
    meta_url = f"{s3_ddp}/ddp/plugins/tessera/rank1/meta.pb"
    meta = pb.WorkerMeta.FromString(files.read_bytes(meta_url))
    del meta.steps[-1]
    files.put_bytes(meta_url, meta.SerializeToString())
    reads.clear()
    files.invalidate()
    index.refresh()
    assert [p.rsplit("/", 2)[-2] for p in reads if p.endswith("meta.pb")] == ["rank1"]
    assert index.entry("ddp").run.worker("rank1").steps == [4, 5]


def test_a_run_written_step_by_step_reaches_the_plugin_through_the_uploader(s3_env, tmp_path):
    """What a capture session does with an s3:// directory: write locally, sync each step."""
    source = open_run(os.path.join(os.path.dirname(__file__), "..", "..", "demo_runs", "gpt_1gpu"))
    local = tmp_path / "exp1"
    url = f"s3://runs/{uuid.uuid4().hex[:12]}/exp1"
    meta = pb.WorkerMeta()
    meta.CopyFrom(source.worker("worker0").meta)
    del meta.steps[:]
    writer = WorkerWriter(str(local), meta, scalars=False)
    uploader = remote.RunUploader(str(local), url)
    index = RunIndex(url.rsplit("/", 1)[0], refresh_s=60)
    for n, step_no in enumerate(source.steps, start=1):
        writer.write_step(source.load_step("worker0", step_no))
        sent = uploader.sync()
        assert sent[-1] == "plugins/tessera/worker0/meta.pb"  # the index goes last
        assert sent[:-1] == [f"plugins/tessera/worker0/step_{step_no:08d}.pb"]
        remote.files_for(url).invalidate()
        index.refresh()
        assert index.entry("exp1").run.steps == source.steps[:n]
    writer.close()
    got = index.entry("exp1").run.load_step("worker0", source.steps[-1])
    want = source.load_step("worker0", source.steps[-1])
    assert got.num_events == want.num_events
    assert (got.events["start_ns"] == want.events["start_ns"]).all()


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def _cli(*args: str, env: dict[str, str]):
    return tessera_prof(*args, env=env, timeout=120)


def test_an_unreachable_endpoint_is_one_clear_error_and_local_runs_keep_working(
    s3_env, local_ddp, monkeypatch, tmp_path
):
    monkeypatch.setenv("S3_ENDPOINT", "http://127.0.0.1:1")  # nothing listens on port 1
    remote.clear_cache()
    index = RunIndex("s3://runs/team", refresh_s=60)
    listing = plugin_data.runs_listing(index)
    assert listing["runs"] == []
    assert listing["logdir_error"].startswith("s3://runs/team: cannot reach the storage endpoint")
    with pytest.raises(ImportFailed, match="cannot reach the storage endpoint"):
        remote.import_traces_to_url(DDP_TRACES, "s3://runs/team", "ddp")
    proc = _cli("html", "s3://runs/team/ddp", "-o", str(tmp_path / "r.html"), env={})
    _one_line_error(proc, "s3://runs/team/ddp", "cannot reach the storage endpoint")
    assert not (tmp_path / "r.html").exists()
    local = RunIndex(local_ddp, refresh_s=60)  # the rest of the world is unaffected
    assert json.loads(plugin_data.view_json(local, "overview", {"run": "ddp"}))["errors"] == []


def test_a_bucket_without_permission_is_access_denied_and_nothing_else_breaks(
    s3_ddp, moto_s3, monkeypatch, tmp_path
):
    for k, v in moto_s3.env(moto_s3.reader).items():
        monkeypatch.setenv(k, v)
    remote.clear_cache()
    denied = plugin_data.runs_listing(RunIndex("s3://secret/runs", refresh_s=60))
    assert denied["runs"] == []
    assert denied["logdir_error"].startswith("s3://secret/runs: access denied")
    allowed = plugin_data.runs_listing(RunIndex(s3_ddp, refresh_s=60))  # the reader's bucket
    assert allowed["logdir_error"] is None and [r["name"] for r in allowed["runs"]] == ["ddp"]
    proc = _cli("diff", "s3://secret/runs/a", f"{s3_ddp}/ddp", env={})
    _one_line_error(proc, "s3://secret/runs/a", "access denied")
    bogus = {**moto_s3.env(("AKIANOSUCHKEY0000000", "x"))}
    proc = _cli("pack", f"{s3_ddp}/ddp", "-o", str(tmp_path / "x.tessera.zip"), env=bogus)
    _one_line_error(proc, "access denied")
    assert os.listdir(tmp_path) == []


def test_tensorboard_reads_the_bucket_with_load_fast_false_and_s3_endpoint(s3_ddp, tmp_path):
    """The command of docs/SHARING.md: S3_ENDPOINT serves TensorBoard and the plugin."""
    proc, url = start_tensorboard(s3_ddp, tmp_path / "tb.txt", "--load_fast=false")
    try:
        assert [r["name"] for r in get_json(url, "runs")["runs"]] == ["ddp"]
        overview = get_json(url, "overview", run="ddp")
        assert overview["selection"]["workers"] == ["rank0", "rank1"]
        # TensorBoard's own reader (boto3) found the run's event files in the bucket too.
        deadline = time.time() + 30
        while "ddp" not in json.loads(http_get(f"{url}/data/runs")[1]):
            assert time.time() < deadline, (tmp_path / "tb.txt").read_text()[-2000:]
            time.sleep(0.3)
    finally:
        stop_tensorboard(proc)


def test_a_url_without_its_backend_or_protocol_says_what_to_install():
    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(
            remote.RemoteStorageError, match=r"pip install 'tessera-profiler\[gcs\]'"
        ):
            open_run("gs://bucket/runs/exp1")
    with pytest.raises(remote.RemoteStorageError, match="nosuch://x/y: .*Protocol not known"):
        open_run("nosuch://x/y")
