"""The writer process: runs the `StepAssembler` (and the NVML sampler) beside a training process.

Started by `background.ProcessWriter` as `python -m tessera.profile.writer_process IN OUT`
with two pipe file descriptors: messages come in on IN (pickled tuples, framed by
`multiprocessing.connection.Connection`), reports go out on OUT. It runs at a lower CPU
priority, ignores SIGINT (Ctrl-C belongs to the training loop), and when IN closes without a
"close" message (the training process died) it writes everything it was handed, closes the
run's files, removes the session's window directory and exits (the steps of a window that
never arrived are dropped).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from multiprocessing.connection import Connection

NICE_INCREMENT = 10


def lower_priority() -> None:
    """Run only when a CPU would otherwise idle (SCHED_IDLE), else at nice +10.

    A CPU-bound training loop that uses every core (intra-op threads) slows down sharply
    when another process takes a core from one of its threads; SCHED_IDLE gives the writer
    only time that no one else wants (bench/capture_overhead.py measures it).
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    with contextlib.suppress(OSError, AttributeError):
        os.nice(NICE_INCREMENT)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lower_priority()
    conn_in = Connection(int(argv[0]), writable=False)
    conn_out = Connection(int(argv[1]), readable=False)

    def report(msg: tuple) -> None:
        with contextlib.suppress(OSError):
            conn_out.send(msg)

    try:
        first = conn_in.recv()
    except (EOFError, OSError):
        return 0
    config = first[1]
    nvml = None
    if config.get("nvml") is not None:
        # The sampler first, before the heavy imports below: recorded steps need its samples.
        from tessera.profile.sources.nvml_source import NvmlSampler

        nv = config["nvml"]
        nvml = NvmlSampler(
            nv["interval_ms"],
            nv["devices"],
            on_error=lambda msg: report(("warn", "nvml-error", f"tessera capture: {msg}")),
        )
        nvml.start()
        cap = nvml.capability
        report(("capability", cap.name, cap.status, cap.reason))
    from tessera.profile.background import assembler_stats, make_assembler

    assembler = make_assembler(config, report, nvml=nvml)
    assembler.open()
    orphaned = True
    try:
        while True:
            try:
                msg = conn_in.recv()
            except (EOFError, OSError):
                break  # the training process is gone: finish what was handed over
            if msg[0] == "close":
                orphaned = False
                break
            assembler.handle(msg)
    finally:
        assembler.finish(orphaned=orphaned)
        tmpdir = config.get("tmpdir")
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
        report(("done", assembler_stats(assembler)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
