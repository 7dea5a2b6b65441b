"""The Triton kernels of models/triton_fused.py (imported by it on first use: importing this module
imports Triton). Arithmetic in float32; `_rnd(v, DT)` is every rounding to the model dtype HF's
modules make, at the same point (see triton_fused's docstring).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rnd(v, DT: tl.constexpr, EMULATE: tl.constexpr):  # noqa: N803, ANN001, ANN202
    """v rounded to DT (round to nearest even), returned as float32.

    EMULATE (Triton's interpreter only): its float32 -> bfloat16 cast truncates, where the GPU's
    and torch's round to nearest even; rounding the bits here first makes that cast exact.
    """
    v = v.to(tl.float32)  # (a table kept in the model dtype: already rounded)
    if EMULATE:  # noqa: SIM102 - nested: each test a constexpr, no `and` in Triton's frontend
        if DT == tl.bfloat16:  # noqa: SIM300
            u = v.to(tl.uint32, bitcast=True)
            u = u + 0x7FFF + ((u >> 16) & 1)
            v = ((u >> 16) << 16).to(tl.float32, bitcast=True)
    return v.to(DT).to(tl.float32)


@triton.jit
def rms_norm(X, R, W, S, OUT, stride_x, stride_r, stride_s, stride_o, n, eps,  # noqa: N803, ANN001, ANN201
             HAS_RES: tl.constexpr, BLOCK: tl.constexpr, EMULATE: tl.constexpr):  # fmt: skip
    """Row r: s = X[r] (+ R[r]) in the model dtype (stored when HAS_RES), OUT[r] = W * norm(s)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:  # the residual stream rounded to the model dtype, as torch's add rounds it
        x = _rnd(x + tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32), S.dtype.element_ty, EMULATE)
        tl.store(S + row * stride_s + cols, x.to(S.dtype.element_ty), mask=ok)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / n + eps)
    normed = _rnd(x * rstd, X.dtype.element_ty, EMULATE)  # HF: hidden.to(input_dtype)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    y = _rnd(w * normed, OUT.dtype.element_ty, EMULATE)
    tl.store(OUT + row * stride_o + cols, y.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def silu_mul(Y, OUT, stride_y, stride_o, inter, BLOCK: tl.constexpr, EMULATE: tl.constexpr):  # noqa: N803, ANN001, ANN201
    """OUT[r, c] = SiLU(Y[r, c]) * Y[r, inter + c], SiLU rounded to the model dtype first (HF)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    dt = OUT.dtype.element_ty
    gate = tl.load(Y + row * stride_y + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(Y + row * stride_y + inter + cols, mask=ok, other=0.0).to(tl.float32)
    act = _rnd(gate / (1.0 + tl.exp(-gate)), dt, EMULATE)
    tl.store(OUT + row * stride_o + cols, _rnd(act * up, dt, EMULATE).to(dt), mask=ok)


@triton.jit
def rope(QK, COS, SIN, POS, W_Q, W_K, stride_t, stride_h, stride_c, num_heads, num_q, eps,  # noqa: N803, ANN001, ANN201
         HEAD_DIM: tl.constexpr, HD_PAD: tl.constexpr, ROT: tl.constexpr, BLOCK_H: tl.constexpr,
         HAS_NORM: tl.constexpr, EMULATE: tl.constexpr):  # fmt: skip
    """In place on token t's heads [hb * BLOCK_H, ...) of QK: (Qwen3's per-head norm, then)
    x * cos + x[partner] * sin on the first ROT dims, partner = the same dim of the other half
    (rotate_half; the sin table's first half carries its sign)."""
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, HD_PAD)
    d_ok = d < HEAD_DIM
    rot = d < ROT
    ok = (heads < num_heads)[:, None] & d_ok[None, :]
    base = QK + t * stride_t + heads[:, None] * stride_h
    partner = tl.where(d < ROT // 2, d + ROT // 2, d - ROT // 2)
    dt = QK.dtype.element_ty
    x = tl.load(base + d[None, :], mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(base + partner[None, :], mask=ok & rot[None, :], other=0.0).to(tl.float32)
    if HAS_NORM:  # q_norm on heads < num_q, k_norm on the rest, over the whole head
        rstd = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
        is_q = (heads < num_q)[:, None]
        w = tl.where(is_q, tl.load(W_Q + d, mask=d_ok, other=0.0)[None, :], tl.load(W_K + d, mask=d_ok, other=0.0)[None, :])
        wp = tl.where(is_q, tl.load(W_Q + partner, mask=rot, other=0.0)[None, :],
                      tl.load(W_K + partner, mask=rot, other=0.0)[None, :])  # fmt: skip
        x = _rnd(w.to(tl.float32) * _rnd(x * rstd, dt, EMULATE), dt, EMULATE)
        xp = _rnd(wp.to(tl.float32) * _rnd(xp * rstd, dt, EMULATE), dt, EMULATE)
    pos = tl.load(POS + t).to(tl.int64)
    c = _rnd(tl.load(COS + pos * stride_c + d, mask=rot, other=0.0), dt, EMULATE)  # HF: cos.to(dtype)
    s = _rnd(tl.load(SIN + pos * stride_c + d, mask=rot, other=0.0), dt, EMULATE)
    y = _rnd(_rnd(x * c[None, :], dt, EMULATE) + _rnd(xp * s[None, :], dt, EMULATE), dt, EMULATE)
    y = tl.where(rot[None, :], y, x)  # dims past ROT pass through (normed, with HAS_NORM)
    store_ok = ok if HAS_NORM else ok & rot[None, :]
    tl.store(base + d[None, :], y.to(dt), mask=store_ok)
