"""Attach Nsight Compute counters (a raw-page CSV) to the kernels of an imported run.

REPORT is the CSV of `ncu --import REPORT.ncu-rep --csv --page raw > REPORT.csv`, or the
.ncu-rep itself when ncu is on PATH. Rows inside the session's NVTX step ranges
(`tessera_step_N`) are joined by step and launch order or by kernel instance, as
`tessera-prof counters` does; other reports by kernel name and launch order. What did not
match is reported. With --counter-only (or when nothing
matches) the counters are stored without kernel links.

Example:
  tessera-prof import-ncu gpt_step_raw.csv runs/gpt
"""

from __future__ import annotations

import argparse
import sys

from tessera_tb.importers.ncu_attach import import_ncu
from tessera_tb.trace.errors import TraceFormatError
from tessera_tb.trace.kernel_counters import METHOD_NAME_ORDER


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "csv", metavar="REPORT", help="ncu --csv --page raw output, or a .ncu-rep (needs ncu)"
    )
    p.add_argument("run_dir", metavar="RUN", help="run directory (made by tessera-prof import)")
    p.add_argument("--worker", help="worker the counters belong to (needed with several)")
    p.add_argument(
        "--counter-only", action="store_true", help="store the counters without kernel links"
    )
    p.add_argument("--overwrite", action="store_true", help="replace existing kernel counters")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")


def run(args: argparse.Namespace) -> int:
    try:
        result = import_ncu(
            args.csv,
            args.run_dir,
            worker=args.worker,
            counter_only=args.counter_only,
            overwrite=args.overwrite,
        )
    except (TraceFormatError, ValueError) as exc:
        print(f"tessera-prof import-ncu: error: {exc}", file=sys.stderr)
        return 2
    if args.quiet:
        return 0
    p, r = result.profile, result.profile.report
    print(f"{r.profiled_kernels or p.count} profiled kernels from {p.source} -> {result.path}")
    if p.match_method == METHOD_NAME_ORDER:
        print(
            f"{p.match_note}: {r.matched} matched by name, {r.matched_base_name} by base name, "
            f"{r.mismatched} mismatched, {r.outside} outside the run's {r.run_kernels} kernels "
            f"(first profiled kernel = run kernel {r.offset}"
            + (f"; {r.tied_offsets} other offsets fit as well" if r.tied_offsets else "")
            + ")"
        )
    else:
        print(p.match_note)
    for line in r.first_mismatches:
        print(f"  not matched: {line}")
    for note in result.notes:
        print(f"tessera-prof import-ncu: note: {note}", file=sys.stderr)
    return 0
