"""Quantize float rows into GGML blocks (numpy), for tests and the tiny demo files.

gguf-py quantizes Q8_0 and Q4_0 but not the K-quants; this writes Q4_K, Q5_K and Q6_K in
llama.cpp's block layouts (ggml-common.h: `block_q4_K`, `block_q5_K`, `block_q6_K`) with a plain
min/max fit per sub-block (llama.cpp's `make_qkx2_quants` searches scales a little better; the
layout, which is what a reader must get right, is the same). `gguf.quants.dequantize` is the
check: tests/unit/test_ggml_quantize.py round-trips every type through it.

    Q4_K  144 bytes / 256: d f16, dmin f16, scales[12] (8 six-bit scales + 8 six-bit mins),
          qs[128] (64-element chunk c: byte c*32+l low nibble = element c*64+l, high = c*64+32+l)
    Q5_K  176 bytes / 256: as Q4_K plus qh[32] before qs: bit j of qh[l] = 5th bit of element j*32+l
    Q6_K  210 bytes / 256: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d f16;
          y = d * scale[j] * (q - 32) over 16 sub-blocks of 16
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def quantize(x: np.ndarray, qtype: str) -> np.ndarray:
    """(N, K) float -> (N, K // block_elems * block_bytes) uint8 GGML blocks of `qtype`."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, k = x.shape
    if qtype in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        from gguf import GGMLQuantizationType, quants

        return quants.quantize(x, getattr(GGMLQuantizationType, qtype.upper()))
    if k % QK_K:
        raise ValueError(f"{qtype}: K={k} is not a multiple of {QK_K}")
    blocks = x.reshape(-1, QK_K)
    fn = {"q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k}.get(qtype)
    if fn is None:
        raise ValueError(f"no quantizer for {qtype!r}")
    return fn(blocks).reshape(n, -1)


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16)


def _scale_min_fit(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Per 32-element sub-block: 6-bit scale and min indices, f16 d / dmin, and the quants."""
    sub = blocks.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0.0)  # (B, 8): y = d*sc*q - dmin*m, m >= 0
    hi = sub.max(axis=-1)
    scale = (hi - lo) / levels
    d = _f16(scale.max(axis=-1) / 63)  # (B,)
    dmin = _f16(-lo.min(axis=-1) / 63)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.clip(np.rint(scale / df), 0, 63), 0).astype(np.uint8)
        m = np.where(dminf > 0, np.clip(np.rint(-lo / dminf), 0, 63), 0).astype(np.uint8)
        step = (df * sc)[..., None]
        q = np.where(step > 0, np.rint((sub + (dminf * m)[..., None]) / step), 0)
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(-1, QK_K)
    return d, dmin, sc, m, q


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> the 12 bytes `get_scale_min_k4` unpacks."""
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return out


def _nibbles(q: np.ndarray) -> np.ndarray:
    """(B, 256) 4-bit values -> (B, 128): chunk c byte l = q[c*64+l] | q[c*64+32+l] << 4."""
    c = q.reshape(-1, 4, 2, 32)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128)


def _head(d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, m: np.ndarray) -> list[np.ndarray]:
    return [d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), _pack_scales(sc, m)]


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _scale_min_fit(blocks, 15)
    return np.concatenate([*_head(d, dmin, sc, m), _nibbles(q)], axis=1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _scale_min_fit(blocks, 31)
    high = (q >> 4).reshape(-1, 8, 32)  # bit j of qh[l] = high bit of sub-block j, element l
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= high[:, j] << j
    return np.concatenate([*_head(d, dmin, sc, m), qh, _nibbles(q & 0x0F)], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, 16, 16)
    scale = np.abs(sub).max(axis=-1) / 31  # (B, 16), signed int8 scales, kept positive here
    d = _f16(scale.max(axis=-1) / 127)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.clip(np.rint(scale / df), -128, 127), 0).astype(np.int8)
        step = (df * sc)[..., None]
        q = np.where(step != 0, np.rint(sub / step), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # (B, half, t, l)
    low, high = q & 0x0F, q >> 4
    # ql: half h, byte b*32+l: low nibble = element h*128 + b*32 + l, high = h*128 + 64 + b*32 + l
    ql = (low[:, :, 0:2] | (low[:, :, 2:4] << 4)).reshape(-1, 128)
    # qh: half h, byte l: bits 2t..2t+1 = high bits of element h*128 + t*32 + l
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(-1, 1).view(np.uint8)], axis=1)
