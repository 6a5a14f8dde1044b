"""The guide's examples on a real GPU: a session with no step calls, then `tessera-prof --pid`.

    PYTHONPATH=capture:. python bench/gpu_guide_check.py --out /tmp/guide_check
    PYTHONPATH=capture:. python bench/gpu_guide_check.py --out /tmp/guide_check --device cpu

1. Trains a Hugging Face GPT-2 built from a config (4 layers, 512 wide, 8 heads, 256
   positions; batch 8 x 256 tokens; bf16 autocast; fused AdamW) for 12 iterations inside
   `profile.session(tensorboard_dir=...)` with no `sess.step()` call: each optimizer step
   ends a step, so the default schedule records steps 2-4. Prints the steps, the kernels per
   step, the session's exit line and a few records by attribute.
2. Starts a second, plain training process (no session) and runs the guide's CLI line
   against it: `tessera-prof --pid PID --sample-ms 10 --gpu --mem --tc --collectives
   --export trace.json --summary perf.csv`; prints the summary CSV.
3. Packs the run (`tessera-prof pack`) and leaves in --out: run.tessera.zip, trace.json,
   perf.csv, guide_check.log (4 files).

Each check prints `CHECK ok` or `CHECK FAILED`; the exit status is 1 if any failed. Needs
torch, transformers and nvidia-ml-py (no OpenTelemetry). About a minute on an H100.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (os.path.join(ROOT, "capture"), ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

FAILED: list[str] = []
LOG: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    LOG.append(text)


def check(ok: bool, what: str) -> None:
    say(f"CHECK {'ok' if ok else 'FAILED'}: {what}")
    if not ok:
        FAILED.append(what)


def _env() -> dict:
    env = dict(os.environ)
    parts = [os.path.join(ROOT, "capture"), ROOT, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return env


def build(device: str, small: bool):
    """GPT-2 from a config (random weights), fused AdamW, one training step function."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    n_pos = 64 if small else 256
    cfg = GPT2Config(
        n_layer=2 if small else 4, n_embd=128 if small else 512, n_head=8,
        n_positions=n_pos, vocab_size=1024 if small else 50257,
    )  # fmt: skip
    model = GPT2LMHeadModel(cfg).to(device)
    cuda = device.startswith("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    batch = 2 if small else 8
    ids = torch.randint(0, cfg.vocab_size, (batch, n_pos), device=device)

    def train_step():
        # bf16 autocast on the GPU (the guide's setting); float32 on the CPU, where bf16 is slow.
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return train_step


def train_only(args) -> None:
    """The plain training process that `tessera-prof --pid` samples (no session)."""
    step = build(args.device, args.device == "cpu")
    end = time.monotonic() + args.train_seconds
    while time.monotonic() < end:
        step()


def field(rec, name: str):
    """A record's field by attribute (records as objects), else by key."""
    if hasattr(rec, name):
        return getattr(rec, name)
    if isinstance(rec, dict):
        return rec.get(name, rec.get({"kernel_name": "name", "stream_id": "stream"}.get(name)))
    return None


def session_check(args, work: str) -> str:
    import torch

    from tessera import profile
    from tessera_tb.trace import open_run

    say("== profile.session(tensorboard_dir=...) with no sess.step() call, 12 iterations")
    step = build(args.device, args.device == "cpu")
    run_dir = os.path.join(work, "runs", "exp1")
    err = io.StringIO()
    real_err = sys.stderr

    class Tee(io.TextIOBase):
        def write(self, s):
            err.write(s)
            return real_err.write(s)

        def flush(self):
            real_err.flush()

    t0 = time.perf_counter()
    sys.stderr = Tee()
    try:
        with profile.session(tensorboard_dir=run_dir) as sess:
            for _ in range(12):
                step()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
    finally:
        sys.stderr = real_err
    say(f"12 iterations in {time.perf_counter() - t0:.2f} s")
    exit_lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("tessera capture:")]
    say("exit line: " + (exit_lines[-1] if exit_lines else "(none)"))
    check(len(exit_lines) == 1 and "recorded steps 2-4" in exit_lines[0], "one exit line: 2-4")
    check(getattr(sess, "step_source", "") == "optimizer", "steps came from optimizer.step")
    run = open_run(run_dir)
    say(f"steps written: {run.steps}")
    check(run.steps == [2, 3, 4], "the default schedule's active steps 2, 3, 4 are written")
    for s in run.steps:
        df = run.load_step("worker0", s).frame()
        kernels = int((df.kind == "kernel").sum())
        opt_ops = int(df.name.str.startswith("Optimizer.step#").sum())
        say(f"step {s}: {len(df)} events, {kernels} kernels, {opt_ops} Optimizer.step op(s)")
        if args.device.startswith("cuda"):
            check(kernels > 50, f"step {s} has kernels")
        check(opt_ops >= 1, f"step {s} holds its optimizer step")
    recs = list(sess.records())
    kernels = [r for r in recs if field(r, "kind") == "kernel"]
    say(f"{len(recs)} records, {len(kernels)} kernel records; the first three kernels:")
    for rec in kernels[:3]:
        say(
            "  "
            + ", ".join(
                f"{n}={field(rec, n)!r}"
                for n in (
                    "kernel_name",
                    "stream_id",
                    "start_us",
                    "end_us",
                    "sm_occupancy",
                    "tc_util_pct",
                    "step",
                )
            )  # fmt: skip
        )
    if args.device.startswith("cuda"):
        check(len(kernels) > 0, "sess.records() yields kernel records")
    return run_dir


def attach_check(args, work: str) -> tuple[str, str]:
    say("\n== tessera-prof --pid PID --sample-ms 10 --gpu --mem --tc --collectives")
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--train-only", "--device", args.device,
         "--train-seconds", str(args.train_seconds), "--out", work],
        env=_env(),
    )  # fmt: skip
    time.sleep(4)  # let it create its CUDA context
    trace, summary = os.path.join(work, "trace.json"), os.path.join(work, "perf.csv")
    cmd = [sys.executable, "-m", "tessera.cli.main", "--pid", str(child.pid), "--sample-ms",
           "10", "--gpu", "--mem", "--tc", "--collectives", "--export", trace,
           "--summary", summary]  # fmt: skip
    say("$ " + " ".join(cmd[1:]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=150)
    child.wait(timeout=60)
    say(done.stdout.strip())
    say(done.stderr.strip())
    if args.device == "cpu":
        check(done.returncode == 2 and not os.path.exists(summary), "no NVML: exit 2, no file")
        return trace, summary
    check(done.returncode == 0, "tessera-prof --pid exits 0 when the process exits")
    if done.returncode == 0:
        with open(summary) as f:
            text = f.read()
        say(text)
        rows = list(csv.DictReader(io.StringIO(text)))
        names = {r["counter"] for r in rows}
        check({"power_w", "mem_used_bytes"} <= names, "summary has --gpu and --mem counters")
        tc = [r for r in rows if r["counter"] == "tc_util_pct"]
        check(
            bool(tc) and tc[0]["samples"] == "0" and "counters" in tc[0]["capability"],
            "tc_util_pct is null with its reason",
        )
        check(done.stderr.count("tc_util_pct") == 1, "the tc reason is said once on stderr")
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        check(sum(e.get("ph") == "C" for e in events) > 0, "trace.json has counter events")
    dead = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "--pid", "999999999", "--sample-ms", "10"],
        capture_output=True, text=True, env=_env(),
    )  # fmt: skip
    check(dead.returncode == 2 and len(dead.stderr.strip().splitlines()) == 1, "dead pid: exit 2")
    return trace, summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for the outputs (at most 4 files)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smaller model)")
    p.add_argument("--train-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--train-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.train_only:
        train_only(args)
        return 0
    if args.device == "cuda":
        args.device = "cuda:0"
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="guide-check-")
    t0 = time.perf_counter()
    try:
        run_dir = session_check(args, work)
    except Exception as exc:
        check(False, f"session example raised {type(exc).__name__}: {exc}")
        run_dir = None
    trace, summary = attach_check(args, work)
    if run_dir is not None:
        bundle = os.path.join(args.out, "run.tessera.zip")
        packed = subprocess.run(
            [sys.executable, "-m", "tessera.cli.main", "pack", run_dir, "-o", bundle,
             "--overwrite"],
            capture_output=True, text=True, env=_env(),
        )  # fmt: skip
        say(packed.stdout.strip() + packed.stderr.strip())
        check(packed.returncode == 0, "tessera-prof pack")
    for path in (trace, summary):
        if os.path.exists(path):
            shutil.copy(path, os.path.join(args.out, os.path.basename(path)))
    say(f"\n{len(FAILED)} check(s) failed; {time.perf_counter() - t0:.1f} s in all")
    with open(os.path.join(args.out, "guide_check.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
