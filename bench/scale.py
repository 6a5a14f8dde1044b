"""Import and cross-rank analysis at 64 to 1,024 ranks: local threads vs a Dask cluster.

    .venv/bin/python bench/scale.py                      # 64 and 256 ranks
    .venv/bin/python bench/scale.py --ranks 64,256,1024  # and the 1,024-rank point
    .venv/bin/python bench/scale.py --plugin-ranks 1024  # the plugin on that run (default:
                                                         # the largest of --ranks)

Per N (an N-rank trace directory made by bench/synth_ranks.py from the real 4-rank FSDP
traces, 3 steps per rank, rank 37 % N the injected straggler; made once into --work):
- import: `tessera-prof import` with its local threads (`-j 0`) vs `--dask local:2` (a
  LocalCluster of 2 worker processes, one thread each); wall time and the peak resident
  memory of every process (sampled every 20 ms): the client, and the largest of the others
  (Dask's scheduler runs in the client; its nannies and workers are child processes).
- collectives analysis (`tessera.analyze.collectives`, every rank and step): in one process
  vs on `local:2`; the straggler it finds.
- plugin, on the Dask-imported run (which carries its derived index): a fresh `tensorboard`
  each time; first view = /runs, /header, /overview (default steps) and /collectives one
  after the other, as the tab opens them; then the same `--repeat` times (warm p95).

Prints one table and the goals: 1,024 ranks x 3 steps analysed with no process over 1 GB;
plugin first view < 5 s and warm p95 < 200 ms on the 1,024-rank run. Reports only (exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from plugin import TensorBoard, pct  # noqa: E402  (bench/plugin.py: a tensorboard process)

PROCESS_GOAL_BYTES = 1 << 30
FIRST_VIEW_GOAL_S = 5.0
WARM_P95_GOAL_MS = 200.0
STRAGGLER = 37


class PeakRss:
    """Peak RSS of a process and each of its descendants, sampled every `interval_s`."""

    def __init__(self, pid: int, interval_s: float = 0.02):
        self.root = pid
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        try:
            proc = psutil.Process(self.root)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                procs = [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                if rss > self.peaks.get(p.pid, 0):
                    self.peaks[p.pid] = rss
            time.sleep(interval_s)

    def stop(self) -> tuple[int, int, int]:
        """(client peak, largest other peak, number of other processes) in bytes."""
        self._stop.set()
        self._thread.join()
        others = [v for k, v in self.peaks.items() if k != self.root]
        return self.peaks.get(self.root, 0), max(others, default=0), len(others)


def timed(cmd: list[str]) -> dict:
    """Run a command; wall time, peak RSS of it and of its children, its output."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rss = PeakRss(proc.pid)
    out, err = proc.communicate()
    wall = time.perf_counter() - t
    client, other, n_other = rss.stop()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return {
        "wall_s": wall,
        "client_rss": client,
        "other_rss": other,
        "n_other": n_other,
        "out": out,
    }


def traces_for(work: str, n: int) -> str:
    out = os.path.join(work, f"synth{n}")
    if not os.path.isdir(out) or len(os.listdir(out)) != n:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [sys.executable, os.path.join(HERE, "synth_ranks.py"), str(n), out]
            + ["--stragglers", str(STRAGGLER % n)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return out


def import_run(traces: str, logdir: str, dask: str | None) -> dict:
    shutil.rmtree(logdir, ignore_errors=True)
    cmd = [os.path.join(os.path.dirname(sys.executable), "tessera-prof"), "import", traces]
    cmd += ["--logdir", logdir, "--run", "r", "-q"]
    cmd += ["--dask", dask] if dask else ["-j", "0"]
    return timed(cmd)


ANALYSE = """
import sys, time
from tessera import analyze
t = time.perf_counter()
inst = analyze.collectives(trace=sys.argv[1], dask=sys.argv[2] or None)
s = inst.attrs["stragglers"]
top = s.iloc[0]
print(f"{len(inst)} instances; straggler rank {top['rank']} (last in {top['n_straggler']} of "
      f"{top['n_instances']}); {time.perf_counter() - t:.1f} s inside")
"""


def analyse(run_dir: str, dask: str | None) -> dict:
    return timed([sys.executable, "-c", ANALYSE, run_dir, dask or ""])


def plugin(logdir: str, repeat: int) -> dict:
    tb = TensorBoard(logdir)
    try:
        t = time.perf_counter()
        cold = {}
        cold["runs"], _, body = tb.get("runs")
        listing = next(r for r in json.loads(body)["runs"] if r["name"] == "r")
        steps = listing["default_steps"]
        cold["header"] = tb.get("header", run="r")[0]
        cold["overview"] = tb.get("overview", run="r", steps=steps)[0]
        cold["collectives"] = tb.get("collectives", run="r", steps=steps)[0]
        first = time.perf_counter() - t
        warm = []
        for _ in range(repeat):
            for route, params in (
                ("runs", {}),
                ("header", {"run": "r"}),
                ("overview", {"run": "r", "steps": steps}),
                ("collectives", {"run": "r", "steps": steps}),
            ):
                warm.append(tb.get(route, **params)[0])
        tb_rss = psutil.Process(tb.proc.pid).memory_info().rss
    finally:
        tb.close()
    return {"first_s": first, "warm_p95_ms": 1e3 * pct(warm, 95), "tb_rss": tb_rss, "cold": cold}


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="64,256", help="rank counts, e.g. 64,256,1024")
    p.add_argument("--plugin-ranks", type=int, help="the run the plugin opens (default: largest)")
    p.add_argument("--work", default=os.path.join(ROOT, "bench", "out", "scale"))
    p.add_argument("--repeat", type=int, default=10, help="warm repeats of the first view")
    p.add_argument(
        "--plugin-only",
        action="store_true",
        help="only the plugin, on the Dask-imported run a previous call left in --work",
    )
    args = p.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    plugin_n = args.plugin_ranks or max(ranks)
    os.makedirs(args.work, exist_ok=True)
    rows = []
    analysed: dict[tuple[int, str], dict] = {}
    for n in [] if args.plugin_only else ranks:
        traces = traces_for(args.work, n)
        for mode, dask in (("local -j", None), ("dask local:2", "local:2")):
            logdir = os.path.join(args.work, f"logdir{n}_{'dask' if dask else 'local'}")
            r = import_run(traces, logdir, dask)
            rows.append((n, f"import, {mode}", r, ""))
        run_dir = os.path.join(args.work, f"logdir{n}_local", "r")
        for mode, dask in (("one process", None), ("dask local:2", "local:2")):
            r = analyse(run_dir, dask)
            analysed[(n, mode)] = r
            rows.append((n, f"collectives, {mode}", r, r["out"].strip()))
    first_view = plugin(os.path.join(args.work, f"logdir{plugin_n}_dask"), args.repeat)
    print(f"{'ranks':>6}  {'what':<28}{'wall s':>8}{'client MB':>11}{'max other MB':>14}  note")
    for n, what, r, note in rows:
        other = f"{mb(r['other_rss'])} ({r['n_other']})" if r["n_other"] else "-"
        print(f"{n:>6}  {what:<28}{r['wall_s']:>8.1f}{mb(r['client_rss']):>11}{other:>14}  {note}")
    if first_view:
        print(
            f"{plugin_n:>6}  {'plugin first view':<28}{first_view['first_s']:>8.2f}"
            f"{mb(first_view['tb_rss']):>11}{'-':>14}  warm p95 "
            f"{first_view['warm_p95_ms']:.1f} ms; first: "
            + ", ".join(f"/{k} {v:.2f} s" for k, v in first_view["cold"].items())
        )
    big = max(ranks)
    if analysed:
        worst = max(
            max(r["client_rss"], r["other_rss"]) for (n, _), r in analysed.items() if n == big
        )
        print(
            f"goal: {big} ranks x 3 steps analysed with no process over 1 GB: largest process "
            f"{mb(worst)} MB -> {'met' if worst < PROCESS_GOAL_BYTES else 'NOT met'}"
        )
    if first_view:
        print(
            f"goal: plugin first view < {FIRST_VIEW_GOAL_S:.0f} s on {plugin_n} ranks: "
            f"{first_view['first_s']:.2f} s -> "
            f"{'met' if first_view['first_s'] < FIRST_VIEW_GOAL_S else 'NOT met'}"
        )
        print(
            f"goal: warm p95 < {WARM_P95_GOAL_MS:.0f} ms: {first_view['warm_p95_ms']:.1f} ms -> "
            f"{'met' if first_view['warm_p95_ms'] < WARM_P95_GOAL_MS else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
