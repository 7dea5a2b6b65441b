"""Building blocks shared by the decoder models: RMSNorm, rotary embedding, the (vocab-parallel)
token embedding."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from inflight.models import triton_fused
from inflight.models.parallel import TensorParallel
from inflight.quant import kernels as _quant_kernels


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 then cast back, as Hugging Face does (parity). On CUDA one Triton
    pass a row (models/triton_fused.py), with the residual add before it in add_forward."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton_fused.use(x):
            return triton_fused.rms_norm(x, self.weight, self.eps)[1]
        if (fused := _quant_kernels.rms_norm(x, self.weight, self.eps)) is not None:
            return fused[1]
        # HF: weight * (x.float() * rsqrt(mean(x^2) + eps)).to(dtype). rms_norm on a bf16/fp16
        # input computes in float32 and rounds once, so it is bit-identical without the casts.
        return self.weight * F.rms_norm(x, (x.shape[-1],), None, self.eps)

    def add_forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + y, self(x + y)): a decoder layer's residual add and the norm after it, in one C
        pass a row on CPU float32 where the quantized kernels are loaded (quant/kernels.py
        rms_norm; a Q8_0 32-row step 96 torch adds / norms of ~0.1 ms each), on CUDA in one Triton
        pass a row (2 of torch's launches and a round trip of the residual stream), else torch's."""
        if triton_fused.use(x):
            return triton_fused.rms_norm(x, self.weight, self.eps, residual=y)
        if (fused := _quant_kernels.rms_norm(x, self.weight, self.eps, residual=y)) is not None:
            return fused
        s = x + y
        return s, self(s)


def _rope_params(hf: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(theta, scaling dict) across transformers 4.x (`rope_scaling`) and 5.x (`rope_parameters`)."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    merged = {**params, **scaling}
    merged.setdefault("rope_type", merged.get("type", "default"))
    return theta, merged


def rope_inv_freq(hf: dict[str, Any], head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (head_dim/2,) and the attention scaling factor for cos/sin."""
    theta, sc = _rope_params(hf)
    dim = int(head_dim * float(hf.get("partial_rotary_factor", 1.0)))
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    factors = hf.get("rope_freq_factors")  # GGUF's rope_freqs.weight (llama.cpp's Llama 3.1 rope): divisors
    if factors is not None:
        inv = inv / torch.tensor(factors, dtype=torch.float32)[: inv.numel()]
    rope_type = sc["rope_type"]
    if rope_type in ("default", "mrope"):  # M-RoPE: default frequencies, split into sections by the model
        return inv, 1.0
    if rope_type == "linear":
        return inv / float(sc["factor"]), 1.0
    if rope_type == "llama3":
        return _llama3_scale(inv, sc), 1.0
    if rope_type == "yarn":
        return _yarn(inv, sc, hf, dim, theta)
    raise ValueError(f"rope_scaling: rope type {rope_type!r} is not supported")


def _llama3_scale(inv: torch.Tensor, sc: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by `factor`, short kept, smooth blend between."""
    factor = float(sc["factor"])
    low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old_len = float(sc["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def _yarn(
    inv: torch.Tensor, sc: dict[str, Any], hf: dict[str, Any], dim: int, theta: float
) -> tuple[torch.Tensor, float]:
    factor = float(sc["factor"])
    old_len = float(sc.get("original_max_position_embeddings") or hf["max_position_embeddings"])
    beta_fast, beta_slow = float(sc.get("beta_fast") or 32), float(sc.get("beta_slow") or 1)
    mscale = float(sc.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0))

    def correction_dim(rot: float) -> float:
        return (dim * math.log(old_len / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_scaled = inv / factor
    return inv_scaled * (1 - extrapolation) + inv * extrapolation, mscale


class RotaryEmbedding(nn.Module):
    """cos/sin table over positions; applied in the rotate-half layout of HF checkpoints."""

    def __init__(self, hf: dict[str, Any], head_dim: int, max_positions: int) -> None:
        super().__init__()
        device = torch.get_default_device()
        # computed on the host: under the loader's meta device each op would run torch's Python meta
        # kernels, whose first use imports torch._dynamo (4.3 s of every model load on the Zen 4 VM)
        with torch.device("cpu"):
            inv, scale = rope_inv_freq(hf, head_dim)
            self.rot_dim = inv.numel() * 2
            t = torch.arange(max_positions, dtype=torch.float32)
            freqs = torch.outer(t, inv)
            emb = torch.cat([freqs, freqs], dim=-1)  # (P, rot_dim)
            sin = emb.sin() * scale
            half = self.rot_dim // 2
            sin[:, :half] = -sin[:, :half]  # rotate_half's negation folded into the table (exact: only a sign)
            cos = emb.cos() * scale
        self.register_buffer("cos", cos.to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos, sin (T, 1, rot_dim) at `positions`, once per step for all layers.

        Cast to the model dtype like Hugging Face does, so bf16 runs round as HF's do. On the fused
        path (CUDA) just the positions: the Triton kernel reads the tables at them.
        """
        if triton_fused.use(positions) and positions.dim() == 1:
            return RopePositions(positions)
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)

    def apply(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Rotate x (T, heads, head_dim): x * cos + rotate_half(x) * sin on the first rot_dim dims.

        rotate_half(x) * sin == roll(x, half) * signed_sin bit for bit (the table carries the
        sign), one op instead of slice + neg + cat; the products and sum round as HF's do.
        """
        cos, signed_sin = rope
        xr = x[..., : self.rot_dim]
        y = xr * cos + torch.roll(xr, self.rot_dim // 2, dims=-1) * signed_sin
        return y if self.rot_dim == x.shape[-1] else torch.cat([y, x[..., self.rot_dim :]], dim=-1)

    def apply_qk(
        self, rope: Rope, qk: torch.Tensor, num_q: int, norms: tuple[RMSNorm, RMSNorm] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q (T, num_q, hd) and k (T, rest, hd) of qk (T, heads, hd) rotated, after Qwen3's per-head
        q / k `norms` when given. The fused path rotates qk in place (it is the qkv GEMM's fresh
        output) in one launch; torch's: a rotation for both, or norm + rotation for each."""
        if isinstance(rope, RopePositions):
            weights = None if norms is None else (norms[0].weight, norms[1].weight, num_q, norms[0].eps)
            triton_fused.rope_(qk, rope.positions, self.cos, self.sin, weights)
            return qk[:, :num_q], qk[:, num_q:]
        if norms is None:  # q and k side by side: one rotation for both
            qk = self.apply(rope, qk)
            return qk[:, :num_q], qk[:, num_q:]
        return self.apply(rope, norms[0](qk[:, :num_q])), self.apply(rope, norms[1](qk[:, num_q:]))


@dataclass(frozen=True)
class RopePositions:
    """A step's rotary input on the fused path: positions (T,) on the device, which the Triton kernel
    reads the float32 cos / sin tables at (no per-step gather of (T, rot_dim) tables)."""

    positions: torch.Tensor


Rope = tuple[torch.Tensor, torch.Tensor] | RopePositions  # what lookup gives every layer


class VocabEmbedding(nn.Module):
    """Token embedding, vocab-parallel under tensor parallelism: this rank holds rows
    [vocab_start, vocab_start + rows) (the vocabulary padded up to a multiple of the ranks; padding
    rows are zeros), ids outside them embed to zeros, and one all-reduce sums the ranks' rows.
    Unsharded it is nn.Embedding. Loads its own rows like a linear layer (models/linear.py)."""

    def __init__(self, vocab_size: int, hidden: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.rows, self.vocab_start = tp.padded_share(vocab_size)
        self.weight = nn.Parameter(torch.empty(self.rows, hidden))
        self.out_dtype: torch.dtype | None = None  # rows widened to this (a bf16 table in a float32 model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            x = F.embedding(ids, self.weight)
            return x if self.out_dtype is None else x.to(self.out_dtype)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.rows)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        x = x if self.out_dtype is None else x.to(self.out_dtype)
        return self.tp.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))

    def checkpoint_tensors(self, prefix: str) -> list[tuple[str, str, str | None]]:
        return [(f"{prefix}.weight", "weight", None)]

    def load(self, param: str, tensor: torch.Tensor | Any, shard: str | None = None) -> None:
        """This rank's rows of the checkpoint's (vocab, hidden) table; padding rows zeros."""
        src = tensor if not isinstance(tensor, torch.Tensor) else None
        total = tensor.shape[0]
        size = max(0, min(self.rows, total - self.vocab_start))
        if size < self.rows:
            self.weight.zero_()
        part = src.read(0, self.vocab_start, size) if src is not None else tensor[self.vocab_start : self.vocab_start + size]
        self.weight[:size].copy_(part)
