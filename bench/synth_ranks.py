"""Make an N-rank trace directory from the real 4-rank FSDP traces (for scale tests and
bench/scale.py). Generated, never committed.

Usage: .venv/bin/python bench/synth_ranks.py N OUT_DIR [--stragglers 5,77 | --n-stragglers K]
       [--delay-ms 2.0] [--seed 0] [--source ../shared/traces/pytorch/fsdp_gpt_4rank]

Rank r is a copy of source rank r % 4 (`rank{r % 4}.*.pt.trace.json.gz`), rewritten:

- `distributedInfo`: rank r, world size N, the default process group holding ranks 0..N-1.
- NCCL kernels and their `record_param_comms` ops: `Group size` N, `Process Group Ranks`
  [0..N-1], `Rank` r; an all-gather's `Out msg nelems` and a reduce-scatter's `In msg nelems`
  become N x the shard (the per-rank shard is the source's); a non-empty all_to_allv split
  becomes N equal parts of the same total.
- Clocks: every rank's `baseTimeNanoseconds` moves by its host's offset (8 ranks a host,
  up to +-50 ms) plus its own jitter (up to +-20 us); durations are unchanged by it.
- Stragglers: the k-th NCCL kernel of every source is the same collective instance (checked
  by name). A straggler rank's kernel lasts the shortest of the 4 sources' durations of that
  instance (it arrived last: it waited for nobody); every other rank's kernel lasts its own
  duration plus `--delay-ms` plus up to 5% jitter (it waited for the straggler). So in every
  instance the straggler is the member with the shortest kernel, and the others waited about
  `--delay-ms` for it.

Prints the straggler ranks on its last line: `stragglers: 5,77`.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "..", "shared", "traces", "pytorch", "fsdp_gpt_4rank")
RANKS_PER_HOST = 8


def _load_sources(source: str) -> list[tuple[str, dict]]:
    out = []
    for r in range(4):
        found = sorted(glob.glob(os.path.join(source, f"rank{r}.*.pt.trace.json*")))
        if not found:
            sys.exit(f"synth_ranks: no rank{r} trace in {source}")
        opener = gzip.open if found[0].endswith(".gz") else open
        with opener(found[0], "rt") as f:
            out.append((os.path.basename(found[0]), json.load(f)))
    return out


def _is_comm(e: dict) -> bool:
    return "Collective name" in e.get("args", {})


def _nccl_kernels(trace: dict) -> list[int]:
    """Indexes of the NCCL kernels in `traceEvents`, by start time."""
    ev = trace["traceEvents"]
    idx = [i for i, e in enumerate(ev) if e.get("cat") == "kernel" and _is_comm(e)]
    return sorted(idx, key=lambda i: ev[i]["ts"])


def _split(text: str, n: int) -> str:
    try:
        parts = json.loads(text)
    except ValueError:
        return text
    if not isinstance(parts, list) or not parts:
        return text
    total = sum(int(p) for p in parts)
    each, extra = divmod(total, n)
    return json.dumps([each + (1 if i < extra else 0) for i in range(n)])


def _rewrite_args(args: dict, rank: int, n: int, ranks_text: str) -> dict:
    a = dict(args)
    shard_in, shard_out = a.get("In msg nelems"), a.get("Out msg nelems")
    name = str(a.get("Collective name", ""))
    if "allgather" in name or "all_gather" in name:
        if isinstance(shard_in, int):
            a["Out msg nelems"] = shard_in * n
    elif "reduce_scatter" in name:
        if isinstance(shard_out, int):
            a["In msg nelems"] = shard_out * n
    for key in ("In split size", "Out split size"):
        if isinstance(a.get(key), str) and a[key].strip() not in ("", "[]"):
            a[key] = _split(a[key], n)
    if "Group size" in a:
        a["Group size"] = n
    if "Process Group Ranks" in a:
        a["Process Group Ranks"] = ranks_text
    if "Rank" in a:
        a["Rank"] = rank
    if "Global rank start" in a:
        a["Global rank start"] = 0
    return a


class Template:
    """One source trace, pre-serialised: the events no rank changes as JSON text once, the
    ones that change (communication ops and kernels) kept as objects."""

    def __init__(self, name: str, trace: dict):
        self.name = name
        self.header = {k: v for k, v in trace.items() if k != "traceEvents"}
        ev = trace["traceEvents"]
        self.kernels = _nccl_kernels(trace)
        changing = {i for i, e in enumerate(ev) if _is_comm(e)}
        self.pieces: list[str | int] = []
        run: list[dict] = []
        for i, e in enumerate(ev):
            if i in changing:
                if run:
                    self.pieces.append(",".join(json.dumps(x) for x in run))
                    run = []
                self.pieces.append(i)
            else:
                run.append(e)
        if run:
            self.pieces.append(",".join(json.dumps(x) for x in run))
        self.events = ev

    def render(self, rank: int, n: int, base_shift_ns: int, kernel_dur: dict[int, float]) -> bytes:
        ranks_text = json.dumps(list(range(n)))
        header = json.loads(json.dumps(self.header))
        dist = header.setdefault("distributedInfo", {})
        dist["rank"], dist["world_size"] = rank, n
        for pg in dist.get("pg_config") or []:
            pg["pg_size"], pg["ranks"] = n, list(range(n))
        header["baseTimeNanoseconds"] = int(header.get("baseTimeNanoseconds", 0)) + base_shift_ns
        parts = []
        for p in self.pieces:
            if isinstance(p, str):
                parts.append(p)
                continue
            e = dict(self.events[p])
            e["args"] = _rewrite_args(e["args"], rank, n, ranks_text)
            if p in kernel_dur:
                e["dur"] = round(kernel_dur[p], 3)
            parts.append(json.dumps(e))
        head = json.dumps(header)
        text = head[:-1] + ', "traceEvents": [' + ",".join(parts) + "]}"
        return gzip.compress(text.encode(), compresslevel=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", type=int, help="ranks to make (4 or more)")
    p.add_argument("out", help="directory to write (created; must be empty or absent)")
    p.add_argument("--stragglers", help="straggler ranks, comma-separated (default: random)")
    p.add_argument("--n-stragglers", type=int, default=1, help="random stragglers (default 1)")
    p.add_argument("--delay-ms", type=float, default=2.0, help="the others' extra wait per kernel")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--source", default=DEFAULT_SOURCE, help="the 4-rank FSDP trace directory")
    args = p.parse_args(argv)
    n = args.n
    if n < 4:
        p.error("N must be 4 or more")
    rng = random.Random(args.seed)
    if args.stragglers:
        stragglers = sorted({int(s) for s in args.stragglers.split(",")})
        if any(not 0 <= s < n for s in stragglers):
            p.error(f"straggler ranks must be within 0..{n - 1}")
    else:
        stragglers = sorted(rng.sample(range(n), args.n_stragglers))
    os.makedirs(args.out, exist_ok=True)
    if os.listdir(args.out):
        p.error(f"{args.out} is not empty")
    t0 = time.perf_counter()
    templates = [Template(name, trace) for name, trace in _load_sources(args.source)]
    counts = {len(t.kernels) for t in templates}
    if len(counts) != 1:
        sys.exit("synth_ranks: the source ranks have different numbers of NCCL kernels")
    names = [[t.events[i]["args"]["Collective name"] for i in t.kernels] for t in templates]
    if any(x != names[0] for x in names):
        sys.exit("synth_ranks: the source ranks' NCCL kernels are not in the same order")
    # The shortest source duration of each instance: the straggler's kernel duration.
    shortest = [min(t.events[t.kernels[k]]["dur"] for t in templates) for k in range(len(names[0]))]
    host_shift = {}
    delay_us = args.delay_ms * 1000.0
    total = 0
    for rank in range(n):
        t = templates[rank % 4]
        host = rank // RANKS_PER_HOST
        if host not in host_shift:
            host_shift[host] = rng.randint(-50_000_000, 50_000_000)
        shift = host_shift[host] + rng.randint(-20_000, 20_000)
        if rank in stragglers:
            dur = {i: shortest[k] for k, i in enumerate(t.kernels)}
        else:
            dur = {
                i: t.events[i]["dur"] + delay_us * (1.0 + 0.05 * rng.random()) for i in t.kernels
            }
        data = t.render(rank, n, shift, dur)
        ns = t.name.split(".")[1]
        with open(os.path.join(args.out, f"rank{rank}.{ns}.pt.trace.json.gz"), "wb") as f:
            f.write(data)
        total += len(data)
    print(
        f"wrote {n} rank files ({total / 1e6:.1f} MB) into {args.out} "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    print("stragglers: " + ",".join(str(s) for s in stragglers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
