"""The C scanner and the pure-Python path read every trace into the same steps.

The pure-Python path (msgspec RawEvent batches) is the reference: the round-trip tests check
it against the JSON itself. Here each shared trace goes through both, and every step's events,
argument columns, flows and tracks must agree value by value (string ids may be numbered
differently; the strings they name may not).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from tessera_tb.importers import kineto_decode
from tessera_tb.importers.kineto_span import StringTable, build_span
from tests.conftest import shared_trace_files, trace_id

if kineto_decode._kineto_scan is None:
    # CI sets TESSERA_REQUIRE_SCANNER=1: there a missing build is a failure, not a skip.
    if os.environ.get("TESSERA_REQUIRE_SCANNER") == "1":
        raise RuntimeError("the C scanner (_kineto_scan) is not built: is a C compiler there?")
    pytestmark = pytest.mark.skip(reason="the C scanner is not built (no C compiler)")


def _read(path: str, *, scanner: bool, monkeypatch) -> kineto_decode.RawTrace:
    monkeypatch.setenv("TESSERA_PURE_PYTHON", "0" if scanner else "1")
    trace = kineto_decode.read_trace(path)
    assert (trace.scan is not None) == scanner
    return trace


def _steps(trace):
    base_ns = int(trace.meta.get("baseTimeNanoseconds") or 0)
    return build_span(trace, StringTable(), 0, base_ns).steps


def _resolved(step) -> dict:
    """A step with every string id replaced by its string."""
    s = np.array(step.strings, dtype=object)
    ev = dict(step.events)
    ev["name_id"] = s[ev["name_id"]]
    ev["cat_id"] = s[ev["cat_id"]]
    fl = dict(step.flows)
    fl["cat_id"] = s[fl["cat_id"]] if fl else fl
    attrs = {}
    for a in step.attrs:
        values = s[a.values] if a.type in ("string", "json") else a.values
        attrs[a.key] = (a.type, a.rows.tolist(), values.tolist())
    tracks = [(t.kind, t.pid, t.tid, t.device, t.stream, t.name, t.sort_index) for t in step.tracks]
    return {
        "step": (step.step, step.start_ns, step.end_ns),
        "events": {k: v.tolist() for k, v in ev.items()},
        "flows": {k: v.tolist() for k, v in fl.items()},
        "attrs": attrs,
        "tracks": sorted(tracks),
    }


@pytest.mark.parametrize("path", shared_trace_files(), ids=trace_id)
def test_scanner_and_pure_python_read_the_same_steps(path, monkeypatch):
    fast_trace = _read(path, scanner=True, monkeypatch=monkeypatch)
    slow_trace = _read(path, scanner=False, monkeypatch=monkeypatch)
    assert fast_trace.meta == slow_trace.meta  # every top-level member but traceEvents
    assert fast_trace.event_count == slow_trace.event_count
    fast, slow = _steps(fast_trace), _steps(slow_trace)
    assert [s.step for s in fast] == [s.step for s in slow]
    for a, b in zip(fast, slow):
        ra, rb = _resolved(a), _resolved(b)
        for part in ra:
            assert ra[part] == rb[part], f"step {a.step}: {part} differ"


def _scan_one(events: list) -> dict:
    from tessera_tb.importers import _kineto_scan

    return _kineto_scan.scan_events(json.dumps(events).encode())


def test_the_type_codes_are_the_scanners_own():
    from tessera_tb.importers import _kineto_scan, kineto_scanned

    for name in ("T_NULL", "T_FALSE", "T_TRUE", "T_INT", "T_FLOAT", "T_STR", "T_RAW", "T_BIGINT"):
        assert getattr(kineto_scanned, name) == getattr(_kineto_scan, name), name


def test_scanner_reads_numbers_strings_and_arguments_as_json_does():
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": 'caf\u00e9 \U0001f600 "q" \\ \n',
            "pid": -0,
            "tid": "stream 7",
            "ts": 1623143089861234.5,
            "dur": 1e-3,
            "args": {
                "i": -9223372036854775808,
                "big": 18446744073709551616,
                "f": 0.1,
                "e": 2.5e-7,
                "b": True,
                "n": None,
                "shape": [[8192, 32000], [], [1.50, "x"]],
                "o": {"k": [1, 2]},
            },
        },
        {"ph": "s", "id": "0x1A", "pid": 1, "tid": 2, "ts": 3, "cat": "ac2g", "name": "f"},
    ]
    out = _scan_one(events)
    strings = out["strings"]
    assert out["n"] == 2
    assert strings[np.frombuffer(out["name"], np.int32)[0]] == events[0]["name"]
    assert strings[np.frombuffer(out["pid"], np.int32)[0]] == "0"
    assert strings[np.frombuffer(out["tid"], np.int32)[0]] == "stream 7"
    ts = np.frombuffer(out["ts"], np.float64)
    assert ts.tolist() == [1623143089861234.5, 3.0]
    assert np.frombuffer(out["dur"], np.float64)[0] == 1e-3
    assert np.isnan(np.frombuffer(out["dur"], np.float64)[1])
    assert strings[np.frombuffer(out["id_sid"], np.int32)[1]] == "0x1A"
    key_sid = np.frombuffer(out["arg_key_sid"], np.int32)
    counts = np.diff(np.frombuffer(out["arg_key_start"], np.int64))
    keys = [strings[k] for k in np.repeat(key_sid, counts)]
    types = np.frombuffer(out["arg_type"], np.uint8).tolist()
    vals = np.frombuffer(out["arg_val"], np.int64)
    got = dict(zip(keys, zip(types, vals.tolist())))
    assert keys == list(events[0]["args"])  # one argument each, keys as they first appear
    assert got["i"] == (3, -9223372036854775808)
    assert got["big"][0] == 7 and strings[got["big"][1]] == "18446744073709551616"
    assert vals[keys.index("f")].view(np.float64) == 0.1
    assert vals[keys.index("e")].view(np.float64) == 2.5e-7
    assert got["b"] == (2, 1) and got["n"][0] == 0
    assert json.loads(strings[got["shape"][1]]) == events[0]["args"]["shape"]
    assert json.loads(strings[got["o"][1]]) == {"k": [1, 2]}


def test_scanner_keeps_nested_values_as_their_compact_text():
    """A list or object argument is kept as its text without insignificant whitespace: the
    text as written where it has none (read in place), else a compact copy. Spaces inside
    its strings are the value's own and stay."""
    from tessera_tb.importers import _kineto_scan

    values = [  # (compact, the same written with whitespace)
        ('[[8192,32000],[],[1.50,"a b, c: d"]]', '[ [8192, 32000],\n [ ], [1.50 ,\t"a b, c: d"] ]'),
        (
            '{"k":[1,-2.5e3,true,false,null],"s":"x\\"y"}',
            '{ "k" :[1, -2.5e3,true,\r\nfalse,null] ,"s": "x\\"y"}',
        ),
        ('["","[1024, 4096]",{"":[]}]', '["", "[1024, 4096]", {"": []}]'),
        ("[]", "[ ]"),
        ("{}", "{\n}"),
        # As Kineto writes shapes and types: one space after each ',' (and ':').
        ("[[8,128,768],[768]]", "[[8, 128, 768], [768]]"),
        ('["float","c10::BFloat16",""]', '["float", "c10::BFloat16", ""]'),
        ('{"a":[1,2],"b":{"c, d":"e: f"}}', '{"a": [1, 2], "b": {"c, d": "e: f"}}'),
        # More spaces than the scanner notes where they are (256): the others dropped too.
        ("[" + ",".join(map(str, range(300))) + "]", json.dumps(list(range(300)))),
        ("[" + ",".join(['"a, b"'] * 300) + "]", json.dumps(["a, b"] * 300)),
        # Two spaces, or a space before a comma, as json's indent would not: still read.
        ("[1,2,3]", "[1,  2, 3]"),
        ("[1,2,3]", "[1 , 2, 3]"),
    ]
    for compact, spaced in values:
        assert json.loads(compact) == json.loads(spaced)
        for written in (compact, spaced):
            text = f'[{{"ph":"X","args":{{"v":{written},"n":1}}}}]'.encode()
            out = _kineto_scan.scan_events(text)
            types = np.frombuffer(out["arg_type"], np.uint8).tolist()
            vals = np.frombuffer(out["arg_val"], np.int64).tolist()
            assert types == [6, 3], written  # T_RAW, then T_INT: the next member read right
            assert out["strings"][vals[0]] == compact, written


@pytest.mark.parametrize("indent", [1, 4, 15, 16, 17, 40])
def test_scanner_reads_indented_text_of_any_width_as_compact_text(indent):
    """The single-GPU trace's first events written with json's indentation, whose line
    breaks and runs of spaces (`indent` wide per level: runs of 2 to over 100 bytes) the
    scanner skips sixteen bytes at a time: the same columns and strings as the compact
    text, except where the events start and end."""
    import gzip

    from tessera_tb.importers import _kineto_scan

    (path,) = [p for p in shared_trace_files() if "gpt_1gpu_stack" in p]
    with gzip.open(path, "rb") as f:
        events = json.load(f)["traceEvents"][:400]
    compact = _kineto_scan.scan_events(json.dumps(events, separators=(",", ":")).encode())
    indented = _kineto_scan.scan_events(json.dumps(events, indent=indent).encode())
    assert compact["n"] == indented["n"] == 400
    for key, value in compact.items():
        if key != "events_range":
            assert indented[key] == value, key


def _random_value(rng, depth: int = 0):
    """A random JSON value of the kinds argument lists hold: nested lists and objects (empty
    ones too), integers, decimals, some with exponents, strings, some with escapes, and
    the three literals."""
    kind = rng.randrange(9 if depth < 6 else 5)
    if kind == 0:
        return rng.choice([0, -1, 7, 4096, -(2**40), 10**18])
    if kind == 1:
        return rng.choice([0.5, -2.25, 1e-5, 3e20, 1.5e300])
    if kind == 2:
        return rng.choice(["", "a b", "[1024, 4096]", 'q"q', "c10::BFloat16", "\u00e9\n"])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return []
    if kind in (5, 6):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randrange(4))}


@pytest.mark.parametrize(
    "value",
    [
        '{"a":1,2}',
        "[1,]",
        "[,1]",
        '{"a"}',
        '{"a":}',
        "{1:2}",
        "[1:2]",
        '{"a":1]',
        "[1}",
        "[[1]",
        '["a"1]',
        "[01]",
        "[1.]",
        "[-]",
        "[.5]",
        "[tru]",
        "[nul]",
        '{"a":1,}',
        '{,"a":1}',
        '[1,{"a":[}]',
        '[{"a":1}{"b":2}]',
        '["a\x01"]',
        "[" * 70 + "]" * 69,
        '["a\x01,1]',
        '["a\\,1]',
        '{"a":' * 65 + "1" + "}" * 64 + "]",
    ],
)
def test_scanner_declines_damaged_nested_values(value):
    from tessera_tb.importers import _kineto_scan

    with pytest.raises(_kineto_scan.Unsupported):
        _kineto_scan.scan_events(b'[{"ph":"X","args":{"v":' + value.encode() + b',"w":1}}]')


def _numbers(value) -> list:
    """The absolute values of the numbers in a decoded JSON value."""
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    return [abs(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _without_spaces(text: bytes) -> str:
    """JSON text with the whitespace outside its strings dropped (strings kept as written)."""
    out, in_string, escaped = [], False, False
    for ch in text.decode():
        if in_string:
            in_string = escaped or ch != '"'
            escaped = not escaped and ch == "\\"
        elif ch in " \t\r\n":
            continue
        else:
            in_string = ch == '"'
        out.append(ch)
    return "".join(out)


@pytest.mark.parametrize(
    "separators", [(",", ":"), (", ", ": ")], ids=["compact", "spaced-as-kineto"]
)
def test_scanner_reads_nested_values_as_json_does(separators):
    """Random nested argument values, written compactly or spaced as Kineto writes them
    (`[[8, 128], [128]]`: one space after each ',' and ':'), and then damaged (a byte
    changed, added or cut): the scanner takes exactly the texts json takes, keeping each as
    its compact text, and reads the member after it right."""
    import random

    from tessera_tb.importers import _kineto_scan

    rng = random.Random(20261127)
    taken = 0
    for _ in range(3000):
        value = _random_value(rng)
        if not isinstance(value, (list, dict)):
            value = [value]
        text = bytearray(json.dumps(value, separators=separators).encode())
        for _ in range(rng.randrange(3)):
            pos = rng.randrange(len(text) + 1)
            what = rng.randrange(3)
            byte = rng.choice(b'{}[]",:0123456789.eE-+tfnul ')
            if what == 0 and pos < len(text):
                text[pos] = byte
            elif what == 1:
                text.insert(pos, byte)
            else:
                del text[pos : pos + 1]
        event = b'[{"ph":"X","args":{"v":' + bytes(text) + b',"w":1}}]'
        try:
            whole = json.loads(event)
        except ValueError:
            want = None
        else:
            args = whole[0].get("args") if isinstance(whole, list) and whole else None
            want = args.get("v") if isinstance(args, dict) and args.get("w") == 1 else None
            if not isinstance(want, (list, dict)) or math.inf in _numbers(want):
                continue  # damaged into another shape, or a number json reads as infinite
        try:
            out = _kineto_scan.scan_events(event)
        except _kineto_scan.Unsupported:
            assert want is None, event
            continue
        assert want is not None, event
        types = np.frombuffer(out["arg_type"], np.uint8).tolist()
        vals = np.frombuffer(out["arg_val"], np.int64).tolist()
        assert types == [6, 3] and vals[1] == 1, event
        stored = out["strings"][vals[0]]
        assert stored == _without_spaces(bytes(text)) and json.loads(stored) == want, event
        taken += 1
    assert 1000 < taken < 3000  # most values read, and some damage declined


@pytest.mark.parametrize("number", ["1e400", "-1E+309", "1" * 97, "0" + "1", "1.", "-", "1.e5"])
def test_scanner_checks_numbers_inside_nested_values(number):
    """Numbers in a nested value are checked as the event's own numbers are, though their
    values are not kept: one out of the double range, too long or malformed is declined."""
    from tessera_tb.importers import _kineto_scan

    with pytest.raises(_kineto_scan.Unsupported):
        _kineto_scan.scan_events(f'[{{"ph":"X","args":{{"v":[1,{number}]}}}}]'.encode())
    fine = _kineto_scan.scan_events(b'[{"ph":"X","args":{"v":[1,1e300,-0.5E-3]}}]')
    assert fine["strings"][np.frombuffer(fine["arg_val"], np.int64)[0]] == "[1,1e300,-0.5E-3]"


def test_scanner_tells_apart_strings_that_share_their_ends():
    """Strings of one length that share their first and last bytes (the few bytes the
    interner's first check hashes), and more short strings than it has places, keep ids of
    their own: thousands of them, of lengths 1 to 40, each read twice, in an order that
    mixes them."""
    import random

    from tessera_tb.importers import _kineto_scan

    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    names = [a + b + c for a in chars for b in chars for c in ("", *chars[:4])] + list(chars)
    names += [f"abcd{i:03x}"[: 4 + k] for k in (0, 1, 2, 3) for i in range(4096)]
    names += [f"head-of-a-name:{i:06d}:{'m' * k}tail-end" for k in range(12) for i in range(300)]
    names = list(dict.fromkeys(names))
    order = names * 2
    random.Random(7).shuffle(order)
    text = "[" + ",".join(f'{{"ph":"X","name":"{n}"}}' for n in order) + "]"
    out = _kineto_scan.scan_events(text.encode())
    got = [out["strings"][i] for i in np.frombuffer(out["name"], np.int32)]
    assert got == order
    assert len(out["strings"]) == len(names) + 2  # "" and "X"


def test_scanner_keys_arguments_by_their_own_key_in_any_order():
    """Args keys are mostly the keys of the event before, at the same place; where they are
    not (another order, another kind of event, the empty key first, a key with an escape),
    each argument still goes under its own key."""
    from tessera_tb.importers import _kineto_scan

    events = [
        {"ph": "X", "args": {"": 1, "a": 2}},
        {"ph": "X", "args": {"a": 3, "": 4}},
        {"ph": "X", "args": {"a": 5, "b": 6, "c": 7}},
        {"ph": "X", "args": {"b": 8, "a": 9}},
        {"ph": "X", "args": {"c\u00e9": 10, "a": 11}},
        {"ph": "X", "args": {"c\u00e9": 12, "c": 13}},
    ]
    want = sorted((i, k, v) for i, e in enumerate(events) for k, v in e["args"].items())
    scanner = _kineto_scan.Scanner()
    scanner.feed(json.dumps(events).encode())
    for out in (_scan_one(events), scanner.finish()):  # one call, and fed
        strings = out["strings"]
        key_sid = np.frombuffer(out["arg_key_sid"], np.int32)
        counts = np.diff(np.frombuffer(out["arg_key_start"], np.int64))
        keys = [strings[k] for k in np.repeat(key_sid, counts)]
        ev = np.frombuffer(out["arg_ev"], np.int32).tolist()
        vals = np.frombuffer(out["arg_val"], np.int64).tolist()
        assert sorted(zip(ev, keys, vals)) == want


def _number_texts() -> list[str]:
    """Integers and decimals of 1 to 24 digits in each part (the scanner's mantissa holds 19
    digits; past that it takes the value from the text), with signs, exponents and leading
    zeros in the fraction."""
    digits = "98765432109876543210987654321"
    texts = []
    for n in range(1, 25):
        whole = digits[:n]
        texts += [whole, "-" + whole, whole + "e3", "1" + "0" * (n - 1)]
        for m in range(1, 25):
            texts += [f"{whole}.{digits[-m:]}", f"-{whole}.{'0' * (m - 1)}7", f"0.{digits[:m]}"]
    # 20-digit mantissas of 2**64 + 5: wrapped to 64 bits they would read as 5 (times a power
    # of ten), a value the exact fast path takes.
    wraps = ["18446744073709551621"[:k] + "." + "18446744073709551621"[k:] for k in range(1, 20)]
    return texts + wraps + ["0", "-0", "-0.0", "0.5", "1e22", "1E-5", "1234567890" * 3]


def test_scanner_reads_numbers_of_every_length_as_json_does():
    """Each number as an argument and as `ts`: the values json reads (an integer beyond 64
    bits kept as its text). The last event's `ts` is the text's last number, two bytes from
    its end."""
    from tessera_tb.importers import _kineto_scan

    texts = _number_texts()
    text = "[" + ",".join(f'{{"ph":"X","args":{{"v":{t}}},"ts":{t}}}' for t in texts) + "]"
    out = _kineto_scan.scan_events(text.encode())
    ts = np.frombuffer(out["ts"], np.float64).tolist()
    assert ts == [float(json.loads(t)) for t in texts]
    signs = [math.copysign(1, float(json.loads(t))) for t in texts]  # "-0" is 0, "-0.0" is -0.0
    assert [math.copysign(1, v) for v in ts] == signs
    types = np.frombuffer(out["arg_type"], np.uint8).tolist()
    vals = np.frombuffer(out["arg_val"], np.int64)
    for i, t in enumerate(texts):
        value = json.loads(t)
        if types[i] == 3:  # T_INT
            assert vals[i] == value, t
        elif types[i] == 4:  # T_FLOAT
            assert vals[i : i + 1].view(np.float64)[0] == value, t
        else:  # T_BIGINT: the text itself
            assert types[i] == 7 and out["strings"][vals[i]] == t, t
            assert isinstance(value, int) and not -(2**63) <= value < 2**63, t
    # As a tid, an integer is kept as its decimal text ("-0" as "0"), the others declined.
    ints = [t for t in texts if isinstance(json.loads(t), int) and abs(json.loads(t)) < 2**63]
    text = "[" + ",".join(f'{{"ph":"X","tid":{t}}}' for t in ints) + "]"
    out = _kineto_scan.scan_events(text.encode())
    tids = [out["strings"][i] for i in np.frombuffer(out["tid"], np.int32)]
    assert tids == [str(json.loads(t)) for t in ints]
    for t in texts:
        if t not in ints:
            with pytest.raises(_kineto_scan.Unsupported):
                _kineto_scan.scan_events(f'[{{"ph":"X","tid":{t}}}]'.encode())


def test_scanner_finds_every_string_end_wherever_it_falls():
    """A quote, an escape, a control character or a multi-byte character at every place of
    strings around the 16 bytes the scanner tests at once: names as json reads them, and
    a raw control character declined."""
    from tessera_tb.importers import _kineto_scan

    names = []
    for length in range(0, 40):
        for at in range(length + 1):
            plain = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"[:length]
            names += [plain[:at] + mark + plain[at:] for mark in ('"', "\\", "\n", "\u00e9", "/")]
    text = json.dumps([{"ph": "X", "name": n, "args": {"s": n}} for n in names]).encode()
    for tail in (b"", b" " * 7):  # the text's end at another place of the last 16 bytes
        out = _kineto_scan.scan_events(text + tail)
        strings = out["strings"]
        got = [strings[i] for i in np.frombuffer(out["name"], np.int32)]
        assert got == names
        assert [strings[i] for i in np.frombuffer(out["arg_val"], np.int64)] == names
    for length in range(0, 34):
        for at in range(length + 1):
            bad = b'[{"ph": "X", "name": "' + b"a" * at + b"\x01" + b"b" * (length - at) + b'"}]'
            with pytest.raises(_kineto_scan.Unsupported):
                _kineto_scan.scan_events(bad)


@pytest.mark.parametrize(
    "text",
    [
        b'[{"ph": "X", "name": null}]',  # not a string: the pure-Python path names it
        b'[{"ph": "X", "pid": 1.5}]',
        b'[{"ph": "X", "args": {"a": 1, "a": 2}}]',  # repeated key: left to the dict rules
        b'[{"ph": "X", "ts": "12"}]',
        b'[{"ph": "X"} {"ph": "X"}]',
        b'[{"ph": "X", "ts": 1',
        b'[{"ph": "X", "name": "a\\x"}]',
        b"[3]",
        b'{"traceEvents": [], "traceEvents": []}',  # msgspec keeps the last: left to it
        b'{"schemaVersion": 1}',  # no traceEvents: the pure-Python path says so
        b'{"traceEvents": []} []',
        b'{"a": [1, 2}, "traceEvents": []}',
    ],
)
def test_scanner_declines_what_it_does_not_read(text):
    from tessera_tb.importers import _kineto_scan

    with pytest.raises(_kineto_scan.Unsupported):
        _kineto_scan.scan_events(text)


def test_scanner_reads_the_top_level_around_the_events():
    from tessera_tb.importers import _kineto_scan

    text = b' {"a": {"b": [1, "x"]}, "traceEvents": [{"ph": "X"}], "baseTimeNanoseconds": 7}\n'
    out = _kineto_scan.scan_events(text)
    spans = memoryview(out["top"]).cast("q").tolist()
    members = {
        out["strings"][k]: text[a:b] for k, a, b in zip(spans[::3], spans[1::3], spans[2::3])
    }
    assert members == {"a": b'{"b": [1, "x"]}', "baseTimeNanoseconds": b"7"}
    start, end = out["events_range"]
    assert text[start:end] == b'[{"ph": "X"}]' and out["n"] == 1


def test_declined_input_still_gets_the_pure_python_error(tmp_path):
    from tessera_tb.trace.errors import TraceFormatError

    path = tmp_path / "bad.json"
    path.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}, {"ph": "X", "ts": "late"}]}')
    with pytest.raises(TraceFormatError) as err:
        _steps(kineto_decode.read_trace(str(path)))
    assert "traceEvents[1]" in str(err.value) and "ts" in str(err.value)


def test_scanner_agrees_with_msgspec_on_mutated_real_events():
    """Differential check on damaged input: runs of real events with bytes changed or cut.
    The scanner either declines (the pure-Python path then decides) or reads exactly what
    msgspec reads; it accepts nothing msgspec refuses, except bad UTF-8 inside a field it
    skips (`s`, `bp`, unknown keys)."""
    import gzip
    import math
    import random

    import msgspec

    from tessera_tb.importers import _kineto_scan

    rng = random.Random(20261124)
    decoder = msgspec.json.Decoder(list[kineto_decode.RawEvent])
    counts = {"same": 0, "declined": 0}
    for path in shared_trace_files()[::3]:
        with open(path, "rb") as f:
            top = msgspec.json.decode(gzip.decompress(f.read()), type=dict[str, msgspec.Raw])
        raws = msgspec.json.decode(top["traceEvents"], type=list[msgspec.Raw])
        for _ in range(150):
            i = rng.randrange(len(raws))
            text = bytearray(b"[" + b",".join(bytes(r) for r in raws[i : i + 6]) + b"]")
            for _ in range(rng.randrange(1, 3)):
                pos = rng.randrange(len(text))
                if rng.random() < 0.5:
                    text[pos] = rng.choice(b'{}[]",:\\0123456789.eE-+tfnu \n\xff')
                else:
                    del text[pos : pos + rng.randrange(1, 5)]
            try:
                out = _kineto_scan.scan_events(bytes(text))
            except _kineto_scan.Unsupported:
                counts["declined"] += 1
                continue
            try:
                events = decoder.decode(bytes(text))
            except UnicodeDecodeError:
                continue
            s = out["strings"]
            ids = {k: np.frombuffer(out[k], np.int32) for k in ("ph", "cat", "name", "pid", "tid")}
            got = [tuple(s[ids[k][j]] for k in ids) for j in range(out["n"])]
            want = [(e.ph, e.cat, e.name, str(e.pid), str(e.tid)) for e in events]
            assert got == want
            for col in ("ts", "dur"):
                mine = np.frombuffer(out[col], np.float64).tolist()
                theirs = [math.nan if getattr(e, col) is None else getattr(e, col) for e in events]
                assert all(
                    a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(mine, theirs)
                )
            counts["same"] += 1
    assert counts["same"] > 100 and counts["declined"] > 100, counts
