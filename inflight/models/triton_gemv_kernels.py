"""The Triton kernels of models/triton_gemv.py (imported by it on first use: importing this module
imports Triton). y = x @ W^T for a few rows of x, float32 sums, one rounding at the end.

A program owns BLOCK_N rows of W (its outputs) and one of SPLIT_K slices of K, and streams its
(BLOCK_N, BLOCK_K) tiles of W along K: rows contiguous in memory, 16-byte loads (K and the row
stride are multiples of 8 elements in every model we serve; Triton specialises on it). Two ways to
multiply a tile by x's (BLOCK_M, BLOCK_K) tile:

  DOT=False  one row of x (BLOCK_M = 1): w * x accumulated elementwise in (BLOCK_N, BLOCK_K)
             float32 registers, summed along K once after the loop: no shuffles in the loop, the
             classic GEMV; the next tile's loads issued before this tile's FMAs (Triton pipelines
             only loads that feed a dot).
  DOT=True   tl.dot on x padded to 16 rows (tensor cores; the padding is free, the bytes are W's):
             Triton's pipeliner keeps num_stages tiles of W in flight through shared memory.

SPLIT_K > 1: each slice's float32 sums go to a (SPLIT_K, M, N) partial buffer, and `reduce` adds
them in slice order (deterministic), adds the bias and rounds: for shapes with too few row blocks to
fill the SMs. SILU: x is a (M, 2I) gate_up output and the kernel multiplies by SiLU(gate) * up,
rounded as models/triton_fused.py's silu_mul rounds it (the MLP's down projection, one launch less).
"""

from __future__ import annotations

import triton
import triton.language as tl

from inflight.models.triton_fused_kernels import _rnd


@triton.jit
def _x_tile(ptr, ok, inter, SILU: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr):  # noqa: N803, ANN001, ANN202
    """x at `ptr` in float32 (zeros where not ok); SILU: SiLU(gate) * up of a gate_up row, `inter`
    columns apart, rounded as HF rounds it (SiLU(gate) to the dtype, then the product)."""
    x = tl.load(ptr, mask=ok, other=0.0).to(tl.float32)
    if SILU:
        up = tl.load(ptr + inter, mask=ok, other=0.0).to(tl.float32)
        x = _rnd(_rnd(x / (1.0 + tl.exp(-x)), DT, EMULATE) * up, DT, EMULATE)
    return x


@triton.jit
def _w_tile(w_rows, k, k_end, n_ok, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):  # noqa: N803, ANN001, ANN202
    """W[rows, k : k + BLOCK_K]. EVEN_K (the slice a whole number of tiles): no mask along K, a
    start past the slice's last tile clamped to it (the FMA loop's prefetch re-reads it from L2)."""
    if EVEN_K:  # a constexpr test: one branch is compiled, so the masks' shapes may differ
        cols = tl.minimum(k, k_end - BLOCK_K) + tl.arange(0, BLOCK_K)
        ok = n_ok[:, None]
    else:
        cols = k + tl.arange(0, BLOCK_K)
        ok = n_ok[:, None] & (cols < k_end)[None, :]
    return tl.load(w_rows + cols[None, :], mask=ok, other=0.0)


@triton.jit
def gemv(X, W, B, Y, P, size_m, size_n, size_k, inter, stride_x, stride_w, stride_y,  # noqa: N803, ANN001, ANN201
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
         EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, DOT: tl.constexpr, SILU: tl.constexpr,
         EMULATE: tl.constexpr):  # fmt: skip
    """Y[:M, rows] = X[:M] @ W[rows]^T (+ B[rows]) for this program's BLOCK_N rows; with SPLIT_K > 1
    the float32 sums over this program's K slice go to P[slice, :M, rows] instead."""
    pid_k = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rows < size_n
    m = tl.arange(0, BLOCK_M)
    m_ok = m < size_m
    span = tl.cdiv(tl.cdiv(size_k, SPLIT_K), BLOCK_K) * BLOCK_K  # each slice a whole number of tiles
    k_start = pid_k * span
    k_end = tl.minimum(k_start + span, size_k)
    w_rows = W + rows.to(tl.int64)[:, None] * stride_w  # the lm_head's N * K passes 2^31 elements
    dt = W.dtype.element_ty
    if DOT:  # Triton's pipeliner keeps num_stages tiles in flight (cp.async)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_start, k_end, BLOCK_K):
            cols = k + tl.arange(0, BLOCK_K)
            w = _w_tile(w_rows, k, k_end, n_ok, BLOCK_K, EVEN_K)
            x = _x_tile(X + m[:, None] * stride_x + cols[None, :], m_ok[:, None] & (cols < k_end)[None, :],
                        inter, SILU, dt, EMULATE)  # fmt: skip
            if EMULATE:  # the interpreter's bf16 dot is wrong; float32 products of 16-bit values are exact
                acc += tl.dot(x, tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x.to(dt), tl.trans(w))
    else:  # one row (BLOCK_M == 1); the next tile loaded before this one is multiplied: 2 in flight
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        same_row = tl.zeros((BLOCK_N, 1), dtype=tl.int32)  # x's row once per row of W
        w = _w_tile(w_rows, k_start, k_end, n_ok, BLOCK_K, EVEN_K)
        for k in range(k_start, k_end, BLOCK_K):
            w_next = _w_tile(w_rows, k + BLOCK_K, k_end, n_ok, BLOCK_K, EVEN_K)
            cols = k + tl.arange(0, BLOCK_K)
            if SILU:  # SiLU once per element: x as a vector, moved to W's layout through shared memory
                x = _x_tile(X + cols, cols < k_end, inter, SILU, dt, EMULATE)[None, :]
            else:  # x loaded BLOCK_N times in W's own layout (L1 hits): no barrier in the loop (sm_90 PTX)
                x = _x_tile(X + same_row + cols[None, :], (same_row == 0) & (cols < k_end)[None, :], inter, SILU, dt, EMULATE)
            acc2 += w.to(tl.float32) * x
            w = w_next
        acc = tl.sum(acc2, axis=1)[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K > 1:
        tl.store(P + (pid_k * size_m + m[:, None]) * size_n + rows[None, :], acc, mask=out_ok)
    else:
        if HAS_BIAS:
            acc += tl.load(B + rows, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        yt = Y.dtype.element_ty
        tl.store(Y + m[:, None] * stride_y + rows[None, :], _rnd(acc, yt, EMULATE).to(yt), mask=out_ok)


@triton.jit
def reduce(P, B, Y, size_m, size_n, stride_y, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,  # noqa: N803, ANN001, ANN201
           HAS_BIAS: tl.constexpr, EMULATE: tl.constexpr):  # fmt: skip
    """Y[m, cols] = sum over slices of P[s, m, cols] (+ B[cols]), in slice order, rounded once."""
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < size_n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(P + (s * size_m + m) * size_n + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=ok, other=0.0).to(tl.float32)
    yt = Y.dtype.element_ty
    tl.store(Y + m * stride_y + cols, _rnd(acc, yt, EMULATE).to(yt), mask=ok)
