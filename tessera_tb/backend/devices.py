"""Datasheet peaks of the GPUs the roofline knows (METRICS.md, "Roofline": peaks table).

Every number is a DENSE peak (sparse tensor throughput is twice the tensor numbers) and carries
its source. `device_peaks` picks a device from a trace's device name ("NVIDIA H200"), a short
name ("h100-sxm") or a compute capability ("sm90", "9.0"); when the choice is a guess, `note`
says so. A user can replace any number by a measured ceiling (`overrides`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

# Precision paths with a compute roof: fp64/fp32 vector pipes and the tensor paths.
PATHS = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8")
_TFLOPS_FIELD = {
    "fp64": "fp64_tflops",
    "fp64_tensor": "fp64_tensor_tflops",
    "fp32": "fp32_tflops",
    "tf32": "tf32_tflops",
    "bf16": "bf16_tflops",
    "fp16": "bf16_tflops",  # the datasheets give one number for FP16 and BF16 tensor
    "fp8": "fp8_tflops",
}

H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet"
H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet"
A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet"


@dataclass(frozen=True)
class DevicePeaks:
    """Dense datasheet peaks of one device: TFLOP/s per path, HBM TB/s (decimal: 1 TB = 1e12).

    `fp8_tflops` is None where the device has no FP8 tensor path. `sources` maps each field
    name to where its number comes from; `note` says how the device was chosen.
    """

    key: str
    name: str
    sms: int
    fp64_tflops: float
    fp64_tensor_tflops: float
    fp32_tflops: float
    tf32_tflops: float
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_tbps: float
    sources: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def peak_flops_per_s(self, path: str) -> float | None:
        """Dense compute peak of a precision path (PATHS) in FLOP/s, None where unknown."""
        attr = _TFLOPS_FIELD.get(path)
        value = getattr(self, attr) if attr else None
        return None if value is None else value * 1e12

    @property
    def bw_bytes_per_s(self) -> float:
        return self.hbm_tbps * 1e12


_NUMBERS = (
    "sms",
    "fp64_tflops",
    "fp64_tensor_tflops",
    "fp32_tflops",
    "tf32_tflops",
    "bf16_tflops",
    "fp8_tflops",
    "hbm_tbps",
)


def _device(key: str, name: str, source: str, *numbers, note: str = "") -> DevicePeaks:
    values = dict(zip(_NUMBERS, numbers))
    sources = {k: source for k, v in values.items() if v is not None}
    return DevicePeaks(key=key, name=name, sources=sources, note=note, **values)


# Columns: SMs, fp64, fp64 tensor, fp32, tf32, bf16/fp16, fp8 (dense TFLOP/s), HBM TB/s.
# fmt: off
PEAKS: dict[str, DevicePeaks] = {
    "h100-sxm": _device("h100-sxm", "H100 SXM", H100_DATASHEET,
                        132, 34, 67, 67, 495, 989, 1979, 3.35),
    "h100-pcie": _device("h100-pcie", "H100 PCIe", H100_DATASHEET,
                         114, 26, 51, 51, 378, 756, 1513, 2.0),
    "h200-sxm": _device("h200-sxm", "H200 SXM", H200_DATASHEET,
                        132, 34, 67, 67, 495, 989, 1979, 4.8),
    "h200-nvl": _device("h200-nvl", "H200 NVL", H200_DATASHEET,
                        132, 30, 60, 60, 418, 835, 1670, 4.8),
    # 2,039 GB/s on the datasheet (METRICS.md rounds it to 2.04).
    "a100-sxm-80gb": _device("a100-sxm-80gb", "A100 SXM 80GB", A100_DATASHEET,
                             108, 9.7, 19.5, 19.5, 156, 312, None, 2.039),
}
# fmt: on

# Device names as traces and tools spell them -> table key (case-insensitive, first match).
_NAME_RULES = (
    (re.compile(r"h200.*nvl"), "h200-nvl", ""),
    (re.compile(r"h200"), "h200-sxm", ""),
    (re.compile(r"h100.*pcie"), "h100-pcie", ""),
    (re.compile(r"h100.*nvl"), "h100-pcie", "H100 NVL is not in the table: using H100 PCIe"),
    (re.compile(r"h100"), "h100-sxm", ""),
    (re.compile(r"a100.*(80\s*gb|sxm4-80)"), "a100-sxm-80gb", ""),
    (
        re.compile(r"a100"),
        "a100-sxm-80gb",
        "only the A100 SXM 80GB is in the table (A100 40GB has 1.555 TB/s HBM)",
    ),
    (re.compile(r"gh200"), "h200-sxm", "GH200 is not in the table: using H200 SXM"),
)
_ARCH = re.compile(r"^(?:sm_?|compute_?)?(\d)\.?(\d)$")
_ARCH_LIKELIEST = {
    (9, 0): ("h100-sxm", "sm_90 is H100 or H200; the likeliest is H100 SXM"),
    (8, 0): ("a100-sxm-80gb", "sm_80 is A100; the likeliest in the table is A100 SXM 80GB"),
}


def device_peaks(
    name_or_arch: str,
    *,
    num_sms: int | None = None,
    overrides: dict[str, float] | None = None,
) -> DevicePeaks:
    """Peaks for a device name ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "h100-sxm") or a
    compute capability ("sm90", "sm_90", "9.0"). `num_sms` breaks an arch-only tie (114 SMs is
    an H100 PCIe). `overrides` replaces numbers by measured ceilings, e.g.
    `{"bf16_tflops": 795, "hbm_tbps": 4.3}`; their source becomes "user override".
    Raises ValueError for a device or arch the table cannot stand in for.
    """
    text = name_or_arch.strip()
    low = text.lower().replace("_", "-")
    peaks = PEAKS.get(low)
    if peaks is None:
        peaks = _by_name(low) or _by_arch(text, num_sms)
    if peaks is None:
        known = ", ".join(p.name for p in PEAKS.values())
        raise ValueError(f"no peaks for device {name_or_arch!r}; the table has {known}")
    if overrides:
        peaks = with_overrides(peaks, overrides)
    return peaks


def _by_name(low: str) -> DevicePeaks | None:
    for pattern, key, note in _NAME_RULES:
        if pattern.search(low):
            return replace(PEAKS[key], note=note or f"{PEAKS[key].name} from the device name")
    return None


def _by_arch(text: str, num_sms: int | None) -> DevicePeaks | None:
    m = _ARCH.match(text.strip().lower())
    if not m:
        return None
    arch = (int(m.group(1)), int(m.group(2)))
    if num_sms is not None:
        same = [p for p in PEAKS.values() if p.sms == num_sms and _arch_of(p) == arch]
        if same:
            return replace(same[0], note=f"sm_{arch[0]}{arch[1]} with {num_sms} SMs")
    if arch not in _ARCH_LIKELIEST:
        return None
    key, note = _ARCH_LIKELIEST[arch]
    return replace(PEAKS[key], note=note)


def _arch_of(p: DevicePeaks) -> tuple[int, int]:
    return (8, 0) if p.key.startswith("a100") else (9, 0)


def with_overrides(peaks: DevicePeaks, overrides: dict[str, float]) -> DevicePeaks:
    """A copy with measured ceilings in place of datasheet numbers (fields of DevicePeaks)."""
    unknown = sorted(set(overrides) - set(_NUMBERS))
    if unknown:
        raise ValueError(f"unknown peak fields {unknown}; use {', '.join(_NUMBERS)}")
    sources = dict(peaks.sources)
    sources.update({k: "user override (measured ceiling)" for k in overrides})
    return replace(peaks, sources=sources, **overrides)
