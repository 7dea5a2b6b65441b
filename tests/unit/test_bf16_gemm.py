"""Our bf16 GEMM (inflight/csrc/bf16_gemm.c) against torch's F.linear on the same bf16 tensors:
float32 sums of bf16 products, the output rounded once to bf16, so the two differ by summation
order and at most one bf16 rounding. Every row-count path (the dot loop below 16 rows, the
16-row panels with one or two panels per tile), weight-row tails of the 8-row tile, k tails of the
32-element vector and a bias. Skipped off AVX-512 BF16; the fallbacks are tested there too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inflight import platform
from inflight.models import bf16_gemm, cpu_linear

HAS_BF16 = platform.current().can_run(bf16_gemm.FLAVOUR)
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX-512 BF16")


def _close(ours: torch.Tensor, ref32: torch.Tensor) -> None:
    # one bf16 rounding (2^-8 relative) plus float32 summation order, against the float32 result
    err = (ours.float() - ref32).abs()
    assert (err <= ref32.abs() * 2**-8 + 1e-3 * ref32.abs().max()).all(), err.max().item()


@needs_bf16
@pytest.mark.parametrize("m", [1, 2, 5, 15, 16, 17, 33, 70])
@pytest.mark.parametrize(("n", "k", "bias"), [(40, 64, False), (13, 70, True), (1, 2, False), (24, 96, True)])
def test_matches_f_linear(m: int, n: int, k: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(m * 1000 + n)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    lib = bf16_gemm.load()
    y = bf16_gemm.linear(w, x, b, lib=lib)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    ref32 = F.linear(x.float(), w.float(), None if b is None else b.float())
    _close(y, ref32)
    torch_bf16 = F.linear(x, w, b).float()  # the eager model's own rounding: within one bf16 step of ours
    assert ((y.float() - torch_bf16).abs() <= torch_bf16.abs() * 2**-7 + 1e-3 * ref32.abs().max()).all()


@needs_bf16
def test_leading_dims_and_rows_from_a_view() -> None:
    w = torch.randn(48, 128).to(torch.bfloat16)
    x = torch.randn(3, 7, 256).to(torch.bfloat16)[..., ::2]  # not contiguous
    y = bf16_gemm.linear(w, x, lib=bf16_gemm.load())
    assert y.shape == (3, 7, 48)
    _close(y, F.linear(x.float(), w.float()))


def test_falls_back_to_f_linear_where_the_kernel_does_not_take_it() -> None:
    w = torch.randn(8, 7).to(torch.bfloat16)  # odd K: no k-pairs
    x = torch.randn(3, 7).to(torch.bfloat16)
    assert not bf16_gemm.supports(w)
    assert torch.equal(bf16_gemm.linear(w, x), F.linear(x, w))
    w32, x32 = torch.randn(8, 6), torch.randn(2, 6)  # float32: torch's path
    assert torch.equal(bf16_gemm.linear(w32, x32), F.linear(x32, w32))


def test_forced_without_bf16_the_oneDNN_copy_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(platform.ENV, "native,-avx512_bf16")
    assert bf16_gemm.library() is None
    assert not cpu_linear.one_copy_available(torch.bfloat16)
    monkeypatch.delenv(platform.ENV)
    monkeypatch.setenv("INFLIGHT_BF16_GEMM", "0")
    assert not cpu_linear.one_copy_available(torch.bfloat16)
