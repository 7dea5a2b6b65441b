"""CUDA products for AWQ / GPTQ int4 (i4g), int8 (i8c) and FP8 (f8c) weights: one Triton kernel
that dequantizes a (BLOCK_N, BLOCK_K) weight tile in registers and multiplies it into a float32
accumulator; the whole weight is never widened in memory.

    i4g  byte k/2 of row n, nibble k%2, group k // G: w = (q - z[n, g]) * s[n, g] (z = 8 without zeros)
    i8c  w = q (int8), the per-row scale applied to the accumulator at the end
    f8c  e4m3fn bits decoded arithmetically (sign, 4-bit exponent bias 7, 3-bit mantissa,
         subnormals), scale at the end, per row or per tensor

GPTQ act-order (`perm`) gathers x's columns first; W8A8 rounds x per token first, as the
portable path does (quant/linear.py). GGML blocks have no Triton kernel: they take the portable
path. Tests run this in Triton's CPU interpreter (TRITON_INTERPRET=1, tests/conftest.py).
"""

from __future__ import annotations

from typing import Any

import torch

from inflight.quant.weight import QuantWeight, quantize_activations

QTYPES = {"i4g": 0, "i8c": 1, "f8c": 2}
_KERNEL: list[Any] = []


def _qmm(X, Q, S, Z, OUT, M, N, K, G, ldq, ldsg,  # noqa: N803, ANN001 - Triton kernel
         QT: tl.constexpr, HAS_Z: tl.constexpr, PER_TENSOR: tl.constexpr,  # noqa: F821
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # noqa: F821, ANN202
    pid_m = tl.program_id(0)  # noqa: F821
    pid_n = tl.program_id(1)  # noqa: F821
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # noqa: F821
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # noqa: F821
    rk = tl.arange(0, BLOCK_K)  # noqa: F821
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # noqa: F821
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        x = tl.load(X + rm[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # noqa: F821
        wmask = n_ok[:, None] & k_ok[None, :]
        if QT == 0:
            byte = tl.load(Q + rn[:, None] * ldq + (k // 2)[None, :], mask=wmask, other=0).to(tl.int32)  # noqa: F821
            q = ((byte >> ((k % 2) * 4)[None, :]) & 0xF).to(tl.float32)  # noqa: F821
            g = (k // G)[None, :]
            s = tl.load(S + rn[:, None] * ldsg + g, mask=wmask, other=0.0).to(tl.float32)  # noqa: F821
            if HAS_Z:
                z = tl.load(Z + rn[:, None] * ldsg + g, mask=wmask, other=0).to(tl.float32)  # noqa: F821
            else:
                z = 8.0
            w = (q - z) * s
        elif QT == 1:
            w = tl.load(Q + rn[:, None] * ldq + k[None, :], mask=wmask, other=0).to(tl.float32)  # noqa: F821
        else:
            b = tl.load(Q + rn[:, None] * ldq + k[None, :], mask=wmask, other=0).to(tl.int32)  # noqa: F821
            e = (b >> 3) & 0xF
            mant = (b & 0x7).to(tl.float32)  # noqa: F821
            mag = tl.where(e == 0, mant * 0.001953125,  # noqa: F821 - subnormal: m/8 * 2^-6
                           (1.0 + mant * 0.125) * tl.exp2((e - 7).to(tl.float32)))  # noqa: F821
            w = tl.where((b & 0x80) != 0, -mag, mag)  # noqa: F821
        acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")  # noqa: F821
    if QT != 0:
        if PER_TENSOR:
            acc = acc * tl.load(S).to(tl.float32)  # noqa: F821
        else:
            acc = acc * tl.load(S + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]  # noqa: F821
    tl.store(OUT + rm[:, None] * N + rn[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])  # noqa: F821


def _kernel() -> Any:
    global triton, tl
    if not _KERNEL:
        import triton
        import triton.language as tl

        _KERNEL.append(triton.jit(_qmm))
    return _KERNEL[0]


def supports(w: QuantWeight, x: torch.Tensor) -> bool:
    """Whether QuantLinear sends this product here: a layout the kernel knows, weights and x on
    CUDA. (Tests call `matmul` directly on CPU tensors under the interpreter.)"""
    return w.qtype in QTYPES and x.is_cuda and w.data.is_cuda


def matmul(w: QuantWeight, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) @ dequantize(w)^T + bias in Triton; float32 accumulation, output in x's dtype."""
    n, k = w.shape
    lead = x.shape[:-1]
    xf = x.reshape(-1, k)
    if w.act_int8:
        xf = quantize_activations(xf)
    if w.perm is not None:
        xf = xf[:, w.perm.long()]  # stored column j multiplies feature perm[j]
    xf = xf.float().contiguous()
    m = xf.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    scales = w.scales.contiguous() if w.scales is not None else xf.new_zeros(1)
    zeros = w.zeros.contiguous() if w.zeros is not None else scales
    data = w.data.contiguous()
    block_m = 16 if m <= 16 else 32
    grid = (-(-m // block_m), -(-n // 32))
    _kernel()[grid](xf, data, scales, zeros, out, m, n, k, max(w.group_size, 1), data.shape[1],
                    scales.shape[1] if scales.dim() == 2 else 1,
                    QT=QTYPES[w.qtype], HAS_Z=w.zeros is not None, PER_TENSOR=scales.numel() == 1 and n > 1,
                    BLOCK_M=block_m, BLOCK_N=32, BLOCK_K=32)  # fmt: skip
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype).view(*lead, n)
