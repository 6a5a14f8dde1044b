"""Unpack a bundle (`tessera-prof pack`) into a run directory, after checking it: member
names (no path escapes, absolute paths or symlinks), size limits (zip bombs) and every file
against the SHA-256 in its manifest. Nothing is written unless the whole bundle is sound.

Give the run directory (-o DIR), or a logdir (--logdir DIR, with --run NAME or the run name
the bundle was packed under).

Examples:
  tessera-prof unpack exp1.tessera.zip -o runs/exp1
  tessera-prof unpack exp1.tessera.zip --logdir runs
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from tessera_tb.trace import layout
from tessera_tb.trace.bundle import (
    DEFAULT_LIMITS,
    BundleFiles,
    safe_run_name,
    unpack_bundle,
)
from tessera_tb.trace.errors import TraceFormatError


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help="bundle file (*.tessera.zip)")
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("-o", "--output", metavar="DIR", help="run directory to create")
    dest.add_argument("--logdir", help="log directory to unpack the run into")
    p.add_argument("--run", help="run name under --logdir (default: the bundle's run name)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run")
    p.add_argument(
        "--max-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_total_bytes,
        help="refuse bundles that hold more bytes uncompressed "
        f"(default {DEFAULT_LIMITS.max_total_bytes:,})",
    )


def run(args: argparse.Namespace) -> int:
    limits = dataclasses.replace(DEFAULT_LIMITS, max_total_bytes=args.max_bytes)
    try:
        if args.output:
            if args.run:
                raise ValueError("--run goes with --logdir")
            run_dir = args.output
        else:
            if args.run:
                name = layout.check_run_name(args.run)
            else:
                files = BundleFiles(args.bundle, limits)
                name = safe_run_name(files.manifest.get("run"))
                files.close()
            run_dir = os.path.join(args.logdir, *name.split("/"))
        manifest = unpack_bundle(args.bundle, run_dir, overwrite=args.overwrite, limits=limits)
    except (TraceFormatError, ValueError, OSError) as exc:
        print(f"tessera-prof unpack: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"unpacked {len(manifest['files'])} files (run {manifest.get('run')!s}, every SHA-256 "
        f"checked) into {run_dir}"
    )
    return 0
