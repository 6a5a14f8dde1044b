"""Check the capture layer on real GPUs: one GPU, and DDP (NCCL all-reduce) under torchrun.

    python bench/gpu_capture_check.py --out /tmp/capture_check            # one GPU (+ attach)
    torchrun --nproc_per_node=2 bench/gpu_capture_check.py --out /tmp/capture_check   # DDP

Trains a small GPT-like model (bf16 autocast, fused AdamW) under `profile.session` with every
activity (cpu, gpu, memcpy, collective, memory, power), regions, marks and a user counter,
a schedule of two windows, and the Chrome and summary exporters. Then reads back what it
wrote and prints it: steps per worker, events per kind, kernels and NCCL kernels, NVML
counter tracks, capabilities, a kernel and a collective record, the op report, the exported
files. Each check prints `CHECK ok` or `CHECK FAILED`; the exit status is 1 if any failed.
On one GPU it also attaches `tessera-prof attach` to a second training process.

Needs only torch, nvidia-ml-py and this repository (run from its root, or with `capture/`
and the root on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (os.path.join(ROOT, "capture"), ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpt_model import GPT  # noqa: E402  (bench/ is on sys.path: the scripts run from it)

from tessera import profile  # noqa: E402

FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"CHECK {'ok' if ok else 'FAILED'}: {what}", flush=True)
    if not ok:
        FAILED.append(what)


def build(args, device):
    torch.manual_seed(0)
    model = GPT(args.vocab, args.d, args.heads, args.layers).to(device)
    if torch.distributed.is_initialized():
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step_fn():
        with profile.region("data"):
            idx = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
            tgt = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
            host = torch.randn(args.batch, args.seq, 64, pin_memory=True)
            host.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with profile.region("forward"):
                logits = model(idx)
                loss = F.cross_entropy(logits.view(-1, args.vocab).float(), tgt.view(-1))
        with profile.region("backward"):
            loss.backward()
        with profile.region("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    return step_fn


def train_only(args) -> None:
    """A plain training loop without a session (the process `attach` samples)."""
    device = torch.device("cuda", 0)
    step_fn = build(args, device)
    end = time.monotonic() + args.train_seconds
    while time.monotonic() < end:
        step_fn()
    torch.cuda.synchronize()


def capture(args, out: str, rank: int, world: int, device) -> object:
    step_fn = build(args, device)
    run_dir = os.path.join(out, "run_ddp" if world > 1 else "run_1gpu")
    sched = profile.schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2)
    t0 = time.perf_counter()
    with profile.session(
        activities=["cpu", "gpu", "memcpy", "collective", "memory", "power"],
        record_shapes=True,
        with_stack=False,
        sample_interval_ms=10,
        schedule=sched,
        exporters=[
            profile.chrome(os.path.join(out, f"{os.path.basename(run_dir)}.trace.{{rank}}.json")),
            profile.summary(os.path.join(out, f"{os.path.basename(run_dir)}.summary.{{rank}}.csv")),
        ],
        tensorboard_dir=run_dir,
    ) as sess:
        for i in range(args.steps):
            loss = step_fn()
            profile.counter(name="loss", value=float(loss.detach()), unit="scalar")
            sess.mark(f"end of iteration {i}")
            sess.step()
    torch.cuda.synchronize()
    print(f"[rank {rank}] {args.steps} steps in {time.perf_counter() - t0:.2f} s", flush=True)
    return sess, sched


def report(sess, sched, args, world: int) -> None:
    from tessera_tb.trace import open_run

    run = open_run(sess.run_dir)
    worker = sess.worker
    info = run.workers[worker]
    expected = sched.active_steps(args.steps + 1)
    devices = [d.name for d in info.meta.devices]
    print(f"\n== {sess.run_dir} worker {worker}: steps {info.steps} (rank {info.meta.rank}, "
          f"world {info.meta.world_size}, devices {devices})")  # fmt: skip
    check(info.steps == [s for s in expected if s < args.steps], f"{worker}: the active steps")
    print("capabilities:")
    for c in info.meta.capabilities:
        print(f"  {c.name:20s} {c.status:12s} {c.reason}")
    caps = {c.name: c.status for c in info.meta.capabilities}
    check(caps.get("device_activity") == "ok", f"{worker}: device activity captured")
    check(caps.get("nvml") == "ok", f"{worker}: NVML sampler running")
    kinds = collections.Counter()
    counters = set()
    for s in info.steps:
        step = run.load_step(worker, s)
        kinds.update(step.frame().kind.value_counts().to_dict())
        counters |= {(c.name, c.source, c.device) for c in step.counters}
    print("events per kind:", {k: v for k, v in kinds.items() if v})
    print("counter tracks:", sorted(counters))
    check(kinds["kernel"] > 0, f"{worker}: kernels recorded")
    check(kinds["memcpy"] > 0, f"{worker}: memcpys recorded")
    check(kinds["region"] >= 4 * len(info.steps), f"{worker}: regions recorded")
    check(any(n == "power_w" and src == "nvml" for n, src, _ in counters), f"{worker}: power_w")
    check(any(n == "loss" and src == "user" for n, src, _ in counters), f"{worker}: user counter")
    if world > 1:
        check(kinds["collective"] > 0, f"{worker}: NCCL kernels recorded as collectives")
    records = list(sess.records())
    print(f"records: {len(records)}")
    for kind in ("kernel", "memcpy", "collective"):
        rec = next((r for r in records if r["kind"] == kind), None)
        if rec is not None:
            shown = {k: v for k, v in rec.items() if k != "capabilities"}
            shown["name"] = shown["name"][:80]
            print(f"  first {kind} record: {json.dumps(shown)}")
            print(f"    capabilities: {json.dumps(rec['capabilities'])}")
    check(any(r["power_w"] is not None for r in records), f"{worker}: records carry power_w")
    if world > 1:
        colls = [r for r in records if r["kind"] == "collective"]
        check(
            bool(colls) and all(r["collective_type"] == "all_reduce" for r in colls),
            f"{worker}: collective records are all_reduce with bytes",
        )
    print("op report:")
    table = sess.report()
    check(table["flops"].notna().any(), f"{worker}: report has FLOPs for some ops")
    prefix = os.path.basename(sess.run_dir)
    for name in sorted(os.listdir(os.path.dirname(sess.run_dir))):
        if name.startswith(prefix + ".") and str(info.meta.rank if world > 1 else 0) in name:
            path = os.path.join(os.path.dirname(sess.run_dir), name)
            print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)")
    trace_path = os.path.join(os.path.dirname(sess.run_dir), f"{prefix}.trace.{sess.rank}.json")
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    phases = collections.Counter(e["ph"] for e in events)
    print("chrome trace phases:", dict(phases))
    check(phases["s"] == phases["f"] > 0, f"{worker}: launch flows in the Chrome trace")
    handover = [ns / 1e6 for ns in sess.torch_source.handover_ns] if sess.torch_source else []
    print(f"hand-over (Kineto JSON export) ms per window: {[round(h, 2) for h in handover]}")
    calls = sorted(sess.step_call_ns, key=lambda c: c[0])
    print("step() call ms: "
          + ", ".join(f"{s}:{ns / 1e6:.2f}{'*' if h else ''}" for s, ns, h in calls)
          + "   (* = hand-over step)")  # fmt: skip
    if sess.handed_over_at:
        lat = [
            sess.writer.step_written_at[s] - sess.handed_over_at[i // sched.active]
            for i, s in enumerate(info.steps)
            if s in sess.writer.step_written_at and i // sched.active < len(sess.handed_over_at)
        ]
        print(f"seconds from hand-over to step file written: {[round(x, 3) for x in lat]}")


def _env() -> dict[str, str]:
    """This environment, with the repository importable in child processes."""
    paths = [os.path.join(ROOT, "capture"), ROOT, os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


def attach_check(args, out: str) -> None:
    print("\n== tessera-prof attach on a second training process")
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--out", out, "--train-only",
         "--train-seconds", "6"],
        env=_env(),
    )  # fmt: skip
    time.sleep(3)  # let it create its CUDA context
    trace, summary = os.path.join(out, "attach.trace.json"), os.path.join(out, "attach.csv")
    cmd = [sys.executable, "-m", "tessera.cli.main", "attach", "--pid", str(child.pid),
           "--sample-interval-ms", "10", "--export", trace, "--summary", summary]  # fmt: skip
    env = _env()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    child.wait(timeout=60)
    print(done.stdout.strip())
    print(done.stderr.strip())
    check(done.returncode == 0, "attach exits 0 and stops when the process exits")
    if done.returncode == 0:
        with open(summary) as f:
            print(f.read())
        with open(trace) as f:
            phases = collections.Counter(e["ph"] for e in json.load(f)["traceEvents"])
        check(phases["C"] > 0, "attach trace has counter events")
    missing = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", "attach", "--pid", "999999999"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    check(missing.returncode == 2, "attach to a missing pid exits 2")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="directory for runs and exports")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--no-attach", action="store_true", help="skip the attach check")
    p.add_argument("--train-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--train-seconds", type=float, default=6.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.train_only:
        train_only(args)
        return 0
    os.makedirs(args.out, exist_ok=True)
    distributed = "RANK" in os.environ
    if distributed:
        torch.distributed.init_process_group("nccl")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        rank, world = 0, 1
    device = torch.device("cuda", torch.cuda.current_device())
    print(f"[rank {rank}] torch {torch.__version__}, {torch.cuda.get_device_name(device)}, "
          f"world {world}", flush=True)  # fmt: skip
    sess, sched = capture(args, args.out, rank, world, device)
    if distributed:
        torch.distributed.barrier()
    report(sess, sched, args, world)
    if not distributed and not args.no_attach:
        attach_check(args, args.out)
    if distributed:
        torch.distributed.destroy_process_group()
    print(f"\n[rank {rank}] {len(FAILED)} check(s) failed" + (f": {FAILED}" if FAILED else ""))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
