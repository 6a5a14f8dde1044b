"""Check `tessera-prof counters` on a GPU with third-party models, in one command:

    python bench/gpu_counters_check.py --out /tmp/counters_check

For each of two models, Hugging Face `transformers` GPT-2 from a config (n_layer 4, n_embd
512, n_head 8, seq 256, batch 8, random weights) and timm ResNet-50 (batch 32, 224x224,
channels_last): train 6 steps under `profile.session` (bf16 autocast, fused AdamW, regions
forward/backward/optimizer, schedule wait 1 warmup 1 active 3: steps 2, 3, 4 recorded), then
run `tessera-prof counters RUN -- python bench/gpu_counters_check.py train ...` (the same
training command; its session sees ncu and records NVTX markers only), which profiles one
instance of every distinct kernel of step 3. Prints the estimate, ncu's progress, how long
each part took, what got counters (per distinct kernel), and `CHECK ok` / `CHECK FAILED`
lines: every distinct kernel of step 3 has counters, the records carry them (`measured` /
`measured:same-kernel-instance`), Stalls (shares sum to 100 %), Divergence and measured
roofline points appear, the session's NVTX region ranges reached ncu.

Writes into --out (5 files): `<model>.tessera.zip` (the run with its counters, packed) and
`<model>_counters_raw.csv.gz` (ncu's raw-page CSV) for both models, and
`gpu_counters_check.log`. Needs torch with CUDA, transformers, timm, Nsight Compute's `ncu`
on PATH, and this repository (run from its root). About 5-7 minutes on an H100.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (os.path.join(ROOT, "capture"), ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

STEPS = 6
COUNTERS_TIMEOUT_S = {"gpt2": 220, "resnet50": 300}
FAILED: list[str] = []
LOG: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LOG.append(line)


def check(ok: bool, what: str) -> None:
    say(f"CHECK {'ok' if ok else 'FAILED'}: {what}")
    if not ok:
        FAILED.append(what)


# ---- the training program (also what runs under ncu) -----------------------------------


def train(model_name: str, run_dir: str, steps: int) -> None:
    import torch
    import torch.nn.functional as F

    from tessera import profile

    torch.manual_seed(0)
    dev = torch.device("cuda")
    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=4, n_embd=512, n_head=8, n_positions=256, vocab_size=50257)
        model = GPT2LMHeadModel(cfg).to(dev)

        def batch():
            idx = torch.randint(0, cfg.vocab_size, (8, 256), device=dev)
            return idx, idx

        def loss_fn(x, y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(input_ids=x, labels=y).loss
    else:
        import timm

        model = timm.create_model("resnet50", pretrained=False, num_classes=1000).to(dev)
        model = model.to(memory_format=torch.channels_last)

        def batch():
            x = torch.randn(32, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
            return x, torch.randint(0, 1000, (32,), device=dev)

        def loss_fn(x, y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return F.cross_entropy(model(x).float(), y)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    with profile.session(
        activities=["cpu", "gpu", "memcpy", "memory", "power"],
        record_shapes=True,
        schedule=profile.schedule(wait=1, warmup=1, active=3),
        tensorboard_dir=run_dir,
    ) as sess:
        for _ in range(steps):
            x, y = batch()
            with profile.region("forward"):
                loss = loss_fn(x, y)
            with profile.region("backward"):
                loss.backward()
            with profile.region("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            sess.step()
    torch.cuda.synchronize()
    print(f"{model_name}: {steps} steps; markers_only={sess.markers_only}", flush=True)


# ---- the check --------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [os.path.join(ROOT, "capture"), ROOT, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _train_cmd(model_name: str, run_dir: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "train", "--model", model_name,
            "--run", run_dir, "--steps", str(STEPS)]  # fmt: skip


def _stream(cmd: list[str], timeout_s: float, prefix: str) -> tuple[int, float, list[str]]:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=ROOT,
        start_new_session=True,  # so that a timeout ends ncu and the program too
    )
    lines = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            say(prefix + line)
            if time.monotonic() - t0 > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)
                say(f"{prefix}(killed after {timeout_s:.0f} s)")
                break
    finally:
        rc = proc.wait()
    return rc, time.monotonic() - t0, lines


def check_model(model_name: str, work: str, out: str) -> None:
    from tessera_tb.trace import open_run

    say(f"==== {model_name} ====")
    run_dir = os.path.join(work, model_name)
    rc, took, _ = _stream(_train_cmd(model_name, run_dir), 180, "  [train] ")
    check(rc == 0, f"{model_name}: trained under profile.session in {took:.1f} s")
    if rc != 0:
        return
    run = open_run(run_dir)
    check(run.steps == [2, 3, 4], f"{model_name}: run has steps {run.steps} (want 2, 3, 4)")
    csv_path = os.path.join(work, f"{model_name}_counters_raw.csv")
    cmd = [sys.executable, "-m", "tessera.cli.main", "counters", run_dir, "--save-csv", csv_path,
           "-v", "--", *_train_cmd(model_name, run_dir)]  # fmt: skip
    say("  $ " + " ".join(cmd))
    rc, took, lines = _stream(cmd, COUNTERS_TIMEOUT_S[model_name], "  [counters] ")
    check(rc == 0, f"{model_name}: tessera-prof counters exit {rc}, took {took:.1f} s")
    check(
        bool(lines) and lines[0].startswith("profiling "),
        f"{model_name}: the estimate is printed before ncu starts",
    )
    check(any(" kernel 1/" in ln for ln in lines), f"{model_name}: progress per kernel is printed")
    check(
        any("tessera capture: running under Nsight Compute" in ln for ln in lines)
        and any("markers_only=Nsight Compute" in ln for ln in lines),
        f"{model_name}: under ncu the session recorded markers only and said so in one line",
    )
    if rc != 0:
        return
    report_counters(model_name, run_dir, csv_path)
    rc = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "pack", run_dir, "-o",
         os.path.join(out, f"{model_name}.tessera.zip")],
        env=_env(), cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    check(rc.returncode == 0, f"{model_name}: packed ({rc.stderr.strip()[-200:]})")
    with (
        open(csv_path, "rb") as src,
        gzip.open(os.path.join(out, f"{model_name}_counters_raw.csv.gz"), "wb") as dst,
    ):
        shutil.copyfileobj(src, dst)


def report_counters(model_name: str, run_dir: str, csv_path: str) -> None:
    """What got counters, and the checks on the views (reads the run and the CSV only)."""
    import numpy as np

    from tessera import analyze
    from tessera.profile.records import kernel_records
    from tessera_tb.importers.ncu_csv import read_ncu_csv
    from tessera_tb.importers.ncu_selection import kernel_counter_coverage, plan_counters
    from tessera_tb.trace import open_run

    run = open_run(run_dir)
    plan = plan_counters(run, "worker0")
    names_run, missing = kernel_counter_coverage(run_dir, "worker0")
    check(
        not missing,
        f"{model_name}: {len(names_run) - len(missing)} of {len(names_run)} distinct kernels of "
        f"step {plan.steps[0]} ({plan.step_launches} launches) have their own counters",
    )
    recs = [r for r in kernel_records(run) if r["kind"] == "kernel"]
    caps = [r["capabilities"].get("sm_occupancy", "") for r in recs]
    measured = sum(c == "measured" for c in caps)
    same = sum(c == "measured:same-kernel-instance" for c in caps)
    check(
        measured + same == len(recs) and measured > 0,
        f"{model_name}: {len(recs)} kernel records: {measured} measured, {same} "
        "measured:same-kernel-instance (sm_occupancy)",
    )
    stalls = analyze.stalls(trace=run_dir, group_by="kernel")
    ok = bool(stalls.attrs.get("available")) and len(stalls) > 0
    sums = stalls[stalls.category != "not a stall"].groupby("kernel_name").share_pct.sum()
    check(
        ok and bool(np.allclose(sums.to_numpy(), 100.0, atol=1e-6)),
        f"{model_name}: Stalls for {sums.size} kernels, shares sum to 100 %",
    )
    div = analyze.divergence(trace=run_dir, threshold=0.0)
    check(len(div) > 0, f"{model_name}: Divergence lists {len(div)} kernels")
    roof = analyze.roofline(trace=run_dir)
    meas = roof[roof.flops_source.isin(["measured", "partial"])]
    check(len(meas) > 0, f"{model_name}: {len(meas)} measured roofline points")
    table = read_ncu_csv(csv_path)
    pushpop = [c for c in table.text if "Push/Pop_Range" in c]
    regions = {str(v) for c in pushpop for v in table.text[c] if v}
    check(
        any("forward" in v for v in regions),
        f"{model_name}: the session's region ranges reach ncu (push/pop column)",
    )
    say(f"  kernels by time in step {plan.steps[0]} (name, launches, occupancy, top stall, "
        "divergence, TFLOP/s):")  # fmt: skip
    top = stalls[stalls.category != "not a stall"].drop_duplicates("kernel_name")
    top = top.set_index("kernel_name")
    occ = {}
    for r in recs:
        if r["step"] == plan.steps[0]:
            occ.setdefault(r["name"], r["sm_occupancy"])
    for d in sorted(plan.distinct, key=lambda d: -d.dur_ns)[:15]:
        t = top.loc[d.name] if d.name in top.index else None
        stall = f"{t.reason} {t.share_pct:.0f}%" if t is not None else "-"
        dv = div[div.kernel_name == d.name].warp_divergence_pct
        rf = roof[roof.kernel_name == d.name].flops_per_s
        say(
            f"    {d.name[:60]:60s} x{d.launches:<3d} occ {occ.get(d.name) or float('nan'):5.1f}% "
            f"{stall:24s} div {dv.iloc[0] if len(dv) else float('nan'):5.2f}% "
            f"{(rf.iloc[0] / 1e12) if len(rf) else float('nan'):7.2f} TFLOP/s"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="mode")
    t = sub.add_parser("train", help="the training program (runs under the session or ncu)")
    t.add_argument("--model", choices=["gpt2", "resnet50"], required=True)
    t.add_argument("--run", required=True)
    t.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--out", help="directory for the packed runs, CSVs and log")
    p.add_argument("--models", default="gpt2,resnet50")
    args = p.parse_args()
    if args.mode == "train":
        train(args.model, args.run, args.steps)
        return 0
    if not args.out:
        p.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.monotonic()
    say(f"ncu: {shutil.which('ncu')}")
    with tempfile.TemporaryDirectory(prefix="counters-check-") as work:
        for m in args.models.split(","):
            try:
                check_model(m, work, args.out)
            except Exception as exc:  # report and go on with the next model
                check(False, f"{m}: {type(exc).__name__}: {exc}")
    say(f"total {time.monotonic() - t0:.1f} s; {len(FAILED)} check(s) failed")
    with open(os.path.join(args.out, "gpu_counters_check.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
