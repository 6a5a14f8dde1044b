"""Regenerate demo_runs/ from the real traces in ../shared/traces/pytorch.

    python scripts/make_demo_runs.py            # writes demo_runs/<run> for the three runs
    python scripts/make_demo_runs.py --check    # exits 1 if demo_runs/ lacks a run or a step

The runs are committed so `tensorboard --logdir demo_runs` works on a fresh checkout.
gpt_1gpu also gets the Nsight Compute counters of the same training loop, as
`tessera-prof import-ncu ../shared/traces/ncu/gpt_step_raw.csv demo_runs/gpt_1gpu` would.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from tessera_tb.importers.kineto_import import import_traces
from tessera_tb.importers.ncu_attach import import_ncu
from tessera_tb.trace import open_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = os.path.join(os.path.dirname(ROOT), "shared", "traces", "pytorch")
DEMO = os.path.join(ROOT, "demo_runs")

# run name -> directory of real traces
DEMO_RUNS = {
    "gpt_1gpu": "gpt_1gpu_stack",
    "ddp_gpt_2rank": "ddp_gpt_2rank",
    "fsdp_gpt_4rank": "fsdp_gpt_4rank",
}
# run name -> Nsight Compute raw-page CSV attached with import-ncu
NCU = os.path.join(os.path.dirname(TRACES), "ncu")
DEMO_COUNTERS = {"gpt_1gpu": os.path.join(NCU, "gpt_step_raw.csv")}


def make(logdir: str = DEMO) -> None:
    for run, source in DEMO_RUNS.items():
        dest = os.path.join(logdir, run)
        if os.path.isdir(dest):
            # Event files carry the writing time in their names: start clean, not beside old ones.
            shutil.rmtree(dest)
        result = import_traces([os.path.join(TRACES, source)], logdir, run)
        print(f"{run}: {result.events:,} events, {result.bytes_written / 1e6:.2f} MB")
        if run in DEMO_COUNTERS:
            r = import_ncu(DEMO_COUNTERS[run], dest).profile.report
            print(f"{run}: Nsight Compute counters, {r.matched} of {r.profiled_kernels} matched")


def check(logdir: str = DEMO) -> int:
    status = 0
    for run in DEMO_RUNS:
        try:
            r = open_run(os.path.join(logdir, run))
        except Exception as exc:  # noqa: BLE001 - report any failure to open
            print(f"{run}: {exc}")
            status = 1
            continue
        print(f"{run}: workers {sorted(r.workers)}, steps {r.steps}")
    return status


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    sys.exit(check() if args.check else make())
