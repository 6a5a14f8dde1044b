"""A stand-in for Nsight Compute's `ncu` on a machine without a GPU (tests of
`tessera-prof counters`): it runs the program as ncu does, prints ncu's console lines, exits as
ncu does, and "profiles" by replaying a real ncu raw-page CSV taken on an H100.

Environment: FAKE_NCU_CSV (the CSV replayed), FAKE_NCU_MODE (ok, perm, kernelerr, nokernels,
na_row, coarse, badmetric), FAKE_NCU_LOG (each invocation's arguments are appended as one
JSON line).
`--filter-mode per-launch-config --launch-count 1` keeps the first row of each (kernel name,
grid, block), as ncu keeps the first launch of each launch configuration. The report file
it writes holds the CSV; `ncu --import REPORT --csv --page raw` prints it.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import subprocess
import sys

VALUE_OPTIONS = {
    "--export",
    "-o",
    "--clock-control",
    "--section",
    "--metrics",
    "--nvtx-include",
    "--kernel-name-base",
    "--kernel-name",
    "--filter-mode",
    "--launch-count",
    "--launch-skip",
    "--import",
    "--page",
}


def function_name(kernel: str) -> str:
    """ncu's `--kernel-name-base function`: the identifier without namespaces and templates."""
    return kernel.split("(")[0].split("<")[0].split()[-1].split("::")[-1]


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_NCU_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(argv) + "\n")
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in VALUE_OPTIONS:
            opts.setdefault(argv[i], []).append(argv[i + 1])
            i += 2
        else:
            opts.setdefault(argv[i], []).append("")
            i += 1
    program = argv[i:]
    if "--import" in opts:
        with open(opts["--import"][0], encoding="utf-8") as f:
            sys.stdout.write(f.read())
        return 0
    mode = os.environ.get("FAKE_NCU_MODE", "ok")
    refused = "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum"
    if mode == "badmetric" and refused in ",".join(opts.get("--metrics", [])):
        print(f"==ERROR== Failed to find metric {refused}")
        return 1
    print("==PROF== Connected to process 4242 (" + program[0] + ")", flush=True)
    if mode == "perm":
        print(
            "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
            "GPU Performance Counters on the target device 0. For instructions on enabling "
            "permissions and to get more information see https://developer.nvidia.com/"
            "ERR_NVGPUCTRPERM",
            flush=True,
        )
    proc = subprocess.run(program, capture_output=True, text=True)
    sys.stdout.write(proc.stdout + proc.stderr)
    if mode in ("perm", "nokernels"):
        print("==PROF== Disconnected from process 4242")
        print("==WARNING== No kernels were profiled.")
        return proc.returncode
    if proc.returncode != 0:
        print("==PROF== Disconnected from process 4242")
        print(f"==ERROR== The application returned an error code ({proc.returncode}).")
        return proc.returncode
    with open(os.environ["FAKE_NCU_CSV"], "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    rows = list(csv.reader(io.StringIO(raw.decode("utf-8"))))
    header, units, data = rows[0], rows[1], rows[2:]
    name, grid, block = (header.index(c) for c in ("Kernel Name", "Grid Size", "Block Size"))
    if "--kernel-name" in opts:  # regex:^(a|b)$ on the function name (--kernel-name-base function)
        rx = re.compile(opts["--kernel-name"][0].removeprefix("regex:"))
        data = [r for r in data if rx.search(function_name(r[name]))]
    if opts.get("--filter-mode") == ["per-launch-config"]:
        # FAKE_NCU_MODE=coarse: a configuration key without the function (grid, block only)
        # The configuration key names the kernel by --kernel-name-base (default `function`:
        # template instantiations share it), as ncu 2025.3 did on an H100.
        base = opts.get("--kernel-name-base", ["function"])[-1]
        seen, kept = set(), []
        for r in data:
            kernel = r[name] if base in ("demangled", "mangled") else function_name(r[name])
            key = (r[grid], r[block]) if mode == "coarse" else (kernel, r[grid], r[block])
            if key not in seen:
                seen.add(key)
                kept.append(r)
        data = kept
    ident = header.index("ID")
    for k, r in enumerate(data):  # ncu numbers the profiled results 0, 1, 2, ...
        r[ident] = str(k)
    if mode == "na_row":
        data[1][header.index("gpu__time_duration.sum")] = "n/a"
    if not data:
        print("==PROF== Disconnected from process 4242")
        print("==WARNING== No kernels were profiled.")
        return 0
    for k, r in enumerate(data):
        short = function_name(r[name])
        print(
            f'==PROF== Profiling "{short}" - {k} ({k + 1}/{len(data)}): 0%....50%....100% - '
            "27 passes",
            flush=True,
        )
        if mode == "kernelerr" and k == 2:
            print(f'==ERROR== Failed to profile "{short}" in process 4242')
    print("==PROF== Disconnected from process 4242")
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([header, units, *data])
    with open(opts["--export"][0] + ".ncu-rep", "w", encoding="utf-8") as f:
        f.write(out.getvalue())
    print("==PROF== Report: " + opts["--export"][0] + ".ncu-rep")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
