"""Latency and size of the Tessera plugin's routes, through a real TensorBoard.

    .venv/bin/python bench/plugin.py                # largest demo run and a 10x copy
    .venv/bin/python bench/plugin.py --factor 5     # a 5x copy instead
    .venv/bin/python bench/plugin.py --skip-scaled  # the demo run only
    .venv/bin/python bench/plugin.py --repeat 30    # more warm samples

Runs:
- `fsdp_gpt_4rank`: the largest demo run (4 ranks x 3 steps), copied from demo_runs/;
- `fsdp_x<factor>`: the same run's real traces (../shared/traces/pytorch/fsdp_gpt_4rank)
  scaled with bench/scale_trace.py (`factor` x 3 steps per rank) and imported;
- `gpt_1gpu_x<n>_one_step`: the single-GPU trace repeated n times inside one step
  (`scale_trace.py --one-step`; 50 copies: ~480k stored events in one step file), the
  timeline's worst case.
Scaled runs are made once into bench/out/plugin/ and reused while the inputs are older.

Per run, each against a freshly started `tensorboard --logdir` (so "cold" means a new
server: no loaded step, no cached answer):
- first view, cold: /runs, /header and /overview for the default step range, one after the
  other, as the tab does when it opens; then warm: the same three again, `repeat` times;
- the other views (operators, kernels, timeline of the default step, memory, collectives,
  roofline, stalls): first request and warm repeats;
- timeline windows: for each rank, the whole extent of its default steps and `windows`
  random zooms (widths from 0.1% to 100%, log-uniform), each asked once (a new window: the
  level-of-detail query runs; the step's index is cached after the first), then once again
  (the cached answer). p50/p95 latency and the largest answer in bytes.

Prints one table and the goals: warm p95 < 200 ms, timeline window <= 2 MB, cold first view
of the scaled run < 5 s. It reports; it does not assert (exit status 0 either way).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "plugin")
DEMO_RUN = os.path.join(ROOT, "demo_runs", "fsdp_gpt_4rank")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "traces", "pytorch")
SOURCE_TRACES = os.path.join(SHARED, "fsdp_gpt_4rank")
ONE_GPU_TRACES = os.path.join(SHARED, "gpt_1gpu_stack")
WARM_P95_GOAL_MS = 200.0
WINDOW_BYTES_GOAL = 2_000_000
COLD_FIRST_VIEW_GOAL_S = 5.0


def _newer(path: str, than: list[str]) -> bool:
    return os.path.exists(path) and all(os.path.getmtime(path) >= os.path.getmtime(t) for t in than)


def scaled_run(logdir: str, factor: int, one_step: bool = False) -> str:
    """Import a `factor` x copy of the fsdp traces (with `one_step`: of the single-GPU trace,
    every copy in one step) into `logdir`, once; returns the run's name."""
    name = f"gpt_1gpu_x{factor}_one_step" if one_step else f"fsdp_x{factor}"
    run_dir = os.path.join(logdir, name)
    if one_step:
        pattern = os.path.join(ONE_GPU_TRACES, "worker0.*.pt.trace.json.gz")
    else:
        pattern = os.path.join(SOURCE_TRACES, "rank*.pt.trace.json.gz")
    inputs = sorted(glob.glob(pattern))
    scaler = os.path.join(ROOT, "bench", "scale_trace.py")
    stamp = os.path.join(run_dir, ".complete")
    if _newer(stamp, inputs + [scaler]):
        return name
    shutil.rmtree(run_dir, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        scaled = []
        for path in inputs:
            out = os.path.join(tmp, os.path.basename(path))
            print(f"scaling {os.path.basename(path)} x{factor} ...", flush=True)
            subprocess.run(
                [sys.executable, scaler, path, out, "--factor", str(factor)]
                + (["--one-step"] if one_step else []),
                check=True,
                stdout=subprocess.DEVNULL,
            )
            scaled.append(out)
        print(f"importing {name} ...", flush=True)
        from tessera_tb.importers.kineto_import import import_traces

        import_traces(scaled, logdir, name)
    with open(stamp, "w") as f:
        f.write("ok\n")
    return name


class TensorBoard:
    """A `tensorboard --logdir` on a free port, stopped on exit."""

    def __init__(self, logdir: str):
        self.err = tempfile.NamedTemporaryFile(prefix="tb_", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir]
            + ["--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=self.err,
        )
        deadline = time.time() + 90
        while True:
            text = open(self.err.name).read()
            m = re.search(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+)/", text)
            if m:
                self.url = m.group(1)
                break
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("tensorboard did not start:\n" + text)
            time.sleep(0.1)

    def get(self, route: str, **params) -> tuple[float, int, bytes]:
        """(seconds, bytes on the wire, body) of one GET of a plugin route."""
        q = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{self.url}/data/plugin/tessera/{route}?{q}"
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as r:
            wire = r.read()
            enc = r.headers.get("Content-Encoding")
        elapsed = time.perf_counter() - t
        body = __import__("gzip").decompress(wire) if enc == "gzip" else wire
        return elapsed, len(wire), body

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.unlink(self.err.name)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def bench_run(logdir: str, run: str, repeat: int, windows: int, seed: int) -> list[dict]:
    rows = []
    tb = TensorBoard(logdir)
    try:
        t = time.perf_counter()
        _, _, body = tb.get("runs")
        listing = next(r for r in json.loads(body)["runs"] if r["name"] == run)
        tb.get("header", run=run)
        steps = listing["default_steps"]
        _, wire, body = tb.get("overview", run=run, steps=steps)
        cold = time.perf_counter() - t
        warm = []
        for _ in range(repeat):
            t = time.perf_counter()
            tb.get("runs")
            tb.get("header", run=run)
            tb.get("overview", run=run, steps=steps)
            warm.append(time.perf_counter() - t)
        n_workers = len(listing["workers"])
        n_steps = len(json.loads(body)["selection"]["steps"])
        label = f"first view ({n_workers} ranks x {n_steps} steps)"
        rows.append(row(run, label, cold, warm, len(body), wire))
        all_steps = sorted({s["step"] for w in listing["workers"] for s in w["steps"]})
        if len(all_steps) > n_steps:
            first, wire, body = tb.get("overview", run=run)
            warm = [tb.get("overview", run=run)[0] for _ in range(max(3, repeat // 4))]
            label = f"overview, every step ({len(all_steps)})"
            rows.append(row(run, label, first, warm, len(body), wire))
        default_step = str(listing["default_step"])
        views = [
            ("operators", "topk", {"table": "operators", "steps": steps}),
            ("kernels", "topk", {"table": "kernels", "steps": steps}),
            ("timeline (default step, rank0)", "timeline", {"steps": default_step}),
            ("memory", "memory", {"steps": steps}),
            ("collectives", "collectives", {"steps": steps}),
            ("roofline", "roofline", {"steps": steps}),
            ("stalls", "stalls", {"steps": steps}),
        ]
        for label, route, params in views:
            first, wire, body = tb.get(route, run=run, **params)
            warm = [tb.get(route, run=run, **params)[0] for _ in range(repeat)]
            rows.append(row(run, label, first, warm, len(body), wire))
        rng = random.Random(seed)
        new, again, sizes = [], [], []
        for w in listing["workers"]:
            _, _, body = tb.get("timeline", run=run, steps=default_step, worker=w["name"])
            extent = json.loads(body)["extent_ns"]
            asks = [(0, extent)]
            for _ in range(windows):
                width = extent * 10 ** rng.uniform(-3, 0)
                t0 = rng.uniform(0, extent - width)
                asks.append((int(t0), int(t0 + width)))
            for t0, t1 in asks:
                params = {"steps": default_step, "worker": w["name"], "t0": t0, "t1": t1}
                params["max_items"] = 6000
                s, _, body = tb.get("timeline", run=run, **params)
                new.append(s)
                sizes.append(len(body))
                again.append(tb.get("timeline", run=run, **params)[0])
        rows.append(
            {
                "run": run,
                "what": f"timeline windows ({len(new)}: new / same again)",
                "cold_ms": None,
                "p50_ms": 1e3 * pct(new, 50),
                "p95_ms": 1e3 * pct(new, 95),
                "warm_p50_ms": 1e3 * pct(again, 50),
                "warm_p95_ms": 1e3 * pct(again, 95),
                "bytes": max(sizes),
                "wire_bytes": None,
            }
        )
    finally:
        tb.close()
    return rows


def row(run, what, cold_s, warm_s, nbytes, wire) -> dict:
    return {
        "run": run,
        "what": what,
        "cold_ms": 1e3 * cold_s,
        "p50_ms": None,
        "p95_ms": None,
        "warm_p50_ms": 1e3 * pct(warm_s, 50),
        "warm_p95_ms": 1e3 * pct(warm_s, 95),
        "bytes": nbytes,
        "wire_bytes": wire,
    }


def print_table(rows: list[dict]) -> None:
    cols = [
        ("run", "run", "{}"),
        ("what", "request", "{}"),
        ("cold_ms", "first ms", "{:.0f}"),
        ("p50_ms", "new p50", "{:.0f}"),
        ("p95_ms", "new p95", "{:.0f}"),
        ("warm_p50_ms", "warm p50", "{:.1f}"),
        ("warm_p95_ms", "warm p95", "{:.1f}"),
        ("bytes", "max bytes", "{:,}"),
        ("wire_bytes", "gzip bytes", "{:,}"),
    ]
    cells = [[h for _, h, _ in cols]] + [
        ["-" if r[k] is None else f.format(r[k]) for k, _, f in cols] for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    for n, c in enumerate(cells):
        print(
            "  ".join(
                x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(c, widths))
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=20, help="warm samples per request")
    ap.add_argument("--windows", type=int, default=15, help="random timeline zooms per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--one-step-factor",
        type=int,
        default=50,
        help="copies of the single-GPU trace in one step (~11k events each); 0: skip",
    )
    ap.add_argument("--skip-scaled", action="store_true")
    args = ap.parse_args()
    logdir = os.path.join(OUT, "logdir")
    os.makedirs(logdir, exist_ok=True)
    demo = os.path.join(logdir, "fsdp_gpt_4rank")
    shutil.rmtree(demo, ignore_errors=True)
    shutil.copytree(DEMO_RUN, demo)
    runs = ["fsdp_gpt_4rank"]
    if not args.skip_scaled:
        runs.append(scaled_run(logdir, args.factor))
        if args.one_step_factor:
            runs.append(scaled_run(logdir, args.one_step_factor, one_step=True))
    rows = []
    for run in runs:
        print(f"benchmarking {run} ...", flush=True)
        rows += bench_run(logdir, run, args.repeat, args.windows, args.seed)
    print()
    print_table(rows)
    print()
    warm = max(r["warm_p95_ms"] for r in rows)
    window_bytes = max(r["bytes"] for r in rows if r["what"].startswith("timeline"))
    first_scaled = [
        r["cold_ms"] for r in rows if r["run"] in runs[1:2] and r["what"].startswith("first view")
    ]
    print(
        f"goal: warm p95 < {WARM_P95_GOAL_MS:.0f} ms: worst {warm:.1f} ms"
        + ("" if warm < WARM_P95_GOAL_MS else "  MISSED")
    )
    print(
        f"goal: timeline window <= 2 MB: largest {window_bytes:,} bytes"
        + ("" if window_bytes <= WINDOW_BYTES_GOAL else "  MISSED")
    )
    if first_scaled:
        s = first_scaled[0] / 1e3
        print(
            f"goal: cold first view of the scaled run < {COLD_FIRST_VIEW_GOAL_S:.0f} s: {s:.2f} s"
            + ("" if s < COLD_FIRST_VIEW_GOAL_S else "  MISSED")
        )


if __name__ == "__main__":
    main()
