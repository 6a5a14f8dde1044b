"""Which kernels `tessera-prof counters` asks Nsight Compute for, and with which sections.

The one place the collected sections and metrics are chosen (NCU_SECTIONS, NCU_METRICS): the
views (Stalls, Divergence, the measured roofline, the records' counter fields) and METRICS.md's
definitions read these. The metrics ncu's sections do not include are added by name.

Selection (docs/CAPTURE.md, "Hardware counters"): RUN already holds every launch of the
chosen step with its name, grid and block, in launch order. The program runs again under ncu,
where the session opens a start/end NVTX range `tessera_step_N` per step; ncu's NVTX filter
(`--nvtx --nvtx-include tessera_step_N`) keeps the launches of that step only, and

- by default `--filter-mode per-launch-config --launch-count 1` profiles the first launch of
  each launch configuration (function, grid, block, shared memory) of the step: one instance
  per distinct kernel, in launch order. A kernel RUN knows that ncu did not profile in a pass
  (if ncu's configuration key were coarser than ours) gets a further pass restricted to
  those kernels' function names (`--kernel-name regex:...`), every launch of them when they
  are at most LATER_PASS_LAUNCHES launches, at most MAX_PASSES passes in all;
- `all_launches` profiles every launch of the step (the exact join: launch order);
- `kernels` (a regular expression searched in the run's kernel names) and `max_kernels` (the
  distinct kernels with the most time in the step) narrow the distinct kernels; ncu is then
  told their function names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tessera_tb.importers.kernel_names import kernel_base_name, kernel_name_key
from tessera_tb.importers.ncu_attach import RunKernels, launch_config, run_kernel_sequence
from tessera_tb.nvtx_names import step_range_name
from tessera_tb.trace.reader import Run

NCU_SECTIONS = (
    "SpeedOfLight",
    "Occupancy",
    "WarpStateStats",
    "LaunchStats",
    "ComputeWorkloadAnalysis",
    "MemoryWorkloadAnalysis",
    "SpeedOfLight_RooflineChart",
    "SpeedOfLight_HierarchicalTensorRooflineChart",
    "InstructionStats",
    "SchedulerStats",
)
# Named metrics METRICS.md needs beyond the sections: issued instructions (stall weights),
# divergence, branch uniformity, DRAM bytes and rates, L2 hit rate, shared-memory bank
# conflicts, measured occupancy, issue efficiency, tensor pipe utilisation, and the SASS
# floating-point instruction counts with the elapsed cycles (FP32/FP64/FP16 FLOPs; the
# sections give only their per-cycle rates, METRICS.md "Roofline").
_SASS_OPS = ("dadd", "dmul", "dfma", "fadd", "fmul", "ffma", "hadd", "hmul", "hfma")
NCU_METRICS = (
    *(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum" for op in _SASS_OPS),
    "smsp__cycles_elapsed.avg",
    "smsp__cycles_active.avg",
    "dram__bytes_read.sum.per_second",
    "dram__bytes_write.sum.per_second",
    "smsp__inst_issued.sum",
    "smsp__thread_inst_executed_per_inst_executed.ratio",
    "smsp__sass_average_branch_targets_threads_uniform.pct",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sector_hit_rate.pct",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
)
# Measured on an H100 with these sections: 27 replay passes and about 0.8 s per profiled
# kernel (GPT-2: 388 launches in 312 s; ResNet-50: 250 launches in 189 s).
PASSES_PER_KERNEL = 27
SECONDS_PER_KERNEL = 0.8
MAX_PASSES = 3
LATER_PASS_LAUNCHES = 100


def collect_args(without: list[str] | None = None) -> list[str]:
    """ncu options selecting the sections and metrics (no kernel filters); `without`: named
    metrics to leave out ("*": all of them), those an older ncu or another GPU refused."""
    out = []
    for s in NCU_SECTIONS:
        out += ["--section", s]
    skip = set(without or ())
    metrics = [] if "*" in skip else [m for m in NCU_METRICS if m not in skip]
    return out + (["--metrics", ",".join(metrics)] if metrics else [])


@dataclass
class DistinctKernel:
    """One (name, grid, block) of the chosen step."""

    name: str  # as the run spells it
    base: str  # ncu's function name
    config: str | None  # "grid 8,1,1 block 256,1,1"
    first_launch: int  # index of its first launch within the step
    launches: int
    dur_ns: int  # summed over its launches in the step


@dataclass
class Plan:
    """What one `tessera-prof counters` run profiles."""

    worker: str
    steps: list[int]
    step_launches: int  # launches of the chosen steps in RUN
    distinct: list[DistinctKernel]  # the distinct kernels chosen (after --kernels/--max-kernels)
    all_distinct: int  # distinct kernels of the steps before narrowing
    all_kernels: list[DistinctKernel]  # every distinct kernel of the steps
    all_launches: bool
    narrowed: bool
    notes: list[str] = field(default_factory=list)

    @property
    def kernels_to_profile(self) -> int:
        if self.all_launches:
            return sum(d.launches for d in self.distinct)
        return len(self.distinct)

    def estimate_s(self) -> float:
        return self.kernels_to_profile * SECONDS_PER_KERNEL

    def estimate_line(self) -> str:
        n = self.kernels_to_profile
        steps = ",".join(str(s) for s in self.steps)
        what = (
            f"every launch of step {steps}"
            if self.all_launches
            else f"one instance of each of {len(self.distinct)} distinct kernels"
            + (f" (of {self.all_distinct})" if self.narrowed else "")
            + f" of step {steps} ({self.step_launches} launches)"
        )
        return (
            f"profiling {what}: {n} kernels x {PASSES_PER_KERNEL} passes, about "
            f"{self.estimate_s():.0f} s of profiling on an H100 (measured {SECONDS_PER_KERNEL} s "
            "per kernel) plus the program's own run"
        )

    def filter_args(
        self, only_bases: list[str] | None = None, every_launch: bool = False
    ) -> list[str]:
        """ncu's kernel filters for this plan; a later pass: `only_bases` (function names),
        and `every_launch` to profile every launch of them in the step."""
        args = ["--nvtx"]
        for s in self.steps:
            args += ["--nvtx-include", step_range_name(s)]
        bases = only_bases
        if bases is None and self.narrowed:
            bases = sorted({d.base for d in self.distinct})
        if bases:
            alternatives = "|".join(re.escape(b) for b in sorted(set(bases)))
            args += ["--kernel-name-base", "function", "--kernel-name", f"regex:^({alternatives})$"]
        elif not (self.all_launches or every_launch):
            # ncu's launch configuration key names the kernel by --kernel-name-base: under the
            # default (`function`) every instantiation of a template kernel with the same grid
            # and block is one configuration (seen on an H100: 21 of GPT-2's 83 distinct
            # kernels never profiled); the demangled name keeps them apart, as our key does.
            args += ["--kernel-name-base", "demangled"]
        if not (self.all_launches or every_launch):
            args += ["--filter-mode", "per-launch-config", "--launch-count", "1"]
        return args

    def launches_of(self, bases: list[str]) -> int:
        """Launches in the chosen steps of the kernels with these function names."""
        wanted = set(bases)
        return sum(d.launches for d in self.all_kernels if d.base in wanted)


def kernel_key(name: str, config: str | None) -> str:
    """The join key of a distinct kernel: spelling-independent name + launch configuration."""
    return kernel_name_key(name) + " | " + (config or "?")


def recorded_steps(run: Run, worker: str) -> list[int]:
    return list(run.worker(worker).steps)


def steady_step(steps: list[int]) -> int:
    """The default step: the second recorded step (the first can still warm caches and
    allocators), the only one when there is one."""
    return steps[1] if len(steps) > 1 else steps[0]


def plan_counters(
    run: Run,
    worker: str,
    *,
    steps: list[int] | None = None,
    all_launches: bool = False,
    kernels: str | None = None,
    max_kernels: int | None = None,
    run_kernels: RunKernels | None = None,
) -> Plan:
    """The plan for `tessera-prof counters` from the launches RUN recorded.

    Raises ValueError (a step RUN does not have, a bad regular expression, nothing left).
    """
    have = recorded_steps(run, worker)
    if not have:
        raise ValueError(f"run {run.path} has no recorded steps for {worker}")
    chosen = list(steps) if steps else [steady_step(have)]
    missing = [s for s in chosen if s not in have]
    if missing:
        raise ValueError(
            f"run {run.path} has no step {missing[0]} for {worker}; its steps: "
            + ",".join(str(s) for s in have)
        )
    rk = run_kernels if run_kernels is not None else run_kernel_sequence(run, worker)
    durs = _kernel_durations(run, worker, rk)
    in_steps = np.isin(rk.step, chosen)
    names, configs, dur = rk.names[in_steps], rk.launch_config[in_steps], durs[in_steps]
    if names.size == 0:
        raise ValueError(f"step {chosen[0]} of {run.path} has no kernels: nothing to profile")
    first_step = rk.step[in_steps] == chosen[0]
    table: dict[str, DistinctKernel] = {}
    for i, (name, config, d) in enumerate(zip(names, configs, dur)):
        key = kernel_key(name, config)
        k = table.get(key)
        if k is None:
            table[key] = DistinctKernel(
                str(name),
                kernel_base_name(str(name)),
                config,
                i if first_step[i] else -1,
                1,
                int(d),
            )
        else:
            k.launches += 1
            k.dur_ns += int(d)
    distinct = list(table.values())
    narrowed = False
    if kernels:
        try:
            rx = re.compile(kernels)
        except re.error as exc:
            raise ValueError(f"--kernels {kernels!r} is not a regular expression ({exc})") from None
        distinct = [d for d in distinct if rx.search(d.name)]
        narrowed = True
        if not distinct:
            raise ValueError(
                f"--kernels {kernels!r} matches none of the {len(table)} distinct kernels of "
                f"step {chosen[0]}"
            )
    if max_kernels is not None and max_kernels < len(distinct):
        if max_kernels < 1:
            raise ValueError("--max-kernels must be at least 1")
        distinct = sorted(distinct, key=lambda d: -d.dur_ns)[:max_kernels]
        distinct.sort(key=lambda d: d.first_launch)
        narrowed = True
    return Plan(
        worker=worker,
        steps=chosen,
        step_launches=int(names.size),
        distinct=distinct,
        all_distinct=len(table),
        all_kernels=list(table.values()),
        all_launches=all_launches,
        narrowed=narrowed,
    )


def _kernel_durations(run: Run, worker: str, rk: RunKernels) -> np.ndarray:
    out = np.zeros(rk.step.size, dtype=np.int64)
    for s in np.unique(rk.step):
        sel = np.flatnonzero(rk.step == s)
        st = run.load_step(worker, int(s))
        out[sel] = st.events["dur_ns"][rk.row[sel]]
    return out


def kernel_counter_coverage(run_dir: str, worker: str) -> tuple[set[str], set[str]]:
    """(the distinct kernels of the step `tessera-prof counters` profiles by default, those of
    them without counters of their own launch), as join keys (`kernel_key`): what the command
    reports as "distinct kernels with counters"."""
    from tessera_tb.trace import open_run
    from tessera_tb.trace.kernel_counters import MATCH_NAME, load_kernel_counters

    run = open_run(run_dir)
    plan = plan_counters(run, worker)
    counters = load_kernel_counters(run_dir, worker)
    own = (counters.match == MATCH_NAME) & (counters.step == plan.steps[0])
    step = run.load_step(worker, plan.steps[0])
    rows = counters.row[own]
    config = launch_config(
        step.attr("grid").reindex(rows).to_numpy(object),
        step.attr("block").reindex(rows).to_numpy(object),
    )
    names = step.string_values(step.events["name_id"][rows])
    covered = {kernel_key(n, c) for n, c in zip(names, config)}
    wanted = {kernel_key(d.name, d.config) for d in plan.distinct}
    return wanted, wanted - covered
