"""Steps written and read back are identical; files are atomic; versions are enforced."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import SchemaVersionError, TraceFormatError, open_run
from tessera_tb.trace.reader import read_step_file
from tessera_tb.trace.schema_version import SCHEMA_MAJOR
from tessera_tb.trace.step import (
    KIND,
    Attr,
    Capability,
    CounterSeries,
    StepData,
    TrackInfo,
    empty_events,
)
from tessera_tb.trace.writer import WorkerWriter, new_worker_meta

BASE = 1_795_329_702_837_034_000


def small_step(step: int = 3) -> StepData:
    """Two host ops (a parent and a child), a runtime call and the kernel it launched."""
    ev = empty_events(4)
    ev["start_ns"][:] = [BASE + 100, BASE, BASE + 50, BASE + 400]
    ev["dur_ns"][:] = [200, 1000, 300, 250]
    ev["name_id"][:] = [2, 1, 3, 4]
    ev["track_id"][:] = [0, 0, 0, 1]
    ev["kind"][:] = [KIND["runtime"], KIND["cpu_op"], KIND["cpu_op"], KIND["kernel"]]
    ev["cat_id"][:] = [5, 6, 6, 7]
    ev["correlation"][:] = [77, 0, 0, 77]
    ev["external_id"][:] = [9, 8, 9, 9]
    ev["parent"][:] = [2, -1, 1, -1]
    ev["launch"][:] = [-1, -1, -1, 0]
    return StepData(
        step=step,
        start_ns=BASE,
        end_ns=BASE + 1000,
        strings=[
            "",
            "outer",
            "cudaLaunchKernel",
            "aten::mm",
            "gemm_kernel",
            "cuda_runtime",
            "cpu_op",
            "kernel",
            "[[8,8],[8,8]]",
        ],
        tracks=[
            TrackInfo(0, "host_thread", "10", "11", name="thread 11"),
            TrackInfo(1, "device_stream", "0", "7", device=0, stream=7, name="stream 7"),
        ],
        events=ev,
        attrs=[
            Attr("Input Dims", "json", np.array([2], np.int32), np.array([8], np.int32)),
            Attr("grid", "int64", np.array([3], np.int32), np.array([132], np.int64)),
            Attr("est. occupancy", "float64", np.array([3], np.int32), np.array([12.5])),
        ],
        flows={
            "flow_id": np.array([77, 77], np.int64),
            "cat_id": np.array([5, 5], np.int32),
            "phase": np.array([0, 2], np.uint8),
            "track_id": np.array([0, 1], np.int32),
            "ts_ns": np.array([BASE + 100, BASE + 400], np.int64),
            "row": np.array([0, 3], np.int32),
        },
        counters=[
            CounterSeries(
                "power_w",
                "W",
                "nvml",
                0,
                np.array([BASE + 10, BASE + 900]),
                np.array([121.5, 300.25]),
            )
        ],
        capabilities=[Capability("ncu_counters", "unavailable", "no-ncu")],
    )


def _write(tmp_path, step: StepData, worker: str = "rank0") -> str:
    run_dir = str(tmp_path / "run")
    w = WorkerWriter(run_dir, new_worker_meta(worker, rank=0, world_size=1))
    w.write_step(step)
    w.close()
    return run_dir


def _by_name(step: StepData) -> dict:
    names = step.string_values(step.events["name_id"])
    out = {}
    for row, name in enumerate(names):
        rec = {k: int(v[row]) for k, v in step.events.items() if k not in ("parent", "launch")}
        for ref in ("parent", "launch"):
            target = step.events[ref][row]
            rec[ref] = names[target] if target >= 0 else None
        rec.pop("name_id")
        rec.pop("cat_id")
        rec["cat"] = step.strings[step.events["cat_id"][row]]
        out[name] = rec
    return out


def test_step_round_trip_keeps_events_links_attrs_flows_counters(tmp_path):
    original = small_step()
    run = open_run(_write(tmp_path, original))
    back = run.load_step("rank0", 3)
    assert _by_name(back) == _by_name(original)
    assert back.start_ns == original.start_ns and back.end_ns == original.end_ns
    # rows are in canonical order: by track, start, longer first
    assert back.string_values(back.events["name_id"]).tolist() == [
        "outer",
        "aten::mm",
        "cudaLaunchKernel",
        "gemm_kernel",
    ]
    assert back.attr("Input Dims").tolist() == ["[[8,8],[8,8]]"]
    assert back.attr("Input Dims").index.tolist() == [1]  # aten::mm's new row
    assert back.attr("grid").tolist() == [132]
    assert back.attr("est. occupancy").tolist() == [12.5]
    names = back.string_values(back.events["name_id"])
    assert names[back.flows["row"]].tolist() == ["cudaLaunchKernel", "gemm_kernel"]
    np.testing.assert_array_equal(back.flows["ts_ns"], [BASE + 100, BASE + 400])
    (power,) = back.counters
    assert power.name == "power_w" and power.values.tolist() == [121.5, 300.25]
    np.testing.assert_array_equal(power.ts_ns, [BASE + 10, BASE + 900])
    assert back.capabilities[0].reason == "no-ncu"


def test_opening_a_run_reads_metadata_only(tmp_path):
    run_dir = _write(tmp_path, small_step())
    step_file = os.path.join(run_dir, "plugins", "tessera", "rank0", "step_00000003.pb")
    with open(step_file, "wb") as f:
        f.write(b"\xff not a step")  # opening must not parse it
    run = open_run(run_dir)
    assert run.steps == [3] and run.worker("rank0").rank == 0
    with pytest.raises(TraceFormatError):
        run.load_step("rank0", 3)


def test_writes_leave_no_temporary_files(tmp_path):
    run_dir = _write(tmp_path, small_step())
    wdir = os.path.join(run_dir, "plugins", "tessera", "rank0")
    assert sorted(os.listdir(wdir)) == ["meta.pb", "step_00000003.pb"]


def test_newer_major_version_is_refused_with_the_file_named(tmp_path):
    run_dir = _write(tmp_path, small_step())
    path = os.path.join(run_dir, "plugins", "tessera", "rank0", "step_00000003.pb")
    msg = pb.Step.FromString(open(path, "rb").read())
    msg.schema_major = SCHEMA_MAJOR + 1
    open(path, "wb").write(msg.SerializeToString())
    with pytest.raises(SchemaVersionError) as err:
        read_step_file(path)
    assert path in str(err.value) and f"{SCHEMA_MAJOR + 1}.0" in str(err.value)

    meta_path = os.path.join(run_dir, "plugins", "tessera", "rank0", "meta.pb")
    meta = pb.WorkerMeta.FromString(open(meta_path, "rb").read())
    meta.schema_major = SCHEMA_MAJOR + 1
    open(meta_path, "wb").write(meta.SerializeToString())
    with pytest.raises(SchemaVersionError, match="upgrade"):
        open_run(run_dir)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_step_file_is_a_format_error_naming_the_file(tmp_path, damage):
    run_dir = _write(tmp_path, small_step())
    path = os.path.join(run_dir, "plugins", "tessera", "rank0", "step_00000003.pb")
    data = open(path, "rb").read()
    damaged = {"truncate": data[: len(data) // 2], "garbage": b"\xff" * 64, "empty": b""}[damage]
    open(path, "wb").write(damaged)
    with pytest.raises(TraceFormatError) as err:
        read_step_file(path)
    assert path in str(err.value)


def test_not_a_run_is_a_clear_error(tmp_path):
    with pytest.raises(TraceFormatError, match="not a Tessera run"):
        open_run(str(tmp_path))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def test_the_step_index_is_kept_in_place_in_step_order(tmp_path):
    import random

    from tessera_tb.trace.writer import WorkerWriter, new_worker_meta

    meta = new_worker_meta("w", clock_base_ns=0, source_format="k", origin="import")
    writer = WorkerWriter(str(tmp_path), meta, staged=True)
    rng = random.Random(3)
    # Steps in order, then some out of order, then some written again.
    seq = [s for s in range(600) if s % 5] + [s for s in range(600) if s % 5 == 0]
    seq += rng.sample(range(600), 50)
    before = _rss_mb()
    for n, s in enumerate(seq * 6):
        writer._index_step(pb.StepIndexEntry(step=s, start_ns=s, end_ns=s + 1, event_count=n))
    assert writer.meta is meta  # the capture layer adds capabilities to this very object
    assert [e.step for e in meta.steps] == list(range(600))
    last = {s: n for n, s in enumerate(seq * 6)}
    assert [e.event_count for e in meta.steps] == [last[s] for s in range(600)]
    # Rebuilding the index for every step kept every deleted copy (~300 MB at 4,000 steps).
    for s in range(600, 4000):
        writer._index_step(pb.StepIndexEntry(step=s, start_ns=s, end_ns=s + 1, event_count=1))
    assert _rss_mb() - before < 40
