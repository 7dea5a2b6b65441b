"""inflight/quant/float_kernels.py: f16 / bf16 / f8c weights x every instruction-set path against
`dequantize(w) @ x` (the format's own formula, inflight/quant/weight.py).

Activations stay float32 and the weights are widened exactly, so the kernel equals the float64
product of the dequantized weight up to float32 summation order: relative 1e-5 of sum |w| |x|.
"""

from __future__ import annotations

import pytest
import torch

from inflight import platform
from inflight.models.cpu_kernel import KernelUnavailable
from inflight.quant import float_kernels
from inflight.quant.linear import QuantLinear, quantize_rtn
from inflight.quant.weight import QuantWeight, dequantize

FLAVOURS = tuple(platform.QUANT_FLAVOURS)


def make_weight(qtype: str, n: int, k: int, gen: torch.Generator, per_tensor: bool = False) -> QuantWeight:
    w = torch.randn(n, k, generator=gen) * 0.05
    if qtype == "f8c":
        qw = quantize_rtn(w, "f8c")
        return QuantWeight("f8c", qw.shape, qw.data, qw.scales[:1].clone()) if per_tensor else qw  # type: ignore[index]
    return QuantWeight(qtype, (n, k), w.to(torch.float16 if qtype == "f16" else torch.bfloat16))


def check(qw: QuantWeight, x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    w = dequantize(qw).double()
    x2 = x.reshape(-1, qw.shape[1]).double()
    exact = x2 @ w.T + (0 if bias is None else bias.double())
    scale = x2.abs() @ w.abs().T
    torch.testing.assert_close(y.reshape(exact.shape).double(), exact, rtol=0, atol=float(1e-5 * scale.max()))


def _lib(flavour: str):  # noqa: ANN202
    if not platform.current().can_run_quant(flavour):
        pytest.skip(f"{flavour} not runnable on this CPU")
    return float_kernels.load(flavour)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_flavour_builds(flavour: str) -> None:
    assert float_kernels.build(flavour)
    if not platform.current().can_run_quant(flavour):
        with pytest.raises(KernelUnavailable, match="not runnable"):
            float_kernels.load(flavour)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("qtype", float_kernels.WTYPES)
def test_matmul_matches_dequantized(flavour: str, qtype: str) -> None:
    """The dot-product path (M < 8): odd N (a single last row), odd M (rows left after blocks of
    4), K with a tail past the vector width. The panel GEMM (M >= 8): N not a multiple of the
    panel, K past one KC block of 256 and with a tail, M past blocks of 6 and past a pass of 96."""
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(len(qtype))
    for n, k, m in ((7, 37, 1), (33, 128, 5), (130, 256, 3), (9, 37, 9), (40, 600, 8), (33, 520, 13), (70, 64, 200)):
        qw = make_weight(qtype, n, k, gen, per_tensor=n == 33)
        x = torch.randn(m, k, generator=gen)
        bias = torch.randn(n, generator=gen) if m == 5 else None
        check(qw, x, float_kernels.matmul(qw, x, bias, lib=lib), bias)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_fp8_value(flavour: str) -> None:
    """All 254 finite e4m3fn bytes (subnormals, +-0, the largest 448) widen exactly."""
    lib = _lib(flavour)
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    data = torch.stack([codes, codes.flip(0)])  # (2, 254)
    qw = QuantWeight("f8c", (2, 254), data, torch.tensor([0.5, 2.0]))
    eye = torch.eye(254)
    torch.testing.assert_close(float_kernels.matmul(qw, eye, lib=lib).T, dequantize(qw), rtol=0, atol=0)


def test_dtype_leading_dims_and_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(5)
    qw = make_weight("bf16", 12, 64, gen)
    x = torch.randn(2, 3, 64, generator=gen).bfloat16()
    y = float_kernels.matmul(qw, x)
    assert y.shape == (2, 3, 12) and y.dtype == torch.bfloat16
    assert float_kernels.available(qw)
    assert not float_kernels.available(QuantWeight("q8_0", (4, 32), torch.zeros(4, 34, dtype=torch.uint8)))
    layer_method = QuantLinear()
    layer_method.weights = [qw]

    class _Layer:
        bias = None

    want = x.float() @ dequantize(qw).T
    for env in ("1", "0"):  # the C kernel, then the portable tiled path
        monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", env)
        got = layer_method.apply(_Layer(), x.float())  # type: ignore[arg-type]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
