"""Import and cross-rank analyses on a real Dask cluster (a LocalCluster of worker processes
on 127.0.0.1): the same files and the same numbers as the local path, into a directory and
into a (moto) S3 bucket; a corrupt rank fails the whole import and leaves nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

from tessera_tb.importers.kineto_import import ImportFailed, import_traces
from tessera_tb.trace import remote
from tests.conftest import ROOT, assert_same_files, file_contents

distributed = pytest.importorskip("distributed", reason="pip install 'tessera-profiler[dask]'")

N_RANKS = 16
STRAGGLER = 11
DERIVED = "plugins/tessera/.derived/"


def _run_files(run_dir: str) -> dict[str, bytes]:
    """Every file of a run; event files by worker, without their first record (it holds the
    time the file was opened)."""
    out = {}
    for name, data in file_contents(run_dir).items():
        if name.startswith(DERIVED):  # a derived index (the Dask import writes one)
            continue
        if name.startswith("events.out.tfevents."):
            records = list(RawEventFileLoader(os.path.join(run_dir, name)).Load())
            out["events:" + name.rsplit(".", 1)[-1]] = b"".join(records[1:])
        else:
            out[name] = data
    return out


@pytest.fixture(scope="module")
def synth16(tmp_path_factory) -> str:
    """A 16-rank trace directory made by bench/synth_ranks.py, rank 11 the straggler."""
    out = tmp_path_factory.mktemp("synth") / "fsdp16"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "synth_ranks.py"),
            str(N_RANKS),
            str(out),
            "--stragglers",
            str(STRAGGLER),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"stragglers: {STRAGGLER}"
    return str(out)


@pytest.fixture(scope="module")
def cluster(moto_s3):
    """One LocalCluster for the module: 2 worker processes, one thread each, on 127.0.0.1,
    no dashboard. Its workers inherit the S3 server's endpoint and admin keys."""
    mp = pytest.MonkeyPatch()
    for k, v in moto_s3.env(moto_s3.admin).items():
        mp.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        mp.delenv(k, raising=False)
    remote.clear_cache()
    c = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    )
    try:
        yield c
    finally:
        c.close()
        mp.undo()
        remote.clear_cache()


@pytest.fixture(scope="module")
def local_run(synth16, tmp_path_factory) -> str:
    logdir = tmp_path_factory.mktemp("local")
    return import_traces([synth16], str(logdir), "r", jobs=1).run_dir


def test_dask_import_into_a_directory_writes_the_files_of_a_local_import(
    synth16, local_run, cluster, tmp_path
):
    lines = []
    result = import_traces(
        [synth16], str(tmp_path), "r", dask=cluster.scheduler_address, progress=lines.append
    )
    assert [w.worker for w in result.workers] == sorted(f"rank{r}" for r in range(N_RANKS))
    a, b = _run_files(local_run), _run_files(result.run_dir)
    assert sorted(a) == sorted(b) and len(a) == N_RANKS * 5  # 3 steps, meta, events per rank
    assert_same_files(a, b)
    # Progress names every rank and the Dask worker that imported it.
    for r in range(N_RANKS):
        assert any(
            line.startswith(f"rank{r}: ") and "3 of 3 steps written" in line for line in lines
        )
    assert all("[tcp://127.0.0.1:" in line for line in lines)
    assert sorted(os.listdir(tmp_path)) == ["r"]  # no staging directory left
    assert os.listdir(os.path.join(result.run_dir, DERIVED)) == ["run_summary.json"]


def test_dask_import_into_s3_writes_the_files_of_a_local_import(synth16, local_run, cluster):
    from tessera_tb.importers.dask_import import import_traces_dask_to_url

    logdir = f"s3://runs/{uuid.uuid4().hex[:12]}"
    result = import_traces_dask_to_url([synth16], logdir, "r", dask=cluster.scheduler_address)
    assert result.run_dir == f"{logdir}/r"
    files = remote.files_for(logdir)
    key = files.key(result.run_dir)
    in_bucket = {
        os.path.relpath(k, key): files.fs.cat_file(k)
        for k in files.fs.find(key)
        if "/plugins/" in k
    }
    assert in_bucket.pop(DERIVED + "run_summary.json").startswith(b'{"version":1')
    local = {k: v for k, v in file_contents(local_run).items() if k.startswith("plugins/")}
    assert sorted(in_bucket) == sorted(local)
    assert_same_files(in_bucket, local)
    events = [k for k in files.fs.find(key) if "events.out.tfevents." in k]
    assert len(events) == N_RANKS


def _with_corrupt_rank(synth16: str, tmp_path, rank: int) -> str:
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in os.listdir(synth16):
        if not f.startswith(f"rank{rank}."):
            os.symlink(os.path.join(synth16, f), mixed / f)
    (mixed / f"rank{rank}.7.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": "x"}]}')
    return str(mixed)


def test_a_corrupt_rank_fails_the_dask_import_with_its_name_and_leaves_nothing(
    synth16, cluster, tmp_path
):
    mixed = _with_corrupt_rank(synth16, tmp_path, 6)
    logdir = tmp_path / "logdir"
    with pytest.raises(ImportFailed) as err:
        import_traces([mixed], str(logdir), "r", dask=cluster.scheduler_address)
    assert "rank6.7.pt.trace.json" in str(err.value) and "traceEvents[0]" in str(err.value)
    assert os.listdir(logdir) == []


def test_a_corrupt_rank_fails_the_dask_import_into_s3_and_leaves_no_object(
    synth16, cluster, tmp_path
):
    from tessera_tb.importers.dask_import import import_traces_dask_to_url

    mixed = _with_corrupt_rank(synth16, tmp_path, 3)
    logdir = f"s3://runs/{uuid.uuid4().hex[:12]}"
    with pytest.raises(ImportFailed) as err:
        import_traces_dask_to_url([mixed], logdir, "r", dask=cluster.scheduler_address)
    assert "rank3.7.pt.trace.json" in str(err.value)
    files = remote.files_for(logdir)
    assert files.fs.find(files.key(logdir)) == []


def test_the_cli_imports_on_local_n_and_without_dask_never_imports_it(synth16, tmp_path):
    four = tmp_path / "four"
    four.mkdir()
    for f in sorted(os.listdir(synth16))[:4]:
        shutil.copy(os.path.join(synth16, f), four / f)
    code = (
        "import sys; from tessera.cli.main import main; rc = main(sys.argv[1:]); "
        "print('dask loaded' if 'distributed' in sys.modules else 'no dask'); sys.exit(rc)"
    )
    plain = subprocess.run(
        [sys.executable, "-c", code, "import", str(four), "--logdir", str(tmp_path / "a"), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip().endswith("no dask")
    on_dask = subprocess.run(
        [sys.executable, "-c", code, "import", str(four), "--logdir", str(tmp_path / "b")]
        + ["--dask", "local:2"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert on_dask.returncode == 0, on_dask.stderr
    assert on_dask.stdout.strip().endswith("dask loaded")
    assert "[tcp://127.0.0.1:" in on_dask.stderr
    assert_same_files(
        _run_files(str(tmp_path / "a" / "four")), _run_files(str(tmp_path / "b" / "four"))
    )
    bad = subprocess.run(
        [sys.executable, "-c", code, "import", str(four), "--logdir", str(tmp_path / "c")]
        + ["--dask", "nowhere"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "tessera-prof import: error: bad Dask scheduler 'nowhere': use tcp://host:8786 or local:N"
    )


# Cross-rank analyses: map over ranks, reduce by instance key; Dask and local agree ------------


@pytest.fixture(scope="module")
def dask_run(synth16, cluster, tmp_path_factory) -> str:
    """The 16-rank run imported on the cluster (with its derived index)."""
    logdir = tmp_path_factory.mktemp("dask")
    return import_traces([synth16], str(logdir), "r", dask=cluster.scheduler_address).run_dir


def test_collectives_on_dask_equal_the_local_ones_and_find_the_injected_straggler(
    local_run, cluster
):
    from tessera import analyze

    local = analyze.collectives(trace=local_run)
    on_dask = analyze.collectives(trace=local_run, dask=cluster.scheduler_address)
    pd_testing = pytest.importorskip("pandas").testing
    pd_testing.assert_frame_equal(local, on_dask)
    pd_testing.assert_frame_equal(local.attrs["mismatches"], on_dask.attrs["mismatches"])
    pd_testing.assert_frame_equal(local.attrs["stragglers"], on_dask.attrs["stragglers"])
    # 48 NCCL kernels per rank over 3 steps; every instance complete, rank 11 last in each.
    assert len(local) == 48 and local["complete"].all() and local["group_size"].eq(16).all()
    assert set(local["straggler_rank"]) == {STRAGGLER}
    worst = local.attrs["stragglers"].iloc[0]
    assert (worst["rank"], worst["n_straggler"], worst["n_instances"]) == (STRAGGLER, 48, 48)
    # The others waited about 2 ms each (synth_ranks' default delay) for it, in every instance.
    assert (local["max_wait_ns"] > 2_000_000).all()
    assert local.attrs["stragglers"].set_index("rank").loc[STRAGGLER, "wait_ns"] == 0


def test_the_dask_import_writes_the_derived_index_a_local_build_makes(local_run, dask_run):
    from tessera_tb.backend import cross_rank
    from tessera_tb.trace.reader import open_run

    written = cross_rank.read_run_summary(open_run(dask_run))
    assert written is not None
    built = cross_rank.build_run_summary(open_run(local_run))
    assert written.key == built.key and written.num_kernels == built.num_kernels == 16 * 48
    for name, table in built.tables.items():
        pytest.importorskip("pandas").testing.assert_frame_equal(written.tables[name], table)
    rank_step = built.tables["rank_step"]
    assert len(rank_step) == 16 * 3
    assert (rank_step.loc[rank_step["rank"] == STRAGGLER, "n_straggler"] == 16).all()
