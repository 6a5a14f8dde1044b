"""Findings that cite Nsight Compute counters (kind `kernel_counters`), one per kernel.

Only for kernels with counters (`tessera-prof counters` or `import-ncu`), over the selected
steps. For each kernel name:

- time per step: the run's durations of its launches with counters, summed, / steps;
- speed of light (SOL) %: per launch the larger of ncu's `sm__throughput` and
  `gpu__compute_memory_throughput` (`.avg.pct_of_peak_sustained_elapsed`, SpeedOfLight
  section): how close its busiest unit came to peak; duration-weighted over its launches;
- the rule and the win: a kernel whose busiest unit runs at SOL % of peak could at best take
  SOL/100 of its time, so win = time x (1 - SOL/100) ("speed-of-light headroom"); an upper
  bound, reached only if the kernel became bound by that unit at its peak;
- the evidence: its largest warp-stall reasons as shares of its stall cycles
  (`stalls.stall_breakdown`, METRICS.md "Stalls"), DRAM throughput % of peak
  (`gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed`), measured occupancy, and how
  many launches have their own counters (`measured`) or their kernel instance's
  (`measured:same-kernel-instance`).

Title: "`<kernel>`: 62% of stall cycles on long scoreboard; DRAM at 81% of peak". The
`TOP_KERNELS` kernels with the largest wins at or above `min_win_pct` of the step are reported.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tessera_tb.backend.counter_join import counter_instances, worker_profiles
from tessera_tb.trace.kernel_counters import MATCH_INSTANCE
from tessera_tb.trace.reader import Run

KIND = "kernel_counters"
TOP_KERNELS = 5
SM_SOL = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM_SOL = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_PCT = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
_METRICS = [SM_SOL, MEM_SOL, DRAM_PCT, "sm_occupancy"]
_STALL_CATEGORY_WORDS = {
    "long_scoreboard": "long scoreboard (waiting on L1TEX: global, local, texture loads)",
    "short_scoreboard": "short scoreboard (shared memory, MUFU)",
    "barrier": "barrier (on Hopper also waiting for tensor-core results)",
    "gmma": "gmma (warpgroup MMA)",
}


def _short(name: str, limit: int = 70) -> str:
    """The kernel name without `void` and the at::native namespaces, cut to `limit`."""
    name = str(name).removeprefix("void ")
    for ns in ("at::native::", "(anonymous namespace)::", "<unnamed>::"):
        name = name.replace(ns, "")
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _weighted(values: np.ndarray, weights: np.ndarray) -> float:
    ok = np.isfinite(values) & np.isfinite(weights) & (weights > 0)
    return float(np.average(values[ok], weights=weights[ok])) if ok.any() else float("nan")


def counter_findings(
    run: Run,
    workers: Sequence[str],
    steps_of: dict[str, tuple[int, ...]],
    span_of: dict[str, float],
    min_win_pct: float,
    link=None,
    top: int = TOP_KERNELS,
) -> list[dict]:
    """`kernel_counters` findings of the selected workers (module docstring): rows with the
    columns of `findings.findings`. `link(kind, subject, numbers, worker, steps)` makes the
    deep link."""
    from tessera_tb.backend.stalls import stall_breakdown

    profiles = worker_profiles(run, workers)
    rows = []
    for worker in workers:
        profile = profiles.get(worker)
        steps = steps_of.get(worker, ())
        span = span_of.get(worker, 0.0)
        if profile is None or not steps or not span:
            continue
        inst = counter_instances(run, _METRICS, workers=[worker], steps=steps, profiles=profiles)
        if inst.empty:
            continue
        stalls = stall_breakdown(run, workers=[worker], steps=steps, group_by="kernel")
        table = stalls.table if stalls.available else None
        rank = int(run.worker(worker).meta.rank)
        inst["sol_pct"] = np.fmax(inst[SM_SOL].to_numpy(float), inst[MEM_SOL].to_numpy(float))
        inst["same_instance"] = profile.match[inst["profile_index"].to_numpy()] == MATCH_INSTANCE
        found = []
        for name, g in inst.groupby("kernel_name", sort=False):
            dur = g["dur_ns"].to_numpy(float)
            time_ns = float(dur.sum()) / len(steps)
            sol = _weighted(g["sol_pct"].to_numpy(float), dur)
            if not np.isfinite(sol):
                continue
            win_ns = time_ns * max(0.0, 1.0 - sol / 100.0)
            pct = 100.0 * win_ns / span
            if win_ns <= 0 or pct < min_win_pct:
                continue
            reasons: list[tuple[str, float]] = []
            if table is not None:
                mine = table[(table.kernel_name == name) & (table.category != "not a stall")]
                reasons = [(str(r), float(s)) for r, s in zip(mine.reason, mine.share_pct)][:3]
            numbers = {
                "win_ns": win_ns,
                "span_ns": span,
                "kernel_ns_per_step": time_ns,
                "launches_per_step": len(g) / len(steps),
                "sol_pct": sol,
                "sm_sol_pct": _weighted(g[SM_SOL].to_numpy(float), dur),
                "memory_sol_pct": _weighted(g[MEM_SOL].to_numpy(float), dur),
                "dram_pct_of_peak": _weighted(g[DRAM_PCT].to_numpy(float), dur),
                "sm_occupancy_pct": _weighted(g["sm_occupancy"].to_numpy(float), dur),
                "measured_launches": float((~g["same_instance"]).sum()),
                "same_instance_launches": float(g["same_instance"].sum()),
                "stalls": reasons,
                "kernel": str(name),
            }
            found.append((win_ns, pct, name, numbers))
        found.sort(key=lambda f: -f[0])
        for win_ns, pct, name, numbers in found[:top]:
            title, evidence = describe_counter_finding(numbers)
            rows.append(
                {
                    "worker": worker,
                    "rank": rank,
                    "steps": tuple(steps),
                    "kind": KIND,
                    "subject": str(name),
                    "title": title,
                    "win_ms_per_step": win_ns / 1e6,
                    "win_pct_of_step": pct,
                    "severity": "high" if pct >= 10 else "medium" if pct >= 5 else "low",
                    "evidence": evidence,
                    "numbers": numbers,
                    "link": link(KIND, str(name), numbers, worker, tuple(steps)) if link else "",
                }
            )
    return rows


def describe_counter_finding(n: dict) -> tuple[str, str]:
    """(title, evidence) of a `kernel_counters` finding from its numbers."""
    short = _short(n["kernel"])
    parts = []
    if n["stalls"]:
        reason, share = n["stalls"][0]
        parts.append(f"{share:.0f}% of stall cycles on {reason.replace('_', ' ')}")
    if np.isfinite(n["dram_pct_of_peak"]):
        parts.append(f"DRAM at {n['dram_pct_of_peak']:.0f}% of peak")
    title = f"`{short}`: " + ("; ".join(parts) or f"{n['sol_pct']:.0f}% of speed of light")
    stalls = ", ".join(
        f"{_STALL_CATEGORY_WORDS.get(r, r.replace('_', ' '))} {s:.0f}%" for r, s in n["stalls"]
    )
    how = f"{n['measured_launches']:.0f} launch(es) measured"
    if n["same_instance_launches"]:
        how += (
            f", {n['same_instance_launches']:.0f} with the counters of the same kernel's "
            "profiled instance (measured:same-kernel-instance)"
        )
    evidence = (
        f"{n['kernel']}: {n['launches_per_step']:.0f} launch(es), "
        f"{n['kernel_ns_per_step'] / 1e6:.2f} ms per step. Nsight Compute: speed of light "
        f"{n['sol_pct']:.0f}% (SM {n['sm_sol_pct']:.0f}%, memory {n['memory_sol_pct']:.0f}% of "
        f"peak), DRAM {n['dram_pct_of_peak']:.0f}% of peak, occupancy "
        f"{n['sm_occupancy_pct']:.0f}%"
        + (f"; stall cycles: {stalls}" if stalls else "")
        + f" ({how}). Rule: speed-of-light headroom, win = kernel time x (1 - SOL/100), the "
        "time left if its busiest unit ran at peak (an upper bound)"
    )
    return title, evidence
