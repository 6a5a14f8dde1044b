"""Nsight Compute raw-page CSVs: unit normalisation, thousands separators, nulls and bad input,
checked against the CSV read by hand with the csv module."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from tessera_tb.importers.ncu_csv import counter_profile, normalise_unit, read_ncu_csv
from tessera_tb.trace.errors import TraceFormatError
from tests.conftest import SHARED_TRACES

MICRO = os.path.join(SHARED_TRACES, "ncu", "microkernels_raw.csv")
GPT = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")


def _by_hand(path: str) -> tuple[list[str], list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1], rows[2:]


def _cell(path: str, metric: str) -> tuple[str, list[str]]:
    header, units, data = _by_hand(path)
    j = header.index(metric)
    return units[j], [r[j] for r in data]


@pytest.fixture(scope="module")
def micro():
    return read_ncu_csv(MICRO)


@pytest.fixture(scope="module")
def gpt():
    return read_ncu_csv(GPT)


def test_every_kernel_row_is_read_in_launch_order(micro, gpt):
    for table, path in ((micro, MICRO), (gpt, GPT)):
        _, _, data = _by_hand(path)
        assert table.count == len(data)
        assert table.ids.tolist() == [int(r[0]) for r in data]
        assert table.kernel_names.tolist() == [r[4] for r in data]


def test_thousands_separators_are_removed(micro):
    unit, cells = _cell(MICRO, "launch__grid_size")
    assert "1,056" in cells  # as written in the CSV
    expected = [float(c.replace(",", "")) for c in cells]
    np.testing.assert_array_equal(micro.values["launch__grid_size"], expected)
    assert micro.values["launch__grid_size"][0] == 1056


def test_mbyte_and_kbyte_columns_become_bytes_with_decimal_prefixes(micro):
    unit, cells = _cell(MICRO, "dram__bytes_read.sum")
    assert unit == "Mbyte" and cells[0] == "0.011520"
    assert micro.values["dram__bytes_read.sum"][0] == pytest.approx(11520.0)
    assert micro.units["dram__bytes_read.sum"] == "byte"
    unit, cells = _cell(MICRO, "launch__shared_mem_config_size")
    assert unit == "Kbyte" and cells[0] == "32.768000"
    assert micro.values["launch__shared_mem_config_size"][0] == pytest.approx(32768.0)


def test_rates_and_clocks_become_bytes_per_second_and_hertz(micro):
    unit, cells = _cell(MICRO, "dram__bytes.sum.per_second")
    assert unit == "Tbyte/s"
    np.testing.assert_allclose(
        micro.values["dram__bytes.sum.per_second"], [float(c) * 1e12 for c in cells]
    )
    unit, cells = _cell(MICRO, "dram__bytes.avg.per_second")
    assert unit == "Gbyte/s"
    np.testing.assert_allclose(
        micro.values["dram__bytes.avg.per_second"], [float(c) * 1e9 for c in cells]
    )
    unit, cells = _cell(MICRO, "sm__cycles_elapsed.avg.per_second")
    assert unit == "Ghz"
    assert micro.units["sm__cycles_elapsed.avg.per_second"] == "Hz"
    assert micro.values["sm__cycles_elapsed.avg.per_second"][0] == pytest.approx(
        float(cells[0]) * 1e9
    )


def test_other_units_are_labels_and_keep_their_values(micro):
    for metric in ("launch__shared_mem_per_block", "sm__inst_executed.sum.per_cycle_elapsed"):
        unit, cells = _cell(MICRO, metric)
        assert micro.units[metric] == unit  # "Kbyte/block", "inst/cycle": not scaled
        np.testing.assert_array_equal(micro.values[metric], [float(c) for c in cells])


def test_a_us_and_a_ms_duration_column_give_the_same_seconds(tmp_path):
    header, units, data = _by_hand(MICRO)
    j = header.index("gpu__time_duration.sum")
    assert units[j] == "us"
    as_us = [float(r[j]) for r in data]
    units[j] = "ms"
    for r in data:
        r[j] = f"{float(r[j]) / 1000:.9f}"
    path = tmp_path / "ms.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows([header, units, *data])
    table = read_ncu_csv(str(path))
    np.testing.assert_allclose(table.values["gpu__time_duration.sum"], np.array(as_us) * 1e-6)
    assert table.units["gpu__time_duration.sum"] == "s"


@pytest.mark.parametrize(
    ("unit", "metric", "scale", "normalised"),
    [
        ("ns", "", 1e-9, "s"),
        ("usecond", "", 1e-6, "s"),
        ("msecond", "", 1e-3, "s"),
        ("Gbyte", "", 1e9, "byte"),
        ("byte", "", 1.0, "byte"),
        ("Kbyte/s", "", 1e3, "byte/s"),
        ("Mbyte/second", "", 1e6, "byte/s"),
        ("Mhz", "", 1e6, "Hz"),
        ("Tbyte", "x.sum.per_second", 1e12, "byte/s"),
        ("%", "", 1.0, "%"),
        ("sector/ns", "", 1.0, "sector/ns"),
        ("Kbyte/cycle", "", 1.0, "Kbyte/cycle"),
    ],
)
def test_unit_rules(unit, metric, scale, normalised):
    assert normalise_unit(unit, metric) == (pytest.approx(scale), normalised)


def test_no_data_cells_are_null_not_zero(gpt):
    _, cells = _cell(GPT, "derived__local_spilling_requests_pct")
    assert set(cells) == {"no data"}
    assert np.isnan(gpt.values["derived__local_spilling_requests_pct"]).all()


def test_an_na_cell_is_null_and_other_rows_keep_their_values(tmp_path):
    header, units, data = _by_hand(MICRO)
    j = header.index("dram__bytes_read.sum")
    data[3][j] = "n/a"
    path = tmp_path / "na.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows([header, units, *data])
    values = read_ncu_csv(str(path)).values["dram__bytes_read.sum"]
    assert np.isnan(values[3])
    assert values[2] == pytest.approx(float(data[2][j]) * 1e6)


def test_text_columns_stay_text(micro):
    assert micro.text["Block Size"][0] == "(256, 1, 1)"
    assert micro.text["device__attribute_display_name"][0] == "NVIDIA H200"


def test_profile_maps_portable_counters_from_their_source_metrics(micro, gpt):
    p = counter_profile(micro)
    _, occ = _cell(MICRO, "sm__warps_active.avg.pct_of_peak_sustained_active")
    np.testing.assert_allclose(p.values("sm_occupancy"), [float(c) for c in occ])
    _, ratio = _cell(MICRO, "smsp__thread_inst_executed_per_inst_executed.ratio")
    np.testing.assert_allclose(
        p.values("warp_divergence_pct"), [100 * (1 - float(c) / 32) for c in ratio]
    )
    _, rd = _cell(MICRO, "dram__bytes_read.sum.per_second")  # Tbyte/s in this CSV
    np.testing.assert_allclose(p.values("dram_read_gbps"), [float(c) * 1e3 for c in rd])
    assert p.metrics["dram_read_gbps"].unit == "GB/s"
    assert p.device_name == "NVIDIA H200" and p.compute_capability == "9.0"


def test_a_metric_the_csv_lacks_is_null_with_an_unavailable_tag(gpt):
    header, _, _ = _by_hand(GPT)
    assert "dram__bytes_read.sum.per_second" not in header
    p = counter_profile(gpt)
    m = p.metrics["dram_read_gbps"]
    assert np.isnan(m.values).all() and m.values.size == gpt.count
    assert m.capability.startswith("unavailable:")
    assert "dram__bytes_read.sum.per_second" in m.capability
    assert p.metrics["smsp__inst_issued.sum"].capability.startswith("unavailable:")
    assert p.metrics["cp_async_inflight"].capability.startswith("unavailable:")


def _write(path, text: str | bytes) -> str:
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(path, mode) as f:
        f.write(text)
    return str(path)


def _good_text() -> str:
    with open(MICRO) as f:
        return f.read()


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: "", "empty file"),
        (lambda: b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not a text file"),
        (
            lambda: (
                '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
                '"0","k","SOL","Duration","us","1.0"\n'
            ),
            "details-page",
        ),
        (lambda: '"a","b"\n"1","2"\n', 'no "Kernel Name" column'),
        (lambda: '"ID","Kernel Name","Block Size"\n"","",""\n"0","k","(1, 1, 1)"\n', "no metric"),
        (lambda: _good_text()[: len(_good_text()) // 2].rsplit('","', 1)[0] + '"', "truncated"),
        (lambda: _good_text()[: len(_good_text()) // 2], "truncated"),
        (
            lambda: (
                "\n".join(
                    line if i != 3 else line.rsplit(",", 5)[0]
                    for i, line in enumerate(_good_text().splitlines())
                )
                + "\n"
            ),
            "ragged rows: row 4",
        ),
        (lambda: "\n".join(_good_text().splitlines()[:1]) + "\n", "no unit row"),
        (lambda: "\n".join(_good_text().splitlines()[:2]) + "\n", "no kernel rows"),
    ],
)
def test_bad_csvs_raise_an_error_naming_the_file(tmp_path, make, problem):
    path = _write(tmp_path / "bad.csv", make())
    with pytest.raises(TraceFormatError) as info:
        read_ncu_csv(path)
    assert info.value.path == path
    assert problem in info.value.problem
    assert "\n" not in str(info.value)
