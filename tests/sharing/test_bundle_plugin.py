"""A bundle dropped into a logdir is a run of the plugin, read in place, with the analysis
results of the directory it was packed from; a bad bundle is one run with an error."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import zipfile

import pytest
from tensorboard import errors

from tessera_tb.backend import plugin_data
from tessera_tb.backend.run_index import RunIndex
from tessera_tb.trace import bundle
from tests.conftest import DEMO_RUNS, run_links_named

VIEWS = [
    ("overview", {}),
    ("topk", {"table": "operators"}),
    ("topk", {"table": "kernels", "k": "500"}),
    ("collectives", {"metric": "busbw"}),
    ("collectives", {"metric": "wait"}),
    ("roofline", {"group": "kernel"}),
    ("stalls", {"group": "kernel"}),
    ("memory", {}),
    ("timeline", {"worker": "rank2", "steps": "5"}),
    ("event", {"worker": "rank1", "step": "6", "row": "100"}),
]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> str:
    """The FSDP and DDP demo runs as directories, the FSDP run also as a bundle (and in a
    subdirectory), plus a bundle with a path escape and one with a tampered step file."""
    root = tmp_path_factory.mktemp("bundle_logdir")
    for run in ("fsdp_gpt_4rank", "ddp_gpt_2rank"):
        shutil.copytree(os.path.join(DEMO_RUNS, run), root / run)
    bundle.pack_run(str(root / "fsdp_gpt_4rank"), str(root / "fsdp.tessera.zip"))
    os.makedirs(root / "group")
    shutil.copy(root / "fsdp.tessera.zip", root / "group" / "copy.tessera.zip")
    with zipfile.ZipFile(root / "escape.tessera.zip", "w") as zf:
        zf.writestr("../../outside.pb", b"x")
        zf.writestr("tessera-bundle.json", "{}")
    with zipfile.ZipFile(root / "fsdp.tessera.zip") as src:
        members = {n: src.read(n) for n in src.namelist()}
    step = "plugins/tessera/rank3/step_00000005.pb"
    members[step] = members[step][:-1] + bytes([members[step][-1] ^ 0xFF])
    with zipfile.ZipFile(root / "tampered.tessera.zip", "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    return str(root)


@pytest.fixture(scope="module")
def index(logdir) -> RunIndex:
    return RunIndex(logdir, refresh_s=60)


def test_bundles_are_listed_as_runs_and_a_bad_one_carries_an_error_naming_it(index):
    runs = {r["name"]: r for r in plugin_data.runs_listing(index)["runs"]}
    assert sorted(runs) == [
        "ddp_gpt_2rank",
        "escape.tessera.zip",
        "fsdp.tessera.zip",
        "fsdp_gpt_4rank",
        "group/copy.tessera.zip",
        "tampered.tessera.zip",
    ]
    assert runs["escape.tessera.zip"]["error"] == (
        "escape.tessera.zip: member '../../outside.pb' escapes the bundle or has empty path parts"
    )
    for good in ("fsdp.tessera.zip", "group/copy.tessera.zip", "tampered.tessera.zip"):
        assert runs[good]["error"] is None
        assert runs[good]["workers"] == runs["fsdp_gpt_4rank"]["workers"]
    with pytest.raises(Exception, match="escapes the bundle"):
        plugin_data.resolve_run(index, "escape.tessera.zip")


@pytest.mark.parametrize(("view", "params"), VIEWS)
def test_every_view_of_the_bundle_is_the_view_of_its_directory(index, view, params):
    from_bundle = json.loads(
        plugin_data.view_json(index, view, {"run": "fsdp.tessera.zip", **params})
    )
    from_dir = json.loads(plugin_data.view_json(index, view, {"run": "fsdp_gpt_4rank", **params}))
    if view == "stalls":  # the Nsight Compute command names the run's path
        first = from_bundle.pop("collect_command").splitlines()[0]
        assert first.startswith("tessera-prof counters ") and "fsdp.tessera.zip --" in first
        first = from_dir.pop("collect_command").splitlines()[0]
        assert first.startswith("tessera-prof counters ") and "fsdp_gpt_4rank --" in first
    assert run_links_named(from_bundle, "fsdp.tessera.zip") == run_links_named(
        from_dir, "fsdp_gpt_4rank"
    )
    assert from_bundle["errors"] == []


def test_the_header_and_the_compare_route_agree_for_bundle_and_directory(index):
    headers = [
        plugin_data.run_header(index, index.entry(n))
        for n in ("fsdp.tessera.zip", "fsdp_gpt_4rank")
    ]
    assert {**headers[0], "run": ""} == {**headers[1], "run": ""}
    same = json.loads(
        plugin_data.compare_json(index, {"baseline": "fsdp_gpt_4rank", "run": "fsdp.tessera.zip"})
    )
    assert same["slowdown_pct"] == 0 and same["errors"] == []
    kd = dict(
        zip(same["tables"]["kernel_deltas"]["columns"], same["tables"]["kernel_deltas"]["data"])
    )
    assert set(kd["status"]) == {"both"} and set(kd["impact_ns"]) == {0}
    via_bundle, via_dir = (
        json.loads(plugin_data.compare_json(index, {"baseline": "ddp_gpt_2rank", "run": run}))
        for run in ("fsdp.tessera.zip", "fsdp_gpt_4rank")
    )
    runs_b, runs_d = via_bundle["tables"].pop("runs"), via_dir["tables"].pop("runs")
    assert runs_b["data"][1][1] == "fsdp.tessera.zip" and runs_d["data"][1][1] == "fsdp_gpt_4rank"
    assert via_bundle["tables"] == via_dir["tables"]
    assert via_bundle["slowdown_pct"] == via_dir["slowdown_pct"] > 0


def test_a_tampered_step_in_a_bundle_is_left_out_of_the_view_and_the_rest_is_shown(index):
    got = json.loads(plugin_data.view_json(index, "overview", {"run": "tampered.tessera.zip"}))
    assert [(e["worker"], e["step"]) for e in got["errors"]] == [("rank3", 5)]
    assert "does not match its SHA-256" in got["errors"][0]["error"]
    steps = dict(zip(got["tables"]["breakdown"]["columns"], got["tables"]["breakdown"]["data"]))
    assert len(steps["step"]) == 4 * 3 - 1
    listing = {r["name"]: r for r in plugin_data.runs_listing(index)["runs"]}
    rank3 = next(w for w in listing["tampered.tessera.zip"]["workers"] if w["name"] == "rank3")
    assert "SHA-256" in next(s for s in rank3["steps"] if s["step"] == 5)["error"]


def test_a_bundle_over_the_size_limit_is_an_error_for_that_run_only(tmp_path, monkeypatch):
    shutil.copytree(os.path.join(DEMO_RUNS, "gpt_1gpu"), tmp_path / "gpt_1gpu")
    bundle.pack_run(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"), str(tmp_path / "ddp.tessera.zip"))
    monkeypatch.setattr(bundle, "DEFAULT_LIMITS", bundle.BundleLimits(max_total_bytes=100_000))
    runs = {r["name"]: r for r in plugin_data.runs_listing(RunIndex(str(tmp_path), 60))["runs"]}
    assert runs["ddp.tessera.zip"]["error"].startswith(
        "ddp.tessera.zip: holds more than 100,000 bytes uncompressed, over the limit"
    )
    assert runs["gpt_1gpu"]["error"] is None


def test_the_compare_route_needs_a_baseline_and_its_tables_download_as_csv(index):
    with pytest.raises(errors.InvalidArgumentError, match="missing parameter: baseline"):
        plugin_data.compare_json(index, {"run": "fsdp.tessera.zip"})
    with pytest.raises(errors.NotFoundError, match="no run named 'nope'"):
        plugin_data.compare_json(index, {"run": "fsdp.tessera.zip", "baseline": "nope"})
    args = {
        "view": "compare",
        "table": "kernel_changes",
        "run": "fsdp.tessera.zip",
        "baseline": "ddp_gpt_2rank",
    }
    body, name = plugin_data.table_csv(index, args)
    assert name == "fsdp.tessera.zip_compare_kernel_changes.csv"
    table = list(csv.DictReader(io.StringIO(body.decode())))
    status = {(r["kernel"], r["op"]): r["status"] for r in table}
    assert status[("ncclDevKernel_AllGather_RING_LL", "record_param_comms")] == "new"
    assert status[("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "record_param_comms")] == "vanished"
    assert set(status.values()) == {"new", "vanished"}
