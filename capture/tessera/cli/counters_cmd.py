"""Attach hardware counters to a run: re-run the training program under Nsight Compute.

RUN is a run written earlier by profile.session (or tessera-prof import). The program after
-- runs again under ncu; its session records only NVTX step and region markers there, and ncu
profiles the kernels of one recorded steady-state step (by default one instance of every
distinct kernel: name, grid, block). The counters are joined with RUN's kernels of every
recorded step (docs/CAPTURE.md, "Hardware counters"). Any error leaves RUN as it was.

Example:
  tessera-prof counters runs/gpt2 -- python train.py
  tessera-prof counters runs/gpt2 --kernels 'gemm|nvjet' --max-kernels 20 -- python train.py
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.usage = "tessera-prof counters RUN [options] -- PROGRAM [ARGS...]"
    p.add_argument("run_dir", metavar="RUN", help="run directory written by profile.session")
    p.add_argument(
        "--steps",
        help="step(s) to profile, e.g. 3 or 3,4 (default: the second recorded step)",
    )
    p.add_argument(
        "--all-launches",
        action="store_true",
        help="profile every launch of the step (default: one per distinct kernel)",
    )
    p.add_argument("--kernels", metavar="REGEX", help="only kernels whose name matches REGEX")
    p.add_argument(
        "--max-kernels",
        type=int,
        metavar="N",
        help="only the N distinct kernels with the most time in the step",
    )
    p.add_argument("--worker", help="worker of RUN the program is (needed with several)")
    p.add_argument("--ncu", metavar="PATH", help="the ncu executable (default: ncu on PATH)")
    p.add_argument("--save-csv", metavar="PATH", help="also keep ncu's raw-page CSV here")
    p.add_argument("--save-report", metavar="PATH", help="also keep the .ncu-rep here")
    p.add_argument("-v", "--verbose", action="store_true", help="show the program's own output")
    p.set_defaults(program=[])  # the training command after --, as it ran for RUN (main.py)


def _steps(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--steps {text!r}: expected step numbers like 3 or 3,4") from None


def run(args: argparse.Namespace) -> int:
    def fail(msg: str) -> int:
        print(f"tessera-prof counters: error: {msg}", file=sys.stderr)
        return 2

    program = list(args.program)
    if not program:
        return fail("no program: give the training command after --, e.g. -- python train.py")

    from tessera_tb.importers.ncu_attach import _choose_worker, run_kernel_sequence, store_counters
    from tessera_tb.importers.ncu_csv import read_ncu_csv
    from tessera_tb.importers.ncu_runner import (
        NcuError,
        NcuNoKernels,
        NcuUnknownMetric,
        export_raw_csv,
        find_ncu,
        profile_program,
    )
    from tessera_tb.importers.ncu_selection import (
        LATER_PASS_LAUNCHES,
        MAX_PASSES,
        collect_args,
        plan_counters,
    )
    from tessera_tb.importers.ncu_step_join import concat_tables, join_steps, nvtx_steps
    from tessera_tb.trace.errors import TraceFormatError
    from tessera_tb.trace.reader import open_run

    t_start = time.monotonic()
    try:
        run_ = open_run(args.run_dir)
        worker = _choose_worker(run_, args.worker)
        rk = run_kernel_sequence(run_, worker)
        plan = plan_counters(
            run_,
            worker,
            steps=_steps(args.steps),
            all_launches=args.all_launches,
            kernels=args.kernels,
            max_kernels=args.max_kernels,
            run_kernels=rk,
        )
        ncu = find_ncu(args.ncu)
    except (TraceFormatError, ValueError, NcuError) as exc:
        return fail(str(exc))
    print(plan.estimate_line(), flush=True)

    wanted_keys = None if plan.all_launches else _distinct_keys(plan)
    tables, only_bases, passes, runs, missing_before = [], None, 0, [], None
    dropped: list[str] = []  # named metrics ncu refused on this GPU
    with tempfile.TemporaryDirectory(prefix="tessera-counters-") as tmp:
        try:
            while True:
                passes += 1
                ncu_args = ["--clock-control", "none", *collect_args(without=dropped)]
                every = only_bases is not None and plan.launches_of(only_bases) <= max(
                    LATER_PASS_LAUNCHES, 3 * len(only_bases)
                )
                ncu_args += plan.filter_args(only_bases, every_launch=every)
                base = os.path.join(tmp, f"pass{passes}")
                print(f"pass {passes}: {shlex.join([ncu, *ncu_args, *program])}", flush=True)
                if only_bases is None:
                    expected = plan.kernels_to_profile
                else:
                    expected = plan.launches_of(only_bases) if every else len(only_bases)
                try:
                    result = profile_program(
                        ncu,
                        ncu_args,
                        program,
                        base,
                        expected=expected,
                        progress=lambda line: print(line, flush=True),
                        echo=(lambda line: print(line, flush=True)) if args.verbose else None,
                    )
                except NcuUnknownMetric as exc:
                    if "*" in dropped:
                        raise
                    # run again without the refused metric (or without every named metric
                    # when ncu did not name it): the sections still give the views theirs
                    dropped.append(exc.metric or "*")
                    print(f"{exc}; running the pass again without {exc.metric or 'them'}")
                    passes -= 1
                    continue
                except NcuNoKernels:
                    if passes == 1:
                        raise
                    # ncu's function names did not match those RUN knows (a mangled name):
                    # keep what the earlier passes measured.
                    print(f"pass {passes}: ncu profiled no kernel; keeping passes 1-{passes - 1}")
                    passes -= 1
                    break
                runs.append(result)
                csv_path = base + ".csv"
                export_raw_csv(ncu, result.report, csv_path)
                tables.append(read_ncu_csv(csv_path))
                table = concat_tables(tables)
                profile, info = join_steps(table, rk, worker=worker)
                if wanted_keys is None:
                    break
                missing = [k for k in info.missing_keys if k in wanted_keys]
                if not missing or passes >= MAX_PASSES or missing == missing_before:
                    break
                missing_before = missing
                only_bases = sorted({wanted_keys[k] for k in missing})
                print(
                    f"{len(missing)} distinct kernels got no counters in pass {passes}: another "
                    f"pass for {len(only_bases)} kernel function(s)",
                    flush=True,
                )
            problem = _check(table, info, nvtx_steps(table))
            if problem:
                raise NcuError(problem)
            for i, r in enumerate(runs, 1):
                if args.save_csv:
                    dest = args.save_csv if i == 1 else f"{args.save_csv}.pass{i}"
                    shutil.copyfile(os.path.join(tmp, f"pass{i}.csv"), dest)
                if args.save_report:
                    dest = args.save_report if i == 1 else f"{args.save_report}.pass{i}"
                    shutil.copyfile(r.report, dest)
            path = store_counters(args.run_dir, run_, profile)
        except (TraceFormatError, NcuError, OSError) as exc:
            return fail(str(exc))
    took = time.monotonic() - t_start
    ncu_s = sum(r.seconds for r in runs)
    print(
        f"attached counters of {info.profiled} profiled kernels (steps "
        f"{','.join(map(str, info.steps))}) to {args.run_dir} [{worker}] -> {path}"
    )
    print(
        f"  distinct kernels with counters: {info.distinct_covered} of {info.distinct_run}; run "
        f"launches: {info.launches_measured} measured, {info.launches_same_instance} "
        f"measured:same-kernel-instance, {info.launches_without} without"
    )
    for k in info.missing_keys[:5]:
        print(f"  no counters: {k}")
    print(f"took {took:.1f} s ({passes} ncu pass(es), {ncu_s:.1f} s under ncu)")
    return 0


def _distinct_keys(plan) -> dict[str, str]:
    """Join key -> ncu function name of the plan's distinct kernels."""
    from tessera_tb.importers.ncu_selection import kernel_key

    return {kernel_key(d.name, d.config): d.base for d in plan.distinct}


def _check(table, info, row_steps) -> str | None:
    """The one-line error for counters that do not fit RUN, or None."""
    import numpy as np

    in_step = int((row_steps >= 0).sum())
    if in_step == 0:
        return (
            "ncu profiled kernels outside the session's NVTX step ranges only: the program "
            "ran without profile.session (or without CUDA); run the script that wrote the run"
        )
    # a row is a kernel of the run's step whether it got a launch of its own or was another
    # sample of a kernel whose launches all had counters (a later pass)
    matched = info.profiled_matched + info.duplicates
    if matched < max(1, int(np.ceil(0.9 * in_step))):
        first = info.mismatches[0] if info.mismatches else "none"
        return (
            f"the program's kernels do not match the run: {matched} of {in_step} "
            f"profiled kernels of step {','.join(map(str, info.steps))} have a launch with the "
            f"same name, grid and block in the run; first mismatch: {first} -- run the same "
            "model, shapes and batch size as the run did, or capture a new run"
        )
    t = table.values.get("gpu__time_duration.sum")
    if t is not None:
        bad = np.flatnonzero(np.isnan(t))
        if bad.size:
            i = int(bad[0])
            return (
                f"ncu could not collect the counters of kernel #{table.ids[i]} "
                f"{str(table.kernel_names[i])[:80]} (no duration or metrics in its row) -- leave "
                "it out with --kernels REGEX and try again"
            )
    return None
