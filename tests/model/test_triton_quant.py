"""The Triton products of int4 groups (AWQ / GPTQ, act-order), int8 (weight-only and W8A8) and
FP8 (per channel, per tensor) against the portable reference (dequantize, then F.linear): on CPU
in Triton's interpreter (tests/conftest.py), on a GPU with --device cuda."""

from __future__ import annotations

import pytest
import torch

from inflight.quant import triton_kernels
from inflight.quant.linear import QuantLinear, quantize_rtn, reference_matmul
from inflight.quant.weight import QuantWeight

N, K, G = 40, 96, 32  # N not a multiple of the 32-row tile, K of three groups / tiles


def _weights() -> dict[str, QuantWeight]:
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    scales = (torch.rand(N, K // G, generator=g) * 0.05).half()
    zeros = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    dense = torch.randn(N, K, generator=g)
    w8a8 = quantize_rtn(dense, "i8c")
    w8a8.act_int8 = True
    f8t = quantize_rtn(dense, "f8c")
    f8t.scales = f8t.scales.amax().reshape(1)
    return {
        "awq": QuantWeight("i4g", (N, K), data, scales, zeros, G),
        "gptq-sym": QuantWeight("i4g", (N, K), data, scales, None, G),
        "gptq-act": QuantWeight("i4g", (N, K), data, scales, zeros, G, torch.randperm(K, generator=g).int()),
        "int8": quantize_rtn(dense, "i8c"),
        "w8a8": w8a8,
        "fp8": quantize_rtn(dense, "f8c"),
        "fp8-tensor": f8t,
    }


@pytest.mark.parametrize("case", list(_weights()))
def test_triton_matches_the_reference(case: str, test_device: str) -> None:
    w = _weights()[case]
    g = torch.Generator().manual_seed(1)
    x, bias = torch.randn(3, 5, K, generator=g), torch.randn(N, generator=g)
    ref = reference_matmul(w, x, bias)
    if test_device.startswith("cuda"):
        method = QuantLinear()
        method.weights = [w]
        method.to(torch.device(test_device))
        w, x, bias = method.weights[0], x.to(test_device), bias.to(test_device)
        assert triton_kernels.supports(w, x)
    got = triton_kernels.matmul(w, x, bias)
    assert got.shape == (3, 5, N) and got.dtype == x.dtype
    torch.testing.assert_close(got.cpu(), ref, atol=1e-4, rtol=1e-4)  # float32 sums in another order


def test_ggml_blocks_and_cpu_tensors_are_not_sent_to_triton() -> None:
    w = _weights()["awq"]
    assert not triton_kernels.supports(w, torch.randn(1, K))  # CPU: the C kernels / reference
    ggml = QuantWeight("q8_0", (N, K), torch.zeros(N, K // 32 * 34, dtype=torch.uint8))
    assert not triton_kernels.supports(ggml, torch.randn(1, K))
