"""Device peaks: the METRICS.md table, a source per number, and device choice by name or arch."""

from __future__ import annotations

import pytest

from tessera_tb.backend.devices import PEAKS, device_peaks
from tessera_tb.backend.roofline import roofs

# METRICS.md, "Roofline": SMs, fp64 (tensor), fp32, tf32, bf16/fp16, fp8, HBM TB/s (dense).
METRICS_TABLE = {
    "h100-sxm": (132, 34, 67, 67, 495, 989, 1979, 3.35),
    "h100-pcie": (114, 26, 51, 51, 378, 756, 1513, 2.0),
    "h200-sxm": (132, 34, 67, 67, 495, 989, 1979, 4.8),
    "h200-nvl": (132, 30, 60, 60, 418, 835, 1670, 4.8),
    "a100-sxm-80gb": (108, 9.7, 19.5, 19.5, 156, 312, None, 2.04),
}


@pytest.mark.parametrize("key", sorted(METRICS_TABLE))
def test_the_table_holds_the_dense_datasheet_numbers(key):
    p = PEAKS[key]
    sms, fp64, fp64t, fp32, tf32, bf16, fp8, tbps = METRICS_TABLE[key]
    assert (p.sms, p.fp64_tflops, p.fp64_tensor_tflops, p.fp32_tflops) == (sms, fp64, fp64t, fp32)
    assert (p.tf32_tflops, p.bf16_tflops, p.fp8_tflops) == (tf32, bf16, fp8)
    assert p.hbm_tbps == pytest.approx(tbps, abs=0.001)  # A100: 2,039 GB/s on the datasheet
    assert p.peak_flops_per_s("fp16") == p.peak_flops_per_s("bf16") == bf16 * 1e12


@pytest.mark.parametrize("key", sorted(METRICS_TABLE))
def test_every_number_names_its_datasheet(key):
    p = PEAKS[key]
    numbers = ["sms", "fp64_tflops", "fp64_tensor_tflops", "fp32_tflops", "tf32_tflops",
               "bf16_tflops", "hbm_tbps"] + (["fp8_tflops"] if p.fp8_tflops else [])  # fmt: skip
    for field in numbers:
        assert "datasheet" in p.sources[field], field
    family = key[:4].upper()
    assert all(family in s for s in p.sources.values())


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("h100-sxm", "h100-sxm"),
        ("h200", "h200-sxm"),
        ("H100_PCIE", "h100-pcie"),
    ],
)
def test_devices_are_chosen_by_the_names_traces_and_users_give(name, key):
    assert device_peaks(name).key == key


@pytest.mark.parametrize("arch", ["sm90", "sm_90", "9.0", "90"])
def test_a_bare_compute_capability_picks_the_likeliest_device_and_says_so(arch):
    p = device_peaks(arch)
    assert p.key == "h100-sxm"
    assert "likeliest" in p.note and "H200" in p.note


def test_the_sm_count_breaks_an_arch_tie():
    assert device_peaks("sm_90", num_sms=114).key == "h100-pcie"
    assert device_peaks("8.0").key == "a100-sxm-80gb"


def test_a_guess_from_a_name_outside_the_table_says_so():
    p = device_peaks("NVIDIA A100-SXM4-40GB")
    assert p.key == "a100-sxm-80gb" and "40GB" in p.note


def test_measured_ceilings_override_datasheet_numbers():
    p = device_peaks("NVIDIA H200", overrides={"bf16_tflops": 795.0, "hbm_tbps": 4.3})
    assert p.peak_flops_per_s("bf16") == 795e12 and p.bw_bytes_per_s == 4.3e12
    assert p.sources["bf16_tflops"].startswith("user override")
    assert "datasheet" in p.sources["fp32_tflops"]
    assert PEAKS["h200-sxm"].bf16_tflops == 989  # the table is untouched
    with pytest.raises(ValueError, match="unknown peak fields"):
        device_peaks("h200", overrides={"bf16": 1.0})


def test_unknown_devices_are_an_error():
    with pytest.raises(ValueError, match="no peaks"):
        device_peaks("Radeon Instinct MI250X")
    with pytest.raises(ValueError):
        device_peaks("sm_75")


def test_roofs_have_ridge_points_at_peak_over_bandwidth():
    r = roofs(device_peaks("NVIDIA H200")).set_index("path")
    assert r.loc["hbm", "kind"] == "memory" and r.loc["hbm", "bw_bytes_per_s"] == 4.8e12
    assert r.loc["bf16", "peak_flops_per_s"] == 989e12
    assert r.loc["bf16", "ridge_flops_per_byte"] == pytest.approx(989 / 4.8)
    assert r.loc["fp32", "ridge_flops_per_byte"] == pytest.approx(67 / 4.8)
    assert "fp8" not in roofs(device_peaks("a100-sxm-80gb"))["path"].tolist()
