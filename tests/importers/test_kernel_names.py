"""Kernel names spelled by Nsight Compute and by Kineto compare equal when they are the same
kernel, and differ when they are not (real pairs from ../shared/traces)."""

from __future__ import annotations

import csv
import gzip
import json
import os

import pytest

from tessera_tb.importers.kernel_names import kernel_base_name, kernel_name_key
from tests.conftest import SHARED_TRACES

GPT_CSV = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")
GPT_TRACE_DIR = os.path.join(SHARED_TRACES, "pytorch", "gpt_1gpu_stack")


@pytest.fixture(scope="module")
def ncu_names() -> list[str]:
    with open(GPT_CSV, newline="") as f:
        rows = list(csv.reader(f))
    j = rows[0].index("Kernel Name")
    return sorted({r[j] for r in rows[2:]})


@pytest.fixture(scope="module")
def kineto_names() -> list[str]:
    path = next(
        os.path.join(GPT_TRACE_DIR, f) for f in os.listdir(GPT_TRACE_DIR) if f.endswith(".gz")
    )
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted({e["name"] for e in events if e.get("cat") == "kernel"})


def _find(names: list[str], *parts: str) -> str:
    found = [n for n in names if all(p in n for p in parts)]
    assert len(found) == 1, (parts, found)
    return found[0]


# (substrings that pick the kernel in the ncu list, substrings that pick it in the Kineto list)
SAME_KERNEL = [
    (("FillFunctor<float>",), ("FillFunctor<float>",)),
    (("bfloat16_copy_kernel_cuda",), ("bfloat16_copy_kernel_cuda",)),
    (("GeluCUDAKernelImpl",), ("GeluCUDAKernelImpl",)),
    # <float, 4, 1, 0> vs <float, 4, (at::native::ADAM_MODE)1, false>
    (("FusedAdamMathFunctor",), ("FusedAdamMathFunctor",)),
    (("BinaryOpScalarFunctor",), ("BinaryOpScalarFunctor",)),
    (("vectorized_layer_norm_kernel<float",), ("vectorized_layer_norm_kernel<float",)),
    (("random_from_to_kernel",), ("random_from_to_kernel",)),
    (("CUDAFunctor_add<float>", "unrolled"), ("CUDAFunctor_add<float>", "unrolled")),
    (("direct_copy_kernel_cuda", "unrolled"), ("direct_copy_kernel_cuda", "unrolled")),
    (("cunn_SoftMaxForward<",), ("cunn_SoftMaxForward<",)),
    (("nll_loss_forward",), ("nll_loss_forward",)),
    (("vectorized_gather_kernel",), ("vectorized_gather_kernel",)),
    (("nvjet_sm90_tst_320x128",), ("nvjet_sm90_tst_320x128",)),
    (("sdpa_sm90_flash_fprop",), ("sdpa_sm90_flash_fprop",)),
]


@pytest.mark.parametrize(("ncu_parts", "kineto_parts"), SAME_KERNEL)
def test_the_same_kernel_from_both_tools_has_one_key(
    ncu_names, kineto_names, ncu_parts, kineto_parts
):
    a = _find(ncu_names, *ncu_parts)
    b = _find(kineto_names, *kineto_parts)
    assert a != b or a.startswith(("nvjet", "cudnn"))  # spelled differently, except simple names
    assert kernel_name_key(a) == kernel_name_key(b)
    assert kernel_base_name(a) == kernel_base_name(b)


def test_different_kernels_of_one_template_keep_different_keys(kineto_names):
    keys = {kernel_name_key(n) for n in kineto_names}
    assert len(keys) == len(kineto_names)
    copy = _find(kineto_names, "vectorized_elementwise_kernel<8", "bfloat16_copy")
    gelu = _find(kineto_names, "vectorized_elementwise_kernel<8", "GeluCUDAKernelImpl")
    assert kernel_base_name(copy) == kernel_base_name(gelu) == "vectorized_elementwise_kernel"
    assert kernel_name_key(copy) != kernel_name_key(gelu)


def test_element_types_are_part_of_the_key():
    ncu_bf16 = "void at::<unnamed>::vectorized_layer_norm_kernel<c10::BFloat16, float, 0>(int)"
    ncu_f32 = "void at::<unnamed>::vectorized_layer_norm_kernel<float, float, 0>(int)"
    assert kernel_name_key(ncu_bf16) != kernel_name_key(ncu_f32)


def test_a_function_only_name_keys_to_the_base_of_the_full_name(kineto_names):
    full = _find(kineto_names, "vectorized_gather_kernel")
    assert kernel_base_name("vectorized_gather_kernel") == kernel_base_name(full)
