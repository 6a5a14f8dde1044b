"""Pack a run into one bundle file to send to someone: a zip of the run directory with a
manifest (format version, run name, every file with its size and SHA-256).

RUN is a run directory (or a bundle, or a run URL such as s3://bucket/runs/exp1). Name the
bundle `*.tessera.zip`: dropped into a logdir, TensorBoard's Tessera tab lists it as a run
without unpacking it; `tessera-prof unpack` turns it back into a run directory.

Example:
  tessera-prof pack runs/exp1 -o exp1.tessera.zip --workers rank0,rank1 --steps 5-6
"""

from __future__ import annotations

import argparse
import sys

from tessera_tb.importers.kineto_import import parse_steps
from tessera_tb.trace.bundle import BUNDLE_SUFFIX, pack_run
from tessera_tb.trace.errors import TraceFormatError


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="run directory (or bundle, or run URL)")
    p.add_argument("-o", "--output", required=True, help="bundle to write (*.tessera.zip)")
    p.add_argument("--workers", help="comma-separated workers to pack (default: all)")
    p.add_argument("--steps", help="steps to pack, e.g. 5-6,9 (default: all)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle")


def run(args: argparse.Namespace) -> int:
    try:
        workers = (
            [w.strip() for w in args.workers.split(",") if w.strip()] if args.workers else None
        )
        steps = sorted(parse_steps(args.steps)) if args.steps else None
        result = pack_run(args.run, args.output, workers, steps, overwrite=args.overwrite)
    except (TraceFormatError, ValueError, OSError) as exc:
        print(f"tessera-prof pack: error: {exc}", file=sys.stderr)
        return 2
    if not args.output.endswith(BUNDLE_SUFFIX):
        print(
            f"tessera-prof pack: note: TensorBoard lists a bundle in a logdir only when its "
            f"name ends with {BUNDLE_SUFFIX}",
            file=sys.stderr,
        )
    print(
        f"packed {len(result.files)} files of run {result.run} (workers "
        f"{', '.join(result.workers)}; steps {', '.join(map(str, result.steps))}): "
        f"{result.uncompressed_bytes / 1e6:.2f} MB in {result.bundle_bytes / 1e6:.2f} MB "
        f"-> {result.path}"
    )
    return 0
