"""Planted performance problems, each captured twice on a GPU: with the problem and fixed.

    python bench/planted_problems.py --out DIR [--only NAME ...]

For each problem below, the same short workload runs under `profile.session` twice (variant
`problem` and variant `fixed`) and writes a run `DIR/<name>_<variant>`. Each variant is first
timed without the profiler (median of CUDA-synchronised steps), and `DIR/planted.json` records
those times next to the run paths, so the findings' predicted wins can be compared with the
step-time difference actually measured (tests/backend/test_planted_findings.py does that on the
runs kept in tests/data/planted; bench/planted_findings.py prints the table).

Problems (each a few lines, as a user would write them):

- `unaligned_gemm`: an LM head with a vocabulary of 50,257 (not a multiple of 8/16); fixed: padded
  to 50,304.
- `fp32_matmul`: an MLP trained in fp32 with TF32 off; fixed: bf16 autocast.
- `item_sync`: `.item()` after every layer (a NaN check); fixed: no check in the loop.
- `pageable_copy`: a batch copied from pageable host memory each step; fixed: pinned memory,
  copied on a side stream while the previous batch computes.
- `unfused_optimizer`: AdamW with `foreach=False` over many small parameters; fixed: `fused=True`.
- `tiny_kernels`: a chain of elementwise ops on small tensors; fixed: `torch.compile` (one fused
  kernel).

Needs torch with CUDA and this repository (run from its root).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (os.path.join(ROOT, "capture"), ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tessera import profile  # noqa: E402

DEV = torch.device("cuda")


def unaligned_gemm(fixed: bool):
    vocab = 50304 if fixed else 50257
    x = torch.randn(4096, 1024, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, 1024, device=DEV, dtype=torch.bfloat16, requires_grad=True)

    def step():
        for _ in range(2):
            logits = F.linear(x, w)
            logits.backward(torch.ones_like(logits))

    return step


def fp32_matmul(fixed: bool):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    d = 4096
    mlp = nn.Sequential(*[nn.Linear(d, d) for _ in range(4)]).to(DEV)
    x = torch.randn(2048, d, device=DEV)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fixed):
            y = mlp(x)
        y.float().square().mean().backward()

    return step


def item_sync(fixed: bool):
    # Large enough that the fixed step is GPU-bound even with Python stacks recorded: the
    # sync's cost is then the GPU idle it causes, not host time spent around it.
    layers = nn.ModuleList(nn.Linear(4096, 4096) for _ in range(12)).to(DEV)
    x = torch.randn(8192, 4096, device=DEV)

    def step():
        h = x
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for layer in layers:
                h = torch.relu(layer(h))
                if not fixed and torch.isnan(h).any().item():
                    raise FloatingPointError("NaN in activations")
        h.float().mean().backward()

    return step


def pageable_copy(fixed: bool):
    n = 64 * 1024 * 1024 // 4  # a 64 MB fp32 batch
    host = torch.randn(n)
    if fixed:
        host = host.pin_memory()
    w = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    copy_stream = torch.cuda.Stream()
    state: dict = {}

    def compute(batch):
        a = batch[: 4096 * 4096].view(4096, 4096).to(torch.bfloat16)
        for _ in range(6):
            a = a @ w
        return a

    def step():
        if not fixed:
            batch = host.to(DEV)
            compute(batch)
            return
        # Prefetch: the next batch is copied while this one computes.
        if "next" not in state:
            with torch.cuda.stream(copy_stream):
                state["next"] = host.to(DEV, non_blocking=True)
        torch.cuda.current_stream().wait_stream(copy_stream)
        batch = state["next"]
        batch.record_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy_stream):
            state["next"] = host.to(DEV, non_blocking=True)
        compute(batch)

    return step


def unfused_optimizer(fixed: bool):
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(96)]).to(DEV)
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-4, **({"fused": True} if fixed else {"foreach": False})
    )
    x = torch.randn(256, 256, device=DEV)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _chain(x):
    for _ in range(8):
        x = x * 1.0001 + 0.5
        x = torch.sin(x) * torch.sigmoid(x)
        x = x - x.mean(dim=-1, keepdim=True)
    return x


def tiny_kernels(fixed: bool):
    fn = torch.compile(_chain) if fixed else _chain
    x = torch.randn(64, 1024, device=DEV)

    def step():
        for _ in range(8):
            fn(x)

    return step


PROBLEMS = {
    "unaligned_gemm": unaligned_gemm,
    "fp32_matmul": fp32_matmul,
    "item_sync": item_sync,
    "pageable_copy": pageable_copy,
    "unfused_optimizer": unfused_optimizer,
    "tiny_kernels": tiny_kernels,
}


def bare_ms(step, n: int = 20) -> float:
    """Median wall time of one synchronised step, without any profiler (ms)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def capture(step, run_dir: str, with_stack: bool) -> None:
    sched = profile.schedule(wait=1, warmup=1, active=3)
    with profile.session(
        activities=["cpu", "gpu", "memcpy", "memory"],
        record_shapes=True,
        with_stack=with_stack,
        schedule=sched,
        tensorboard_dir=run_dir,
    ) as sess:
        for _ in range(6):
            step()
            sess.step()
    torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--only", nargs="*", choices=sorted(PROBLEMS), default=None)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    index = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "problems": {}}
    for name in args.only or PROBLEMS:
        entry = {}
        for variant in ("problem", "fixed"):
            torch.manual_seed(0)
            step = PROBLEMS[name](variant == "fixed")
            ms = bare_ms(step)
            run_dir = os.path.join(args.out, f"{name}_{variant}")
            capture(step, run_dir, with_stack=name == "item_sync")
            entry[variant] = {"bare_step_ms": round(ms, 3), "run": os.path.basename(run_dir)}
            print(f"{name:18s} {variant:8s} bare step {ms:8.3f} ms -> {run_dir}", flush=True)
            del step
            torch.cuda.empty_cache()
        index["problems"][name] = entry
    with open(os.path.join(args.out, "planted.json"), "w") as f:
        json.dump(index, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
