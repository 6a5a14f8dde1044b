"""The sharing verbs of tessera-prof: pack, unpack, html and diff; exit 0 on success, 1 for a
failed --fail-if-slower gate, 2 with one line on stderr for bad input."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import zipfile

import pytest

from tessera.cli.main import main
from tessera_tb.proto import trace_pb2 as pb
from tests.conftest import DEMO_RUNS

DDP = os.path.join(DEMO_RUNS, "ddp_gpt_2rank")
FSDP = os.path.join(DEMO_RUNS, "fsdp_gpt_4rank")


def _one_line_error(capsys, code: int, *needles: str) -> str:
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


def _median_step_ms(run_dir: str) -> float:
    root = os.path.join(run_dir, "plugins", "tessera")
    spans = []
    for w in os.listdir(root):
        meta = pb.WorkerMeta.FromString(open(os.path.join(root, w, "meta.pb"), "rb").read())
        spans += [(e.end_ns - e.start_ns) / 1e6 for e in meta.steps]
    return statistics.median(spans)


def test_pack_then_unpack_into_a_logdir_gives_the_run_back(tmp_path, capsys):
    out = str(tmp_path / "ddp.tessera.zip")
    assert main(["pack", DDP, "-o", out]) == 0
    assert "-> " + out in capsys.readouterr().out
    assert main(["unpack", out, "--logdir", str(tmp_path / "logs")]) == 0
    got = tmp_path / "logs" / "ddp_gpt_2rank"
    for dirpath, _, names in os.walk(DDP):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), DDP)
            assert (got / rel).read_bytes() == open(os.path.join(dirpath, n), "rb").read()
    assert main(["unpack", out, "-o", str(got)]) == 2  # exists
    capsys.readouterr()


def test_diff_fails_the_gate_when_b_is_slower_by_more_than_the_threshold(capsys):
    a, b = _median_step_ms(DDP), _median_step_ms(FSDP)
    slower_pct = 100 * (b - a) / a
    assert main(["diff", DDP, FSDP, "--fail-if-slower", "5"]) == 1
    captured = capsys.readouterr()
    assert f"median step: A {a:.3f} ms, B {b:.3f} ms: B is {slower_pct:.2f}% slower" in captured.out
    assert f"B is {slower_pct:.2f}% slower than A, over the 5% allowed" in captured.err
    new = captured.out.split("== new and vanished kernels")[1].split("==")[0]
    for kernel in ("AllGather_RING_LL", "ReduceScatter_Sum_f32_RING_LL", "SendRecv", "Broadcast"):
        line = next(x for x in new.splitlines() if f"ncclDevKernel_{kernel}" in x)
        assert line.split()[0] == "new"
    line = next(x for x in new.splitlines() if "ncclDevKernel_AllReduce" in x)
    assert line.split()[0] == "vanished"
    # Under the threshold, or faster, or without a gate: exit 0.
    assert main(["diff", DDP, FSDP, "--fail-if-slower", f"{slower_pct + 1:.1f}"]) == 0
    assert main(["diff", FSDP, DDP, "--fail-if-slower", "5"]) == 0
    assert main(["diff", DDP, FSDP]) == 0
    capsys.readouterr()


def test_diff_compares_chosen_steps_and_bundles(tmp_path, capsys):
    bundle = str(tmp_path / "fsdp.tessera.zip")
    assert main(["pack", FSDP, "-o", bundle, "--steps", "5"]) == 0
    assert main(["diff", FSDP, bundle, "--steps-a", "5", "--fail-if-slower", "0"]) == 0
    assert "B is as fast" in capsys.readouterr().out


def test_html_writes_one_file_that_loads_nothing_else(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["html", DDP, "-o", str(out), "--steps", "5-6"]) == 0
    text = out.read_text()
    assert "src=" not in text.split('<script type="application/json"')[0].split("</head>")[1]
    assert "<link" not in text and "http://" not in text.split("<script>")[0]
    data = text.split('<script type="application/json" id="tessera-data">')[1].split("</script>")[0]
    payload = json.loads(data)
    assert payload["selection"] == {"workers": ["rank0", "rank1"], "steps": "5,6"}
    capsys.readouterr()


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    escape = tmp_path / "escape.tessera.zip"
    with zipfile.ZipFile(escape, "w") as zf:
        zf.writestr("../evil", b"x")
        zf.writestr(
            "tessera-bundle.json",
            json.dumps(
                {
                    "format": "tessera-bundle",
                    "format_version": 1,
                    "files": [
                        {
                            "path": "../evil",
                            "size_bytes": 1,
                            "sha256": hashlib.sha256(b"x").hexdigest(),
                        }
                    ],
                }
            ),
        )
    code = main(["unpack", str(escape), "--logdir", str(tmp_path / "logs")])
    _one_line_error(capsys, code, str(escape), "escapes the bundle")
    assert not (tmp_path / "logs").exists() and not (tmp_path / "evil").exists()
    big = str(tmp_path / "ddp.tessera.zip")
    assert main(["pack", DDP, "-o", big]) == 0
    capsys.readouterr()
    code = main(["unpack", big, "-o", str(tmp_path / "r"), "--max-bytes", "100000"])
    _one_line_error(capsys, code, big, "over the limit")
    assert not (tmp_path / "r").exists()
    _one_line_error(capsys, main(["pack", str(tmp_path / "nope"), "-o", big + "2"]), "nope")
    _one_line_error(capsys, main(["pack", DDP, "-o", big]), "exists")
    _one_line_error(capsys, main(["html", str(tmp_path / "nope"), "-o", "x.html"]), "nope")
    _one_line_error(capsys, main(["diff", DDP, str(escape)]), "escapes the bundle")
    _one_line_error(capsys, main(["diff", DDP, FSDP, "--workers-a", "rank7"]), "rank7")
    _one_line_error(capsys, main(["html", DDP, "-o", str(tmp_path / "x.html"), "--steps", "99"]))
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize("verb", ["pack", "unpack", "html", "diff"])
def test_every_sharing_verb_has_help(verb, capsys):
    with pytest.raises(SystemExit) as exc:
        main([verb, "--help"])
    assert exc.value.code == 0
    assert "Example" in capsys.readouterr().out
