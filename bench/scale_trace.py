"""Write a scaled copy of a real PyTorch profiler (Kineto) trace, for benchmarks.

    python bench/scale_trace.py IN.json.gz OUT.json.gz --factor 10 [--one-step]

The trace's events are repeated `factor` times; copy k is shifted in time by k times
(the trace's extent + a small gap), so copies follow one another like later steps of the
same run. Every id that links events is made unique per copy by adding k times (the
largest value of that id + 1):

- `External id` / `external id` (one namespace: host op <-> launched work),
- `correlation` and flow event ids (ph s/t/f; one namespace, since Kineto's `ac2g` flow
  id is the correlation id),
- `Python id` / `Python parent id`, `Ev Idx`,
- `Record function id` and `Sequence number` (autograd's counter grows across steps in a
  real run, so a copy of the forward gets new numbers too); 0 and negative values of
  these mean "none" and are left alone,
- step numbers: `ProfilerStep#N` (host `user_annotation` / pre-2022 `Operator` and
  device `gpu_user_annotation`) becomes N + k * (number of steps), so steps stay unique
  and increasing.

`Python module id` is left as is (the same nn.Module runs in every step).

With --one-step, every ProfilerStep# event (host and device) is dropped and one
`ProfilerStep#<first step>` user_annotation, on the thread of the original step events,
spans all copies: one step then holds every event (factor 50 of the single-GPU trace gives
~570k events in one step).

Metadata events (ph "M") and the top-level keys (baseTimeNanoseconds, deviceProperties,
distributedInfo, ...) are kept once. The output is gzip at level 9, as the PyTorch profiler
writes it, so size ratios against the scaled file mean what they mean for a real one.

Each event keeps its text as the source spells it (Kineto's indentation and line breaks),
with only the values a copy changes spelled anew (a shifted `ts` with the source's number
of decimals where that reads back as the same number), so a copy has the source's bytes
per event and MB/s of JSON on it means what it means on a real trace. Every changed event
is read back and compared with the copy it stands for; one that does not read back the
same (a key in an order the substitution does not expect) is written as compact JSON
instead, and counted.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import re
import sys
import time
import zlib
from collections.abc import Iterator
from typing import Any

import msgspec

_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
_HOST_STEP_CATS = {"user_annotation", "operator"}

# args key -> id namespace. A namespace's stride is its largest value + 1.
_ID_ARGS = {
    "External id": "external",
    "external id": "external",
    "correlation": "correlation",
    "Python id": "python",
    "Python parent id": "python",
    "Ev Idx": "ev_idx",
    "Record function id": "record_function",
    "Sequence number": "sequence",
}
# Namespaces where 0 is a real id (the first event / first Python frame).
_ZERO_IS_ID = {"python", "ev_idx"}
_FLOW_PHASES = {"s", "t", "f"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shiftable(value: Any, namespace: str) -> bool:
    return _is_int(value) and (value >= 0 if namespace in _ZERO_IS_ID else value > 0)


def _plan(events: list[dict]) -> tuple[list[tuple], list[dict], dict[str, int], dict]:
    """Per non-metadata event: what changes per copy; plus the id strides and extent.

    Returns (plan, metadata events, strides by namespace, info) where each plan row is
    (event, offset arg keys, step number or None, is a flow event with an id).
    """
    plan = []
    meta = []
    top: dict[str, int] = {}
    steps: list[int] = []
    t_min, t_max = math.inf, -math.inf
    step_track = None
    for e in events:
        if e.get("ph") == "M":
            meta.append(e)
            continue
        ts = e.get("ts")
        if isinstance(ts, (int, float)):
            dur = e.get("dur")
            end = ts + dur if isinstance(dur, (int, float)) else ts
            t_min = min(t_min, ts)
            t_max = max(t_max, end)
        args = e.get("args")
        keys = []
        if args:
            for key, namespace in _ID_ARGS.items():
                v = args.get(key)
                if v is not None and _shiftable(v, namespace):
                    keys.append((key, namespace))
                    if v > top.get(namespace, -1):
                        top[namespace] = v
        flow = e.get("ph") in _FLOW_PHASES and _shiftable(e.get("id"), "correlation")
        if flow and e["id"] > top.get("correlation", -1):
            top["correlation"] = e["id"]
        step = None
        m = _STEP_NAME.match(e.get("name") or "") if e.get("ph") == "X" else None
        if m:
            step = int(m.group(1))
            steps.append(step)
            host_step = str(e.get("cat", "")).lower() in _HOST_STEP_CATS
            if host_step and step_track is None:
                step_track = (e.get("pid"), e.get("tid"))
        plan.append((e, tuple(keys), step, flow))
    strides = {ns: v + 1 for ns, v in top.items()}
    if steps:
        strides["step"] = max(steps) - min(steps) + 1
    info = {
        "t_min": t_min,
        "t_max": t_max,
        "first_step": min(steps) if steps else 0,
        "step_track": step_track,
    }
    return plan, meta, strides, info


def _shift_ts(ts: Any, shift_us: int) -> Any:
    if isinstance(ts, float):
        # Kineto writes µs with 3 decimals; keep it that way after the shift.
        return round(ts + shift_us, 3)
    if _is_int(ts):
        return ts + shift_us
    return ts


def scale_events(
    events: list[dict], factor: int, *, one_step: bool = False, gap_us: int | None = None
) -> list[dict]:
    """The events of `factor` shifted copies, ids made unique per copy (see module doc)."""
    return list(iter_scaled_events(events, factor, one_step=one_step, gap_us=gap_us))


def iter_scaled_events(
    events: list[dict], factor: int, *, one_step: bool = False, gap_us: int | None = None
) -> Iterator[dict]:
    """scale_events one event at a time: a copy is made only when written, so a scaled
    trace of any size takes the memory of the source trace."""
    return (e for _, e in _iter_scaled(events, factor, one_step=one_step, gap_us=gap_us))


def _iter_scaled(
    events: list[dict], factor: int, *, one_step: bool = False, gap_us: int | None = None
) -> Iterator[tuple[dict | None, dict]]:
    """(source event, its copy) of each event of the scaled trace; the source event is
    None for the one step made by `one_step`, and is the copy itself where it is unchanged."""
    plan, meta, strides, info = _plan(events)
    if not math.isfinite(info["t_min"]):
        raise ValueError("the trace holds no timed events")
    extent_us = info["t_max"] - info["t_min"]
    if gap_us is None:
        gap_us = max(10, int(extent_us * 0.001))
    period_us = int(math.ceil(extent_us)) + gap_us
    step_stride = strides.get("step", 1)

    if one_step:
        if info["step_track"] is None:
            raise ValueError("--one-step needs the trace's ProfilerStep# user_annotation events")
        pid, tid = info["step_track"]
        step_event = {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{info['first_step']}",
            "pid": pid,
            "tid": tid,
            "ts": info["t_min"],
            "dur": round(period_us * (factor - 1) + extent_us, 3),
            "args": {
                "External id": strides.get("external", 1) * factor,
                "Record function id": 0,
                "Ev Idx": strides.get("ev_idx", 0) * factor,
            },
        }
        yield None, step_event
    # Metadata events describe processes and threads: once, where they were.
    yield from ((e, e) for e in meta)
    for k in range(factor):
        shift_us = k * period_us
        offsets = {ns: k * s for ns, s in strides.items()}
        corr_off = offsets.get("correlation", 0)
        for e, keys, step, flow in plan:
            if step is not None and one_step:
                continue
            if k == 0 and step is None:
                yield e, e
                continue
            ne = dict(e)
            if "ts" in ne:
                ne["ts"] = _shift_ts(ne["ts"], shift_us)
            if keys:
                args = dict(ne["args"])
                for key, namespace in keys:
                    args[key] += offsets[namespace]
                ne["args"] = args
            if flow:
                ne["id"] += corr_off
            if step is not None:
                ne["name"] = f"ProfilerStep#{step + k * step_stride}"
            yield e, ne


# A JSON scalar: a number, or a string (escapes included).
_SCALAR = rb'(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|"(?:[^"\\]|\\.)*")'


class _Respeller:
    """A copied event's text: the source event's own text with the values the copy changed
    spelled anew (see the module doc); `fallbacks` counts the events written compact."""

    def __init__(self) -> None:
        self.patterns: dict[str, re.Pattern] = {}
        self.fallbacks = 0

    def _value_at(self, key: str) -> re.Pattern:
        pattern = self.patterns.get(key)
        if pattern is None:
            quoted = msgspec.json.encode(key)
            pattern = self.patterns[key] = re.compile(re.escape(quoted) + rb"\s*:\s*" + _SCALAR)
        return pattern

    def _replaced(self, text: bytes, key: str, value: Any) -> bytes | None:
        m = self._value_at(key).search(text)
        if m is None:
            return None
        return text[: m.start(1)] + _spelling(value, m.group(1)) + text[m.end(1) :]

    def text(self, raw: bytes, old: dict, new: dict) -> bytes:
        # Kineto writes an event's own keys first and its "args" object last.
        cut = raw.find(b'"args"')
        head, tail = (raw, b"") if cut < 0 else (raw[:cut], raw[cut:])
        for key in ("ts", "id", "name"):
            if key in new and new[key] != old.get(key) and head is not None:
                head = self._replaced(head, key, new[key])
        old_args, new_args = old.get("args") or {}, new.get("args") or {}
        for key, value in new_args.items():
            if value != old_args.get(key) and tail is not None:
                tail = self._replaced(tail, key, value)
        if head is not None and tail is not None:
            text = head + tail
            if msgspec.json.decode(text) == new:
                return text
        self.fallbacks += 1
        return msgspec.json.encode(new)


def _spelling(value: Any, old: bytes) -> bytes:
    """`value` as JSON; a float with as many decimals as `old` had, where that reads back
    as the same number (Kineto writes µs with 3), else its shortest spelling."""
    if isinstance(value, float) and b"." in old and b"e" not in old.lower():
        decimals = len(old) - old.index(b".") - 1
        text = f"{value:.{decimals}f}".encode()
        if float(text) == value:
            return text
    return msgspec.json.encode(value)


def _write(trace: dict, out, chunk_events: int = 20_000) -> None:
    """JSON text: the top-level members with the stdlib's spacing, then the events, each
    as its text (bytes) or compact JSON (a dict), one after the other as Kineto lays them
    out; written in chunks."""
    first = True
    out.write(b"{")
    for key, value in trace.items():
        out.write(b"" if first else b",\n")
        first = False
        if key != "traceEvents":
            # The stdlib's `"key": value` spacing: HTA finds a file's rank with the
            # regex '"rank":\s+(\d+)', which compact JSON would not match.
            out.write(json.dumps({key: value})[1:-1].encode())
            continue
        out.write(b'"traceEvents": [\n  ')
        events = iter(value)
        first_batch = True
        while batch := list(itertools.islice(events, chunk_events)):
            if not first_batch:
                out.write(b",\n  ")
            first_batch = False
            out.write(
                b",\n  ".join(e if isinstance(e, bytes) else msgspec.json.encode(e) for e in batch)
            )
        out.write(b"\n  ]")
    out.write(b"}\n")


class _GzipSink:
    """File-like `write` that gzips (deflate in the gzip wrapper; header mtime 0)."""

    def __init__(self, f, level: int) -> None:
        self.f = f
        self.z = zlib.compressobj(level, zlib.DEFLATED, 31)

    def write(self, data: bytes) -> None:
        self.f.write(self.z.compress(data))

    def close(self) -> None:
        self.f.write(self.z.flush())


def scale_trace(
    in_path: str,
    out_path: str,
    factor: int,
    *,
    one_step: bool = False,
    gap_us: int | None = None,
    level: int = 9,
) -> int:
    """Write the scaled trace to `out_path` (gzip); returns its number of events."""
    with gzip.open(in_path, "rb") if in_path.endswith(".gz") else open(in_path, "rb") as f:
        data = f.read()
    # Parsed once: each event's text, then each event and top-level member from its text.
    top = msgspec.json.decode(data, type=dict[str, msgspec.Raw] | list[msgspec.Raw])
    bare = isinstance(top, list)  # a bare list of events
    texts = top if bare else msgspec.json.decode(top["traceEvents"], type=list[msgspec.Raw])
    events = [msgspec.json.decode(t) for t in texts]
    members = {"traceEvents": texts} if bare else top
    decode = msgspec.json.decode
    trace = {k: events if k == "traceEvents" else decode(v) for k, v in members.items()}
    text_of = {id(e): bytes(t) for e, t in zip(trace["traceEvents"], texts)}
    respell = _Respeller()

    def event_texts() -> Iterator[bytes | dict]:
        pairs = _iter_scaled(trace["traceEvents"], factor, one_step=one_step, gap_us=gap_us)
        for source, event in pairs:
            if source is None:
                yield event
            elif event is source:
                yield text_of[id(source)]
            else:
                yield respell.text(text_of[id(source)], source, event)

    counted = _Counted(event_texts())
    # Keep the top-level keys once, in their original order.
    scaled = {k: (counted if k == "traceEvents" else v) for k, v in trace.items()}
    with open(out_path, "wb") as f:
        if out_path.endswith(".gz"):
            sink = _GzipSink(f, level)
            _write(scaled, sink)
            sink.close()
        else:
            _write(scaled, f)
    if respell.fallbacks:
        print(
            f"{out_path}: {respell.fallbacks:,} events written as compact JSON (their text "
            "did not read back as the copy)",
            file=sys.stderr,
        )
    return counted.n


class _Counted:
    """An iterator that counts what it yields."""

    def __init__(self, items: Iterator) -> None:
        self.items, self.n = items, 0

    def __iter__(self) -> Iterator:
        for item in self.items:
            self.n += 1
            yield item


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", help="Kineto trace (.json or .json.gz)")
    p.add_argument("output", help="where to write the scaled trace (.json.gz: gzip)")
    p.add_argument("--factor", type=int, default=10, help="number of copies (default 10)")
    p.add_argument(
        "--one-step",
        action="store_true",
        help="put all copies inside a single ProfilerStep (one huge step)",
    )
    p.add_argument(
        "--gap-us",
        type=int,
        default=None,
        help="gap between copies in µs (default: 0.1%% of the extent, at least 10)",
    )
    p.add_argument("--level", type=int, default=9, help="gzip level (default 9)")
    args = p.parse_args(argv)
    if args.factor < 1:
        p.error("--factor must be at least 1")
    t0 = time.perf_counter()
    try:
        n = scale_trace(
            args.input,
            args.output,
            args.factor,
            one_step=args.one_step,
            gap_us=args.gap_us,
            level=args.level,
        )
    except ValueError as exc:
        sys.exit(f"{args.input}: {exc}")
    print(
        f"{args.output}: {n:,} events (x{args.factor}{', one step' if args.one_step else ''})"
        f" in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
