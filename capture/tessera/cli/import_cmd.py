"""Import PyTorch profiler (Kineto) traces into a TensorBoard log directory.

Takes .pt.trace.json / .json.gz files, or directories of them (one file per rank, as
torch.profiler.tensorboard_trace_handler writes them). NVML sample files named
nvml_<worker>.csv beside the traces become counter tracks.

--logdir may be an fsspec URL (s3://bucket/runs, gs://...; pip install
'tessera-profiler[s3]'): the run is imported locally, then uploaded file by file.

--dask SCHEDULER imports one rank per task on a Dask cluster (tcp://host:8786, or local:N);
each task writes its rank's files straight into the logdir, the run appears when all are done.

Example:
  tessera-prof import runs_raw/ddp/ --logdir runs --run ddp
"""

from __future__ import annotations

import argparse
import sys
import time

from tessera_tb.importers import kineto_decode
from tessera_tb.importers.kineto_import import ImportFailed, import_traces, parse_steps
from tessera_tb.trace import layout


def prepare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories of them")
    p.add_argument("--logdir", required=True, help="TensorBoard log directory to write into")
    p.add_argument("--run", help="run name (default: the directory or worker name)")
    p.add_argument("--steps", help="steps to import, e.g. 4-6,9 (default: all)")
    p.add_argument("--workers", help="comma-separated workers to import, e.g. rank0,rank1")
    p.add_argument("--nvml", metavar="FILE", help="NVML sample CSV for a single-worker import")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run")
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="workers (ranks) to import at once (default: the CPUs, at most 4; 1: one by one)",
    )
    p.add_argument(
        "--dask",
        metavar="SCHEDULER",
        help="import one rank per task on a Dask cluster: tcp://host:8786, or local:N for N "
        "worker processes here (pip install 'tessera-profiler[dask]'; docs/SHARING.md)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - started:6.2f}s] {msg}", file=sys.stderr, flush=True)

    if kineto_decode._kineto_scan is None:
        progress(
            "note: the C trace scanner is not built (no C compiler when tessera-profiler was "
            "installed), so traces are read by the pure-Python path, several times slower; "
            "reinstall with gcc and Python's headers (python3-dev) to build it"
        )
    try:
        if args.jobs < 0:
            raise ValueError(f"--jobs must be 0 (automatic) or more, not {args.jobs}")
        steps = parse_steps(args.steps) if args.steps else None
        workers = (
            {w.strip() for w in args.workers.split(",") if w.strip()} if args.workers else None
        )
        importer = import_traces
        extra = {}
        if args.dask and layout.is_url(args.logdir):  # tasks upload straight to the URL
            from tessera_tb.importers.dask_import import import_traces_dask_to_url as importer
        elif layout.is_url(args.logdir):  # written locally, then uploaded (trace/remote.py)
            from tessera_tb.trace.remote import import_traces_to_url as importer
        if args.dask:
            extra["dask"] = args.dask
        result = importer(
            args.paths,
            args.logdir,
            args.run,
            steps=steps,
            workers=workers,
            nvml=args.nvml,
            overwrite=args.overwrite,
            progress=progress,
            jobs=args.jobs,
            **extra,
        )
    except (ImportFailed, ValueError) as exc:
        print(f"tessera-prof import: error: {exc}", file=sys.stderr)
        return 2
    for w in result.warnings:
        print(f"tessera-prof import: warning: {w}", file=sys.stderr)
    mb = result.json_bytes / 1e6
    print(
        f"imported {result.events:,} events ({mb:.1f} MB of JSON) from "
        f"{sum(len(w.files) for w in result.workers)} file(s) into {result.run_dir}: "
        + _workers_and_steps(result.workers)
        + f" in {result.seconds:.2f} s ({mb / max(result.seconds, 1e-9):.1f} MB/s); "
        f"{result.bytes_written / 1e6:.2f} MB on disk"
    )
    return 0


# Past this many workers the summary counts workers per step range instead of naming each.
NAMED_WORKERS = 16


def _workers_and_steps(workers) -> str:
    """ "rank0 steps 4-6, rank1 steps 4-6", or for many workers "1024 workers steps 4-6"."""
    if len(workers) <= NAMED_WORKERS:
        return ", ".join(f"{w.worker} steps {_ranges(w.steps)}" for w in workers)
    by_range: dict[str, int] = {}
    for w in workers:
        key = _ranges(w.steps)
        by_range[key] = by_range.get(key, 0) + 1
    return ", ".join(f"{n} workers steps {r}" for r, n in by_range.items())


def _ranges(steps: list[int]) -> str:
    steps = sorted(steps)
    if not steps:
        return "none"
    parts, lo, prev = [], steps[0], steps[0]
    for s in steps[1:] + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(str(lo) if lo == prev else f"{lo}-{prev}")
        if s is not None:
            lo = prev = s
    return ",".join(parts)
