"""Bundles: a run packed into one zip reads back exactly, in place or unpacked, and a bundle
that is hostile or damaged is refused with an error naming it, before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import bundle
from tessera_tb.trace.bundle import BundleError, BundleLimits
from tessera_tb.trace.reader import open_run
from tests.conftest import DEMO_RUNS

FSDP = os.path.join(DEMO_RUNS, "fsdp_gpt_4rank")


def _tree(run_dir: str) -> dict[str, bytes]:
    """Every file under a directory: relative path -> bytes."""
    out = {}
    for dirpath, _, names in os.walk(run_dir):
        for n in names:
            path = os.path.join(dirpath, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, run_dir).replace(os.sep, "/")] = f.read()
    return out


@pytest.fixture(scope="module")
def fsdp_bundle(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("bundles") / "fsdp.tessera.zip")
    bundle.pack_run(FSDP, path)
    return path


def _write_zip(path, members: dict[str, bytes], manifest: dict | None = None, **info) -> str:
    """A zip with these members and a manifest listing them (or the one given)."""
    if manifest is None:
        manifest = {
            "format": "tessera-bundle",
            "format_version": 1,
            "run": "x",
            "files": [
                {"path": n, "size_bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                for n, d in members.items()
            ],
        }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zi = zipfile.ZipInfo(name)
            zi.compress_type = zipfile.ZIP_DEFLATED
            if name in info:
                zi.external_attr = info[name]
            zf.writestr(zi, data)
        zf.writestr("tessera-bundle.json", json.dumps(manifest))
    return str(path)


def test_a_bundle_holds_every_file_of_the_run_with_its_size_and_sha256(fsdp_bundle):
    run_files = _tree(FSDP)
    with zipfile.ZipFile(fsdp_bundle) as zf:
        manifest = json.loads(zf.read("tessera-bundle.json"))
        members = {n: zf.read(n) for n in zf.namelist() if n != "tessera-bundle.json"}
    assert members == run_files
    assert manifest["format"] == "tessera-bundle" and manifest["format_version"] == 1
    assert manifest["run"] == "fsdp_gpt_4rank"
    assert manifest["workers"] == ["rank0", "rank1", "rank2", "rank3"]
    assert manifest["steps"] == [4, 5, 6]
    assert {f["path"]: (f["size_bytes"], f["sha256"]) for f in manifest["files"]} == {
        p: (len(d), hashlib.sha256(d).hexdigest()) for p, d in run_files.items()
    }


def test_a_bundle_opens_in_place_with_the_steps_of_the_directory(fsdp_bundle):
    packed, plain = open_run(fsdp_bundle), open_run(FSDP)
    assert sorted(packed.workers) == sorted(plain.workers) and packed.steps == plain.steps
    for w in plain.workers:
        assert packed.worker(w).meta == plain.worker(w).meta
        for s in plain.steps:
            a, b = packed.load_step(w, s), plain.load_step(w, s)
            assert a.strings == b.strings and a.tracks == b.tracks
            for col in b.events:
                assert np.array_equal(a.events[col], b.events[col]), (w, s, col)


def test_a_chosen_subset_is_packed_with_its_index_and_scalars_cut_to_it(tmp_path):
    path = str(tmp_path / "part.tessera.zip")
    result = bundle.pack_run(FSDP, path, workers=["rank3", "rank1"], steps=[5, 6])
    run = open_run(path)
    assert sorted(run.workers) == ["rank1", "rank3"] and run.steps == [5, 6]
    full = pb.WorkerMeta.FromString(
        open(os.path.join(FSDP, "plugins/tessera/rank1/meta.pb"), "rb").read()
    )
    assert [(e.step, e.start_ns, e.end_ns) for e in run.worker("rank1").meta.steps] == [
        (e.step, e.start_ns, e.end_ns) for e in full.steps if e.step in (5, 6)
    ]
    bundle.unpack_bundle(path, str(tmp_path / "part"))
    events = sorted(f for f in os.listdir(tmp_path / "part") if f.startswith("events."))
    assert [e.rsplit(".", 1)[1] for e in events] == ["rank1", "rank3"]
    for e in events:
        loaded = list(EventFileLoader(str(tmp_path / "part" / e)).Load())
        assert {ev.step for ev in loaded if ev.HasField("summary")} == {5, 6}
    assert len(result.files) == 2 * (1 + 2) + 2


def test_unpacking_gives_back_the_run_directory_byte_for_byte(fsdp_bundle, tmp_path):
    dest = tmp_path / "logdir" / "fsdp"
    manifest = bundle.unpack_bundle(fsdp_bundle, str(dest))
    assert manifest["run"] == "fsdp_gpt_4rank"
    assert _tree(str(dest)) == _tree(FSDP)
    with pytest.raises(ValueError, match="exists"):
        bundle.unpack_bundle(fsdp_bundle, str(dest))


META = {"plugins/tessera/rank0/meta.pb": b"\x08\x01"}


@pytest.mark.parametrize(
    ("members", "attrs", "problem"),
    [
        ({"../evil.pb": b"x"}, {}, "escapes the bundle"),
        ({"plugins/../../evil.pb": b"x"}, {}, "escapes the bundle"),
        ({"/etc/evil": b"x"}, {}, "absolute path"),
        ({"C:/evil": b"x"}, {}, "absolute path"),
        ({"a\\..\\evil": b"x"}, {}, "backslash"),
        ({"link": b"/etc/passwd"}, {"link": (stat.S_IFLNK | 0o777) << 16}, "symbolic link"),
    ],
)
def test_a_member_that_escapes_or_links_out_is_refused_and_nothing_is_written(
    tmp_path, members, attrs, problem
):
    path = _write_zip(tmp_path / "bad.tessera.zip", {**META, **members}, **attrs)
    with pytest.raises(BundleError, match=problem) as err:
        open_run(path)
    assert str(err.value).startswith(path)
    dest = tmp_path / "out" / "run"
    with pytest.raises(BundleError, match=problem):
        bundle.unpack_bundle(path, str(dest))
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    assert not os.path.exists(tmp_path.parent / "evil.pb")


def test_a_member_that_does_not_match_its_sha256_is_refused_when_read(tmp_path, fsdp_bundle):
    with zipfile.ZipFile(fsdp_bundle) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if n != "tessera-bundle.json"}
        manifest = json.loads(zf.read("tessera-bundle.json"))
    step = "plugins/tessera/rank2/step_00000005.pb"
    data = bytearray(members[step])
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    members[step] = bytes(data)
    path = _write_zip(tmp_path / "tampered.tessera.zip", members, manifest)
    run = open_run(path)  # names and sizes match the manifest: the run opens
    run.load_step("rank2", 4)
    with pytest.raises(BundleError, match="rank2/step_00000005.pb' does not match its SHA-256"):
        run.load_step("rank2", 5)
    with pytest.raises(BundleError, match="SHA-256"):
        bundle.unpack_bundle(path, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ("no manifest", "has no tessera-bundle.json"),
        ("unlisted member", "is not in tessera-bundle.json"),
        ("missing member", "lists 'plugins/tessera/rank0/gone.pb', which the bundle lacks"),
        ("wrong size", "tessera-bundle.json says"),
        ("newer format", "bundle format 9 is newer"),
        ("not a zip", "not a readable zip file"),
        ("duplicate", "appears twice"),
    ],
)
def test_a_damaged_bundle_is_one_error_naming_it(tmp_path, case, problem):
    path = tmp_path / "damaged.tessera.zip"
    listed = {"path": "plugins/tessera/rank0/meta.pb", "size_bytes": 2, "sha256": "0" * 64}
    manifest = {"format": "tessera-bundle", "format_version": 1, "files": [listed]}
    if case == "no manifest":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("plugins/tessera/rank0/meta.pb", b"\x08\x01")
    elif case == "unlisted member":
        _write_zip(path, {**META, "extra.pb": b"x"}, manifest)
    elif case == "missing member":
        gone = {"path": "plugins/tessera/rank0/gone.pb", "size_bytes": 1, "sha256": "0" * 64}
        _write_zip(path, META, {**manifest, "files": [listed, gone]})
    elif case == "wrong size":
        _write_zip(path, META, {**manifest, "files": [{**listed, "size_bytes": 3}]})
    elif case == "newer format":
        _write_zip(path, META, {**manifest, "format_version": 9})
    elif case == "not a zip":
        path.write_bytes(b"PK\x03\x04 this is not a zip file")
    elif case == "duplicate":
        _write_zip(path, META, manifest)
        with zipfile.ZipFile(path, "a") as zf, pytest.warns(UserWarning):
            zf.writestr("plugins/tessera/rank0/meta.pb", b"\x08\x01")
    with pytest.raises(BundleError, match=problem) as err:
        bundle.files_for(str(path))
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_limits_refuse_too_many_bytes_files_and_a_zip_bomb(tmp_path, fsdp_bundle):
    sizes = [f["size_bytes"] for f in bundle.check_bundle(fsdp_bundle)["files"]]
    total = sum(sizes)
    with pytest.raises(BundleError, match="over the limit"):
        bundle.BundleFiles(fsdp_bundle, BundleLimits(max_total_bytes=total - 1))
    bundle.BundleFiles(fsdp_bundle, BundleLimits(max_total_bytes=total + 10_000)).close()
    with pytest.raises(BundleError, match="over the limit"):
        bundle.BundleFiles(fsdp_bundle, BundleLimits(max_file_bytes=max(sizes) - 1))
    with pytest.raises(BundleError, match="more than the limit of 5"):
        bundle.BundleFiles(fsdp_bundle, BundleLimits(max_files=5))
    # 64 MiB of zeros deflate to ~64 KB: a 1000x expansion, refused with the default limits.
    bomb = _write_zip(
        tmp_path / "bomb.tessera.zip", {**META, "events.out.tfevents.x": bytes(64 << 20)}
    )
    assert os.path.getsize(bomb) < 1 << 20
    with pytest.raises(BundleError, match="zip bomb"):
        open_run(bomb)


def test_a_bundle_replaced_on_disk_is_read_again(tmp_path):
    path = str(tmp_path / "r.tessera.zip")
    bundle.pack_run(FSDP, path, workers=["rank0"], steps=[4])
    assert open_run(path).steps == [4]
    bundle.pack_run(FSDP, path, workers=["rank0"], steps=[4, 5], overwrite=True)
    os.utime(path, ns=(1, 2))  # a different mtime even on a coarse clock
    assert open_run(path).steps == [4, 5]


def test_packing_refuses_unknown_workers_and_steps_and_an_existing_file(tmp_path, fsdp_bundle):
    with pytest.raises(ValueError, match="no worker 'rank9'"):
        bundle.pack_run(FSDP, str(tmp_path / "a.tessera.zip"), workers=["rank9"])
    with pytest.raises(ValueError, match=r"no step\(s\) \[9\]"):
        bundle.pack_run(FSDP, str(tmp_path / "a.tessera.zip"), steps=[9])
    with pytest.raises(ValueError, match="exists"):
        bundle.pack_run(FSDP, fsdp_bundle)
    assert os.listdir(tmp_path) == []


def test_a_bundle_packs_again_from_a_bundle(tmp_path, fsdp_bundle):
    again = str(tmp_path / "again.tessera.zip")
    bundle.pack_run(fsdp_bundle, again, steps=[6])
    with zipfile.ZipFile(again) as zf:
        data = zf.read("plugins/tessera/rank0/step_00000006.pb")
    with open(os.path.join(FSDP, "plugins/tessera/rank0/step_00000006.pb"), "rb") as f:
        assert data == f.read()
    assert json.loads(zipfile.ZipFile(again).read("tessera-bundle.json"))["run"] == "fsdp"
