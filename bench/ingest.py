"""Ingest benchmark: Tessera import vs HTA load vs a bare json.load, side by side.

    .venv/bin/python bench/ingest.py [--quick] [--skip-hta] [--repeat N] [--cprofile] [--huge]

Inputs: every *.json.gz under <repo>/../shared/traces, 10x and 50x tiled copies of the
single-GPU trace, a one-step copy of it holding ~600k events and, with --huge, a copy
tiled to about 5 GB of JSON (bench/scale_trace.py; generated into bench/out/scaled/ when
missing or older than the scaler, never committed; the 5 GB one takes several minutes
and ~0.5 GB of disk). HTA and json.load are not run on the 5 GB copy (tens of GB).

Each measurement runs in its own fresh subprocess, timed after the libraries are
imported; peak RSS is the child's own `ru_maxrss` (it includes the imported libraries,
whose cost is printed separately). The script only reports: it exits 0 even when a goal
is missed, and prints MISSED next to it.

This file is also the measuring child (`--child TOOL PATH`), so it imports only the
standard library at module level: the HTA child runs it under HTA's own venv.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
TRACES = os.path.normpath(os.path.join(REPO, "..", "shared", "traces"))
OUT = os.path.join(BENCH, "out")
SCALED = os.path.join(OUT, "scaled")
HTA_VENV = os.path.join(OUT, "hta-venv")
HTA_PYTHON = os.path.join(HTA_VENV, "bin", "python")
SCALER = os.path.join(BENCH, "scale_trace.py")
SINGLE_GPU = "pytorch/gpt_1gpu_stack"
ONE_STEP_FACTOR = 52  # 52 x 11,404 events of the single-GPU trace ~ 590k events

# Goals (from the issue): Tessera import >= 5x faster than HTA, peak RSS <= 0.5x HTA's,
# run on disk <= 50% of the gzipped JSON.
GOAL_SPEEDUP = 5.0
GOAL_RSS_RATIO = 0.5
GOAL_DISK_RATIO = 0.5
# Goals of the streaming import: peak RSS on every input (the 5 GB one included), the 10x
# copy against HTA, and the JSON throughput on the 50x copy.
GOAL_PEAK_RSS_MB = 600
GOAL_X10_SPEEDUP = 20.0
GOAL_X50_MB_S = 250.0
X10_LABEL = "scaled: 1gpu x10"
X50_LABEL = "scaled: 1gpu x50"
HUGE_BYTES = 5e9
# The scaled text holds ~3.6 MB of JSON per copy of the single-GPU trace (its events as
# Kineto spells them: bench/scale_trace.py).
HUGE_FACTOR = 1390

RESULT_MARK = "INGEST_RESULT "


# --------------------------------------------------------------------------- child side


def _rss_now_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:
        return float("nan")


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


class _GcWatch:
    """Counts the collector's passes and the time they take (gc.callbacks)."""

    def __init__(self) -> None:
        import gc

        self.passes = 0
        self.seconds = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.passes += 1
            self.seconds += time.perf_counter() - self._t0


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def _child_tessera(path: str, workdir: str) -> dict:
    t0 = time.perf_counter()
    from tessera_tb.importers.kineto_decode import scanner_available
    from tessera_tb.importers.kineto_import import import_traces
    from tessera_tb.importers.kineto_stream import should_stream

    import_s = time.perf_counter() - t0
    rss_base = _rss_now_mb()
    logdir = os.path.join(workdir, "logdir")
    modules_before = set(sys.modules)
    gc_watch = _GcWatch()
    t0 = time.perf_counter()
    result = import_traces([path], logdir, "bench")
    wall = time.perf_counter() - t0
    peak = _peak_rss_mb()
    # Modules the importer pulls in lazily are part of its wall time, as in the CLI.
    new_modules = set(sys.modules) - modules_before
    lazy = sorted({m.split(".")[0] for m in new_modules} - {"tessera_tb"})
    return {
        "gc_passes": gc_watch.passes,
        "gc_s": gc_watch.seconds,
        "lazy_modules": len(new_modules),
        "lazy_packages": lazy,
        "wall_s": wall,
        "peak_rss_mb": peak,
        "import_s": import_s,
        "base_rss_mb": rss_base,
        "events": result.events,
        "json_bytes": result.json_bytes,
        "bytes_written": result.bytes_written,
        "disk_bytes": _dir_bytes(result.run_dir),
        "steps": sum(len(w.steps) for w in result.workers),
        "parser": ("C scanner" if scanner_available() else "pure Python (msgspec)")
        + (" (bounded memory)" if should_stream(path) else ""),
    }


def _child_hta(path: str, workdir: str) -> dict:
    import logging

    t0 = time.perf_counter()
    import hta.common.trace as hta_trace
    from hta.trace_analysis import TraceAnalysis

    import_s = time.perf_counter() - t0
    logging.disable(logging.WARNING)  # HTA logs a warning per parse stage
    # HTA wants a directory of per-rank files.
    trace_dir = os.path.join(workdir, "trace_dir")
    os.makedirs(trace_dir)
    os.symlink(os.path.abspath(path), os.path.join(trace_dir, os.path.basename(path)))
    # Count the rows HTA's parser produced, before its step filter (wrapping the module
    # function the loader calls; costs one len()).
    parsed_rows: list[int] = []
    parse = hta_trace.parse_trace_file

    def counting_parse(*args, **kwargs):
        out = parse(*args, **kwargs)
        parsed_rows.append(len(out[1]))
        return out

    hta_trace.parse_trace_file = counting_parse
    rss_base = _rss_now_mb()
    gc_watch = _GcWatch()
    t0 = time.perf_counter()
    # include_last_profiler_step=True: the default (False) drops the host events of the
    # last ProfilerStep and the kernels they launched; we want every event loaded.
    analyzer = TraceAnalysis(trace_dir=trace_dir, include_last_profiler_step=True)
    wall = time.perf_counter() - t0
    peak = _peak_rss_mb()
    rows = sum(len(df) for df in analyzer.t.traces.values())
    return {
        "gc_passes": gc_watch.passes,
        "gc_s": gc_watch.seconds,
        "wall_s": wall,
        "peak_rss_mb": peak,
        "import_s": import_s,
        "base_rss_mb": rss_base,
        "rows": rows,
        "parsed_rows": sum(parsed_rows),
        "ranks": sorted(analyzer.t.traces),
    }


def _child_json(path: str, workdir: str) -> dict:
    import gc
    import gzip

    with open(path, "rb") as f:
        data = f.read()
    t0 = time.perf_counter()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    gunzip_s = time.perf_counter() - t0
    rss_base = _rss_now_mb()
    gc.disable()
    t0 = time.perf_counter()
    trace = json.loads(data)  # what json.load(binary file) does after its read()
    wall = time.perf_counter() - t0
    peak = _peak_rss_mb()
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return {
        "wall_s": wall,
        "peak_rss_mb": peak,
        "import_s": 0.0,
        "base_rss_mb": rss_base,
        "gunzip_s": gunzip_s,
        "trace_events": len(events),
        "json_bytes": len(data),
    }


def _child_floor(path: str, workdir: str) -> dict:
    """What reading the text costs before anything is built from it, on one core: the
    inflate the importer uses (kineto_decode.iter_text), then that inflate and the C
    scanner's pass (one scanner, in this thread; no columns, steps or files made)."""
    t0 = time.perf_counter()
    from tessera_tb.importers import kineto_decode

    import_s = time.perf_counter() - t0
    if not kineto_decode.scanner_available():
        return {"wall_s": None, "gunzip_s": None, "import_s": import_s}
    t0 = time.perf_counter()
    for _ in kineto_decode.iter_text(path):
        pass
    gunzip_s = time.perf_counter() - t0
    wall, scanned = _scan_pass(path)
    return {"wall_s": wall, "gunzip_s": gunzip_s, "import_s": import_s, "scanned": scanned}


def _scan_pass(path: str) -> tuple[float, bool]:
    """(seconds, whether the scanner read it) of the importer's inflate and one C scanner's
    pass over the text, in this thread, nothing built from the columns."""
    from tessera_tb.importers import kineto_decode

    t0 = time.perf_counter()
    scan, _ = kineto_decode._scan(kineto_decode.iter_text(path))
    return time.perf_counter() - t0, scan is not None


def _child_scanpass(path: str, workdir: str) -> dict:
    """The floor child's scan pass, started at the wall-clock moment in
    TESSERA_BENCH_START_AT (so that two of these children run it at the same time)."""
    from tessera_tb.importers import kineto_decode

    if not kineto_decode.scanner_available():
        return {"wall_s": None, "late_s": 0.0}
    start_at = float(os.environ.get("TESSERA_BENCH_START_AT", "0"))
    time.sleep(max(0.0, start_at - time.time()))
    late_s = max(0.0, time.time() - start_at)
    wall, _ = _scan_pass(path)
    return {"wall_s": wall, "late_s": late_s}


def _child_cprofile(path: str, workdir: str) -> dict:
    import cProfile
    import io
    import pstats

    from tessera_tb.importers.kineto_import import import_traces

    prof = cProfile.Profile()
    prof.enable()
    import_traces([path], os.path.join(workdir, "logdir"), "bench")
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
    return {"report": text.getvalue()}


_CHILDREN = {
    "tessera": _child_tessera,
    "hta": _child_hta,
    "json": _child_json,
    "floor": _child_floor,
    "scanpass": _child_scanpass,
    "cprofile": _child_cprofile,
}


# Where the parent's children leave what they wrote, removed when the parent ends. On a
# filesystem such as this machine's (ext4 without a journal), a new file's inode is not one
# freed in the last minute or more, and finding one then reads the inode tables: after
# 4,000 files were deleted, the 50x copy's import spent 33-58 ms creating its 102 files,
# against 5-8 ms after five minutes without deletions (`perf trace -e openat`). A child
# run alone removes its own.
OUTPUTS_ENV = "TESSERA_BENCH_OUTPUTS"


def child_main(tool: str, path: str) -> int:
    kept = os.environ.get(OUTPUTS_ENV)
    workdir = tempfile.mkdtemp(prefix=f"ingest-{tool}-", dir=kept or OUT)
    try:
        result = _CHILDREN[tool](path, workdir)
    finally:
        if not kept:
            shutil.rmtree(workdir, ignore_errors=True)
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------- parent side


@dataclass
class Input:
    label: str
    path: str
    results: dict[str, dict] = field(default_factory=dict)  # tool -> median result
    errors: dict[str, str] = field(default_factory=dict)


def _short_label(rel: str) -> str:
    parts = rel.split("/")
    name = re.sub(r"(\.pt\.trace)?\.json(\.gz)?$", "", parts[-1])
    name = re.sub(r"\.\d{13,}$", "", name)  # tensorboard_trace_handler's ns suffix
    parent = parts[-2] if len(parts) > 1 else ""
    return f"{parent}/{name}" if parent else name


def shared_inputs() -> list[Input]:
    found = []
    for root, _dirs, files in os.walk(TRACES):
        for f in files:
            if f.endswith(".json.gz"):
                found.append(os.path.join(root, f))
    inputs = []
    seen: dict[str, int] = {}
    for path in sorted(found):
        rel = os.path.relpath(path, TRACES)
        label = _short_label(rel)
        seen[label] = seen.get(label, 0) + 1
        inputs.append(Input(label, path))
    for inp in inputs:  # two spans of one worker: tell them apart by their file name
        if seen[inp.label] > 1:
            base = os.path.basename(inp.path)
            inp.label = f"{inp.label.rsplit('/', 1)[0]}/{base.split('.pt.trace')[0]}"
    return inputs


def single_gpu_trace() -> str:
    folder = os.path.join(TRACES, SINGLE_GPU)
    names = sorted(
        f for f in os.listdir(folder) if re.match(r"worker0\..*\.pt\.trace\.json\.gz$", f)
    )
    if not names:
        sys.exit(f"no worker0.*.pt.trace.json.gz in {folder}")
    return os.path.join(folder, names[0])


def scaled_input(label: str, factor: int, one_step: bool, level: int = 9) -> Input:
    """The scaled copy, generated when missing or older than its source or the scaler."""
    src = single_gpu_trace()
    variant = f"x{factor}" + ("-one-step" if one_step else "")
    # Same file name as the source, in a folder per variant: it still reads as worker0.
    dest = os.path.join(SCALED, variant, os.path.basename(src))
    newest_input = max(os.path.getmtime(src), os.path.getmtime(SCALER))
    if not os.path.exists(dest) or os.path.getmtime(dest) < newest_input:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = os.path.join(os.path.dirname(dest), ".partial.json.gz")  # .gz: the scaler gzips
        cmd = [sys.executable, SCALER, src, tmp, "--factor", str(factor), "--level", str(level)]
        if one_step:
            cmd.append("--one-step")
        print(f"generating {os.path.relpath(dest, REPO)} ...", flush=True)
        subprocess.run(cmd, check=True)
        os.replace(tmp, dest)
    return Input(label, dest)


def ensure_hta_venv() -> None:
    probe = [HTA_PYTHON, "-c", "import hta.trace_analysis"]
    if os.path.exists(HTA_PYTHON) and subprocess.run(probe, capture_output=True).returncode == 0:
        return
    print(
        f"creating HTA's venv at {os.path.relpath(HTA_VENV, REPO)} (one-time; HTA pins its "
        "own dependency versions, so it is kept apart from the project's venv) ...",
        flush=True,
    )
    steps = [
        [sys.executable, "-m", "venv", "--clear", HTA_VENV],
        [HTA_PYTHON, "-m", "pip", "install", "-q", "holistictraceanalysis"],
    ]
    for cmd in steps:
        print(
            "  $ " + " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd),
            flush=True,
        )
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    version = subprocess.run(
        [HTA_PYTHON, "-m", "pip", "show", "holistictraceanalysis"], capture_output=True, text=True
    ).stdout
    line = next((x for x in version.splitlines() if x.startswith("Version:")), "Version: ?")
    print(f"  installed holistictraceanalysis {line.split(':', 1)[1].strip()}", flush=True)


def _child_command(tool: str, path: str) -> list[str]:
    python = HTA_PYTHON if tool == "hta" else sys.executable
    return [python, os.path.abspath(__file__), "--child", tool, path]


def _child_result(returncode: int, stdout: str, stderr: str) -> dict:
    """The result a child printed, or RuntimeError with its exit code and last error line."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
    raise RuntimeError(f"exit {returncode}: {tail[:200]}")


def run_child(tool: str, path: str) -> dict:
    proc = subprocess.run(_child_command(tool, path), capture_output=True, text=True, cwd=OUT)
    return _child_result(proc.returncode, proc.stdout, proc.stderr)


def measure_cores(inp: Input, repeat: int) -> None:
    """How much of a second CPU this machine gives right now: the floor's single-threaded
    pass (inflate and C scanner) timed in one child alone, then in two children started at
    the same moment. capacity = 2 x (alone) / (slower of the two at once): 2.0 where the
    CPUs are two whole, idle cores, less where they share a core or other work takes one.
    The goals print it beside the reading floor, and the floor divided by it: the floor on
    the cores the machine gave, not on as many whole cores as it counts. Taken `repeat`
    times (alone, then both), the medians kept."""
    if (os.cpu_count() or 1) < 2:
        return
    alone, both = [], []
    for _ in range(repeat):
        for count in (1, 2):
            env = dict(os.environ, TESSERA_BENCH_START_AT=f"{time.time() + 2.0:.6f}")
            procs = [
                subprocess.Popen(
                    _child_command("scanpass", inp.path),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=OUT,
                    env=env,
                )
                for _ in range(count)
            ]
            walls = []
            for proc in procs:
                out, err = proc.communicate()
                try:
                    result = _child_result(proc.returncode, out, err)
                except RuntimeError as exc:
                    inp.errors["cores"] = str(exc)
                    return
                if result["wall_s"] is None:
                    inp.errors["cores"] = "the C scanner is not built"
                    return
                if result["late_s"] > 0.05:  # then the two did not run at the same time
                    inp.errors["cores"] = f"a child started {result['late_s']:.2f} s late"
                    return
                walls.append(result["wall_s"])
            (alone if count == 1 else both).append(max(walls))
    inp.results["cores"] = {
        "alone_s": statistics.median(alone),
        "both_s": statistics.median(both),
        "capacity": 2 * statistics.median(alone) / statistics.median(both),
    }


def measure(inp: Input, tools: list[str], repeat: int) -> None:
    """Each tool `repeat` times, taking turns (tool A, tool B, tool A, ...), so that a slow
    spell of a shared machine falls on every tool alike; the medians are kept."""
    runs: dict[str, list[dict]] = {tool: [] for tool in tools}
    for _ in range(repeat):
        for tool in tools:
            if tool in inp.errors:
                continue
            try:
                runs[tool].append(run_child(tool, inp.path))
            except RuntimeError as exc:
                inp.errors[tool] = str(exc)
    for tool, results in runs.items():
        if tool in inp.errors or not results:
            continue
        med = dict(results[0])
        for key in ("wall_s", "peak_rss_mb", "import_s", "base_rss_mb", "gc_s", "gunzip_s"):
            if key in med and med[key] is not None:
                med[key] = statistics.median(r[key] for r in results)
        inp.results[tool] = med


# --------------------------------------------------------------------------- report


LABEL_WIDTH = 40


def _fit(label: str, width: int = LABEL_WIDTH) -> str:
    """The label cut in the middle to `width` characters (both ends tell inputs apart)."""
    if len(label) <= width:
        return label.ljust(width)
    head = (width - 1) // 2
    return label[:head] + "…" + label[-(width - 1 - head) :]


def _f(value, fmt: str, width: int) -> str:
    if value is None:
        return "-".rjust(width)
    return format(value, fmt).rjust(width)


COLUMNS = [
    # (group, header, width)
    ("", "input", LABEL_WIDTH),
    ("", "events", 8),
    ("", "JSON MB", 7),
    ("", "gz MB", 6),
    ("Tessera import", "s", 6),
    ("Tessera import", "MB/s", 5),
    ("Tessera import", "kev/s", 6),
    ("Tessera import", "RSS MB", 6),
    ("Tessera import", "disk KB", 7),
    ("Tessera import", "B/ev", 5),
    ("Tessera import", "disk/gz", 7),
    ("HTA TraceAnalysis", "s", 6),
    ("HTA TraceAnalysis", "RSS MB", 6),
    ("HTA TraceAnalysis", "rows", 7),
    ("json.load", "s", 6),
    ("json.load", "RSS MB", 6),
]


def _row(inp: Input) -> list[str]:
    t = inp.results.get("tessera")
    h = inp.results.get("hta")
    j = inp.results.get("json")
    gz = os.path.getsize(inp.path)
    json_bytes = (t or j or {}).get("json_bytes")
    cells = [
        _fit(inp.label),
        _f(j and j["trace_events"], ",d", 8),
        _f(json_bytes and json_bytes / 1e6, ".1f", 7),
        _f(gz / 1e6, ".2f", 6),
    ]
    if t:
        wall = t["wall_s"]
        cells += [
            _f(wall, ".3f", 6),
            _f(t["json_bytes"] / 1e6 / wall, ".0f", 5),
            _f(t["events"] / 1e3 / wall, ".0f", 6),
            _f(t["peak_rss_mb"], ".0f", 6),
            _f(t["disk_bytes"] / 1e3, ",.0f", 7),
            _f(t["disk_bytes"] / max(t["events"], 1), ".1f", 5),
            _f(t["disk_bytes"] / gz, ".2f", 7),
        ]
    else:
        cells += ["ERR".rjust(6)] + ["-".rjust(w) for _, _, w in COLUMNS[5:11]]
    if h:
        cells += [
            _f(h["wall_s"], ".3f", 6),
            _f(h["peak_rss_mb"], ".0f", 6),
            _f(h["rows"], ",d", 7),
        ]
    else:
        cells += [("ERR" if "hta" in inp.errors else "skip").rjust(6), "-".rjust(6), "-".rjust(7)]
    if j:
        cells += [_f(j["wall_s"], ".3f", 6), _f(j["peak_rss_mb"], ".0f", 6)]
    else:
        cells += [("ERR" if "json" in inp.errors else "skip").rjust(6), "-".rjust(6)]
    return cells


def print_table(inputs: list[Input]) -> None:
    widths = [w for _, _, w in COLUMNS]
    # Group header: each tool's name centred over its columns.
    groups: list[tuple[str, int]] = []
    for group, _, w in COLUMNS:
        if groups and groups[-1][0] == group:
            groups[-1] = (group, groups[-1][1] + w + 1)
        else:
            groups.append((group, w))
    print(" | ".join(g.center(w - 1 if i else w) for i, (g, w) in enumerate(groups)).rstrip())
    print(" ".join(h.rjust(w) if i else h.ljust(w) for i, (_, h, w) in enumerate(COLUMNS)))
    print(" ".join("-" * w for w in widths))
    for inp in inputs:
        print(" ".join(_row(inp)))


def _goal(value: float | None, goal: float, higher_is_better: bool, fmt: str) -> str:
    if value is None:
        return "n/a".rjust(18)
    ok = value >= goal if higher_is_better else value <= goal
    return (format(value, fmt) + ("" if ok else " MISSED")).rjust(18)


def print_goals(inputs: list[Input], with_hta: bool) -> None:
    print()
    print(
        f"Goals: Tessera import >= {GOAL_SPEEDUP:g}x faster than HTA, peak RSS <= "
        f"{GOAL_RSS_RATIO:g}x HTA's, on disk <= {GOAL_DISK_RATIO:.0%} of the .json.gz"
    )
    titles = ("HTA s / Tessera s", "RSS Tessera/HTA", "disk / gz")
    head = "input".ljust(LABEL_WIDTH) + "".join(f" {t:>18}" for t in titles)
    print(head)
    print("-" * len(head))
    missed = {"speed": 0, "rss": 0, "disk": 0}
    counted = {"speed": 0, "rss": 0, "disk": 0}
    for inp in inputs:
        t, h = inp.results.get("tessera"), inp.results.get("hta")
        speed = h["wall_s"] / t["wall_s"] if t and h else None
        rss = t["peak_rss_mb"] / h["peak_rss_mb"] if t and h else None
        disk = t["disk_bytes"] / os.path.getsize(inp.path) if t else None
        for key, value, goal, higher in (
            ("speed", speed, GOAL_SPEEDUP, True),
            ("rss", rss, GOAL_RSS_RATIO, False),
            ("disk", disk, GOAL_DISK_RATIO, False),
        ):
            if value is not None:
                counted[key] += 1
                missed[key] += not (value >= goal if higher else value <= goal)
        cells = [
            _goal(speed, GOAL_SPEEDUP, True, ".1f"),
            _goal(rss, GOAL_RSS_RATIO, False, ".2f"),
            _goal(disk, GOAL_DISK_RATIO, False, ".2f"),
        ]
        print(_fit(inp.label) + " " + " ".join(cells))
    parts = []
    for key, name in (("speed", "speed"), ("rss", "peak RSS"), ("disk", "disk size")):
        if counted[key]:
            word = f"MISSED on {missed[key]}" if missed[key] else "met on all"
            parts.append(f"{name}: {word} of {counted[key]}")
    if not with_hta:
        parts.append("(speed and RSS need HTA: --skip-hta was given)")
    print("Summary: " + "; ".join(parts))


def print_streaming_goals(inputs: list[Input]) -> None:
    """The streaming import's goals beside the figures: peak RSS on every input, the 10x
    copy's speed-up over HTA, the 50x copy's JSON throughput."""
    print()
    print(
        f"Streaming goals: peak RSS <= {GOAL_PEAK_RSS_MB} MB on every input; {X10_LABEL} >= "
        f"{GOAL_X10_SPEEDUP:g}x faster than HTA; {X50_LABEL} >= {GOAL_X50_MB_S:g} MB/s of JSON"
    )
    worst = max(
        (i for i in inputs if "tessera" in i.results),
        key=lambda i: i.results["tessera"]["peak_rss_mb"],
        default=None,
    )
    if worst is not None:
        t = worst.results["tessera"]
        print(
            f"  peak RSS, largest: {_goal(t['peak_rss_mb'], GOAL_PEAK_RSS_MB, False, '.0f')} MB"
            f" ({worst.label}, {t['json_bytes'] / 1e6:,.0f} MB of JSON)"
        )
    for inp in inputs:
        t, h = inp.results.get("tessera"), inp.results.get("hta")
        if inp.label == X10_LABEL:
            speed = h["wall_s"] / t["wall_s"] if t and h else None
            print(
                f"  {X10_LABEL}, HTA s / Tessera s: {_goal(speed, GOAL_X10_SPEEDUP, True, '.1f')}"
            )
            if h:
                most = h["wall_s"] / GOAL_X10_SPEEDUP
                print(f"    the goal is an import of at most {most:.3f} s")
            print_floor(inp)
        if inp.label == X50_LABEL:
            rate = t["json_bytes"] / 1e6 / t["wall_s"] if t else None
            print(f"  {X50_LABEL}, MB/s of JSON: {_goal(rate, GOAL_X50_MB_S, True, '.0f')}")
            if t:
                print(
                    f"    the goal is an import of at most "
                    f"{t['json_bytes'] / 1e6 / GOAL_X50_MB_S:.3f} s"
                )
            print_floor(inp)


def print_floor(inp: Input) -> None:
    """The reading floor of an input (the floor child) beside its import time."""
    f, t = inp.results.get("floor"), inp.results.get("tessera")
    if not f or f["wall_s"] is None or not t:
        return
    cpus = os.cpu_count() or 1
    print(
        f"    reading floor, one core: inflate {f['gunzip_s']:.3f} s, inflate + C scanner "
        f"{f['wall_s']:.3f} s; split over {cpus} cores at best {f['wall_s'] / cpus:.3f} s "
        f"(the import: {t['wall_s']:.3f} s, columns, steps and files included)"
    )
    cores = inp.results.get("cores")
    if cores:
        print(
            f"    {cpus} CPUs at once gave {cores['capacity']:.2f}x one CPU's rate (that pass "
            f"alone {cores['alone_s']:.3f} s, in two processes at once {cores['both_s']:.3f} s); "
            f"split over that, the floor is {f['wall_s'] / cores['capacity']:.3f} s"
        )


def print_notes(inputs: list[Input], repeat: int) -> None:
    print()
    parsers = sorted({i.results["tessera"]["parser"] for i in inputs if "tessera" in i.results})
    if parsers:
        print(f"Tessera read the events with: {', '.join(parsers)}")
    for tool, name in (("tessera", "tessera_tb importer"), ("hta", "hta"), ("json", "json")):
        rs = [i.results[tool] for i in inputs if tool in i.results]
        if rs:
            imp = statistics.median(r["import_s"] for r in rs)
            base = statistics.median(r["base_rss_mb"] for r in rs)
            print(
                f"library import ({name}): {imp:.2f} s, RSS after import {base:.0f} MB "
                "(not in the wall times; part of peak RSS)"
            )
    for inp in inputs:
        t, h = inp.results.get("tessera"), inp.results.get("hta")
        if h and h["parsed_rows"] != h["rows"]:
            print(
                f"{inp.label}: HTA parsed {h['parsed_rows']:,} rows, kept {h['rows']:,} "
                "after its step filter"
            )
        for tool, err in inp.errors.items():
            print(f"{inp.label}: {tool} failed: {err}")
        if t and t["steps"] == 1 and t["events"] > 100_000:
            print(f"{inp.label}: {t['events']:,} events in one step file (Tessera)")
        if t and t["gc_s"] >= max(0.1, 0.1 * t["wall_s"]):
            hta_gc = f"; HTA {h['gc_s']:.2f} s in {h['gc_passes']} passes" if h else ""
            print(
                f"{inp.label}: garbage collector: Tessera {t['gc_s']:.2f} s "
                f"({t['gc_s'] / t['wall_s']:.0%} of its wall) in {t['gc_passes']} passes{hta_gc}"
            )
    lazy = next((i.results["tessera"] for i in inputs if "tessera" in i.results), None)
    if lazy and lazy["lazy_modules"]:
        print(
            f"Tessera's import call itself imports {lazy['lazy_modules']} modules on first use "
            f"({', '.join(p for p in lazy['lazy_packages'] if not p.startswith('_'))}): "
            "counted in its wall time, as in the CLI."
        )
    print(
        f"Times are medians of {repeat} run(s), each in a fresh process. events: all "
        "traceEvents entries; Tessera counts the ones it stores (ph X/i, not flows or "
        "metadata); HTA rows: its DataFrame (events with a dur, no instants/flows/metadata)."
    )
    print(
        "json.load: parse only, of text gunzipped beforehand in the same process; GC paused. "
        "kev/s = thousand events per second."
    )
    print(
        "Scaled copies repeat the same events, and Tessera's compressed columns find "
        "the repeats when a step holds several copies (the one-step input): its disk/gz "
        "is optimistic; the real traces' B/ev is the honest size measure."
    )


def print_cprofile(inputs: list[Input]) -> None:
    target = max(inputs, key=lambda i: os.path.getsize(i.path))
    print()
    print(f"cProfile of the Tessera import of {target.label} (top 20 by own time):")
    try:
        print(run_child("cprofile", target.path)["report"])
    except RuntimeError as exc:
        print(f"failed: {exc}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shared traces + 10x copy only")
    p.add_argument("--skip-hta", action="store_true", help="do not measure HTA")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="median of N runs")
    p.add_argument(
        "--cprofile",
        action="store_true",
        help="also print a cProfile top-20 of the Tessera import of the largest input",
    )
    p.add_argument(
        "--huge",
        action="store_true",
        help="also a copy tiled to ~5 GB of JSON (made on first use: several minutes)",
    )
    p.add_argument("--child", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.makedirs(OUT, exist_ok=True)
    if args.child:
        return child_main(*args.child)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if not os.path.isdir(TRACES):
        sys.exit(f"no shared traces at {TRACES}")
    outputs = tempfile.mkdtemp(prefix="ingest-outputs-", dir=OUT)
    os.environ[OUTPUTS_ENV] = outputs
    try:
        return _measure_and_print(args)
    finally:
        shutil.rmtree(outputs, ignore_errors=True)


def _measure_and_print(args: argparse.Namespace) -> int:
    inputs = shared_inputs()
    inputs.append(scaled_input(X10_LABEL, 10, one_step=False))
    if not args.quick:
        inputs.append(
            scaled_input(
                f"scaled: 1gpu x{ONE_STEP_FACTOR} one step", ONE_STEP_FACTOR, one_step=True
            )
        )
        inputs.append(scaled_input(X50_LABEL, 50, one_step=False, level=6))
    if args.huge:
        # gzip level 1: level 9 would take most of an hour on 5 GB.
        inputs.append(scaled_input("scaled: 1gpu 5 GB", HUGE_FACTOR, one_step=False, level=1))
    tools = ["tessera", "json"]
    if not args.skip_hta:
        ensure_hta_venv()
        tools.insert(1, "hta")

    t0 = time.perf_counter()
    for n, inp in enumerate(inputs, 1):
        print(f"[{n}/{len(inputs)}] {inp.label} ...", end="", flush=True)
        big = os.path.getsize(inp.path) > 100e6  # gzipped: the 5 GB copy
        # json.load and HTA hold the whole text and every event as objects: tens of GB.
        used = ["tessera"] if big else tools
        if inp.label in (X10_LABEL, X50_LABEL):
            used = [*used, "floor"]
        measure(inp, used, args.repeat)
        if inp.label in (X10_LABEL, X50_LABEL):
            measure_cores(inp, args.repeat)
            used = [*used, "cores"]
        print(" " + " ".join(used), flush=True)
    print(f"measured in {time.perf_counter() - t0:.0f} s on {os.cpu_count()} CPUs\n")
    print_table(inputs)
    print_goals(inputs, with_hta=not args.skip_hta)
    print_streaming_goals(inputs)
    print_notes(inputs, args.repeat)
    if args.cprofile:
        print_cprofile(inputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
