"""kernel_counters.pb round trip, schema version check and corrupt files."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tessera_tb.importers.ncu_csv import counter_profile, read_ncu_csv
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace.errors import SchemaVersionError, TraceFormatError
from tessera_tb.trace.kernel_counters import profile_to_proto, read_kernel_counters
from tests.conftest import SHARED_TRACES

GPT = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")


@pytest.fixture(scope="module")
def profile():
    return counter_profile(read_ncu_csv(GPT), worker="worker0")


def test_a_profile_reads_back_unchanged(tmp_path, profile):
    path = tmp_path / "kernel_counters.pb"
    path.write_bytes(profile_to_proto(profile).SerializeToString())
    back = read_kernel_counters(str(path))
    assert back.count == profile.count == 120
    assert back.kernel_names.tolist() == profile.kernel_names.tolist()
    np.testing.assert_array_equal(back.profiled_id, profile.profiled_id)
    np.testing.assert_array_equal(back.row, profile.row)
    assert back.device_name == "NVIDIA H200"
    assert set(back.metrics) == set(profile.metrics)
    for name, m in profile.metrics.items():
        b = back.metrics[name]
        assert (b.unit, b.source, b.source_unit, b.capability) == (
            m.unit,
            m.source,
            m.source_unit,
            m.capability,
        )
        np.testing.assert_array_equal(b.values, m.values)  # NaN where null, bit for bit


def test_a_newer_major_version_is_refused(tmp_path, profile):
    msg = profile_to_proto(profile)
    msg.schema_major += 1
    path = tmp_path / "kernel_counters.pb"
    path.write_bytes(msg.SerializeToString())
    with pytest.raises(SchemaVersionError, match="newer than this reader"):
        read_kernel_counters(str(path))


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: b"\xff" * 64,
        lambda data: pb.KernelCounters(count=3).SerializeToString(),
    ],
)
def test_a_damaged_file_is_a_format_error_naming_it(tmp_path, profile, damage):
    path = tmp_path / "kernel_counters.pb"
    path.write_bytes(damage(profile_to_proto(profile).SerializeToString()))
    with pytest.raises(TraceFormatError) as info:
        read_kernel_counters(str(path))
    assert info.value.path == str(path)
