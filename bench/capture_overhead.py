"""Step-time overhead of `profile.session` against bare `torch.profiler.profile`.

One process, one model, one loop body. Modes run in interleaved rounds (A B C D, A B C D, ...)
so that drift (CPU clocks, allocator warm-up) is shared:

- `none`: no profiler;
- `torch`: bare `torch.profiler.profile` with the same activities and schedule, no
  `on_trace_ready` (the cheapest way to run torch's profiler);
- `torch+handler`: the same with `tensorboard_trace_handler` (torch writes each window's
  JSON, as most users run it);
- `session`: `profile.session` with the same activities and schedule, writing a run.

Printed: one table with the median, mean and p90 step time per mode and the overhead of the
median against `torch`; then the hand-over stall: the steps in which a window ends (torch
stops its trace and, for the handlers, the window is written out) against the other steps of
the same mode; the time spent in the session's hand-over callback; the background writer's
busy time per window; and how long after its hand-over a window's step files were written.

    .venv/bin/python bench/capture_overhead.py              # CPU, ~1-2 min on 2 cores
    .venv/bin/python bench/capture_overhead.py --device cuda
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "capture"))
sys.path.insert(0, ROOT)

from gpt_model import GPT  # noqa: E402  (bench/ is on sys.path: the scripts run from it)

from tessera import profile  # noqa: E402


def make_loop(device: str, size: dict):
    torch.manual_seed(0)
    model = GPT(size["vocab"], size["d"], size["heads"], size["layers"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, size["vocab"], (size["batch"], size["seq"]), device=device)
    tgt = torch.randint(0, size["vocab"], (size["batch"], size["seq"]), device=device)

    def body():
        with profile.region("forward"):
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, size["vocab"]), tgt.view(-1))
        with profile.region("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return body


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_mode(mode: str, body, steps: int, device: str, sched_args: dict, outdir: str):
    """Step times (s) of `steps` iterations, and the steps that ended a window."""
    from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    times: list[float] = []
    window_steps: set[int] = set()
    extra = {}
    if mode == "none":
        for _ in range(steps):
            t0 = time.perf_counter()
            body()
            sync(device)
            times.append(time.perf_counter() - t0)
        return times, window_steps, extra
    if mode.startswith("torch"):
        handler = None
        if mode == "torch+handler":
            handler = tensorboard_trace_handler(os.path.join(outdir, "tb_handler"))
        with torch.profiler.profile(
            activities=acts,
            schedule=schedule(**sched_args),
            on_trace_ready=handler,
            record_shapes=True,
        ) as prof:
            for _ in range(steps):
                t0 = time.perf_counter()
                body()
                sync(device)
                prof.step()
                times.append(time.perf_counter() - t0)
        sa = sched_args
        cycle = sa["wait"] + sa["warmup"] + sa["active"]
        window_steps = {
            i
            for i in range(steps)
            if i >= sa.get("skip_first", 0) and (i - sa.get("skip_first", 0)) % cycle == cycle - 1
        }
        return times, window_steps, extra
    activities = ["cpu"] + (["gpu"] if device == "cuda" else [])
    run_dir = tempfile.mkdtemp(prefix="session-", dir=outdir)
    with profile.session(
        activities=activities,
        record_shapes=True,
        schedule=profile.schedule(**sched_args),
        tensorboard_dir=run_dir,
        max_steps=100000,
    ) as sess:
        for _ in range(steps):
            t0 = time.perf_counter()
            body()
            sync(device)
            sess.step()
            times.append(time.perf_counter() - t0)
    window_steps = {s for s, _, handed in sess.step_call_ns if handed}
    # Seconds from a window's hand-over to its last step file being reported written.
    written = sess.writer.step_written_at
    ends = sorted(window_steps)
    latency = [written[s] - t for s, t in zip(ends, sess.handed_over_at) if s in written]
    extra = {
        "latency_s": latency,
        "handover_ms": [ns / 1e6 for ns in sess.torch_source.handover_ns]
        if sess.torch_source
        else [],
        "writer_busy_ms": sess.writer.stats.get("busy_ns", 0) / 1e6,
        "windows": sess.writer.stats.get("windows", 0),
        "steps_written": len(sess.steps_written),
    }
    return times, window_steps, extra


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=40, help="steps per mode per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=5)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    if os.environ.get("BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    if args.device == "cpu":
        size = dict(vocab=2000, d=192, heads=4, layers=4, batch=4, seq=96)
    else:
        size = dict(vocab=32000, d=1024, heads=16, layers=4, batch=8, seq=1024)
    sched_args = dict(wait=1, warmup=1, active=3, repeat=0)
    body = make_loop(args.device, size)
    for _ in range(args.warmup_steps):
        body()
    sync(args.device)
    modes = ["none", "torch", "torch+handler", "session"]
    times = {m: [] for m in modes}
    wsteps = {m: [] for m in modes}
    others = {m: [] for m in modes}
    extras = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="capture-overhead-") as outdir:
        for r in range(args.rounds):
            for m in modes:
                t, ws, extra = run_mode(m, body, args.steps, args.device, sched_args, outdir)
                # The first cycle of each mode (profiler start-up) is left out of the medians.
                keep = range(5, len(t))
                times[m] += [t[i] for i in keep]
                wsteps[m] += [t[i] for i in keep if i in ws]
                others[m] += [t[i] for i in keep if i not in ws]
                extras[m].append(extra)
                med_ms = statistics.median(t) * 1e3
                print(f"round {r + 1}/{args.rounds} {m:14s} {med_ms:7.2f} ms", file=sys.stderr)

    base = statistics.median(times["torch"])
    print(
        f"\ndevice {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"model {size}, schedule {sched_args}, {args.rounds} rounds x {args.steps} steps per mode"
    )
    print(
        f"{'mode':15s} {'steps':>5s} {'median ms':>10s} {'mean ms':>9s} {'p90 ms':>8s} "
        f"{'vs torch':>9s} {'window-end steps: median / max ms':>35s} "
        f"{'other steps median ms':>22s}"
    )
    for m in modes:
        t = times[m]
        vs = f"{(statistics.median(t) / base - 1) * 100:+.1f}%"
        if wsteps[m]:
            w = f"{statistics.median(wsteps[m]) * 1e3:.2f} / {max(wsteps[m]) * 1e3:.2f}"
        else:
            w = "-"
        o = statistics.median(others[m]) * 1e3
        print(
            f"{m:15s} {len(t):5d} {statistics.median(t) * 1e3:10.2f} "
            f"{statistics.mean(t) * 1e3:9.2f} {pct(t, 0.9) * 1e3:8.2f} {vs:>9s} {w:>35s} {o:22.2f}"
        )
    hand = [h for e in extras["session"] for h in e["handover_ms"]]
    busy = sum(e["writer_busy_ms"] for e in extras["session"])
    windows = sum(e["windows"] for e in extras["session"])
    written = sum(e["steps_written"] for e in extras["session"])
    if hand:
        print(
            f"\nsession hand-over (Kineto JSON export inside on_trace_ready): median "
            f"{statistics.median(hand):.2f} ms, max {max(hand):.2f} ms over {len(hand)} windows"
        )
    if windows:
        print(
            f"background writer (child process): {busy / windows:.1f} ms busy per window "
            f"({windows} windows, {written} steps written)"
        )
    latency = [x for e in extras["session"] for x in e["latency_s"]]
    if latency:
        print(
            f"window hand-over -> its last step file written: median "
            f"{statistics.median(latency):.3f} s, max {max(latency):.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
