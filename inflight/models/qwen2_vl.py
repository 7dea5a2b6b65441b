"""Qwen2-VL and Qwen2.5-VL: a vision transformer whose merged patch embeddings replace the
prompt's placeholder tokens, in front of the Qwen2 decoder (LlamaForCausalLM) with M-RoPE.

Vision tower (`visual.*`, names as the checkpoint's):
  patch_embed.proj   Conv3d over (C, temporal_patch, patch, patch) cubes -> width
  blocks[i]          pre-norm attention (2-D rotary over patch row/column, attention within one
                     image, or within windows of it: Qwen2.5-VL outside `fullatt_block_indexes`)
                     + MLP (Qwen2-VL: fc1/quick_gelu/fc2, LayerNorm; Qwen2.5-VL: SiLU-gated, RMSNorm)
  merger             norm, then each merge x merge block of patches (contiguous rows, see the
                     processor's patchify) concatenated -> MLP -> the decoder's hidden size
M-RoPE: the head's rotary frequencies are split into (temporal, height, width) sections; each
section rotates by its own position component. Text tokens have three equal components, so a
text-only step (and every decode step: index + delta on all three) is ordinary RoPE.

Checkpoints come in two layouts: `model.layers.*` + `visual.*` (the hub's) and
`model.language_model.*` + `model.visual.*` (transformers >= 4.52); `checkpoint_name` maps both.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from inflight.config import flatten_text_config
from inflight.models.layers import RMSNorm
from inflight.models.llama import LlamaForCausalLM


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


_ACTS = {"quick_gelu": _quick_gelu, "silu": F.silu, "gelu": F.gelu}


class VisionConfig:
    """vision_config of a Qwen2-VL (`embed_dim` wide, `hidden_size` out) or Qwen2.5-VL
    (`hidden_size` wide, `out_hidden_size` out) checkpoint."""

    def __init__(self, hf: dict[str, Any], text_hidden: int) -> None:
        v = hf["vision_config"]
        self.v25 = hf.get("model_type", "").startswith("qwen2_5") or "fullatt_block_indexes" in v
        self.depth = int(v["depth"])
        self.width = int(v["hidden_size"] if self.v25 else v.get("embed_dim", 1280))
        self.out = int(
            v.get("out_hidden_size", text_hidden) if self.v25 else v.get("hidden_size", text_hidden)
        )
        self.num_heads = int(v["num_heads"])
        self.head_dim = self.width // self.num_heads
        self.intermediate = (
            int(v["intermediate_size"]) if self.v25 else int(self.width * v.get("mlp_ratio", 4))
        )
        self.act = _ACTS[v.get("hidden_act", "silu" if self.v25 else "quick_gelu")]
        self.in_channels = int(v.get("in_channels", v.get("in_chans", 3)))
        self.patch = int(v.get("patch_size", v.get("spatial_patch_size", 14)))
        self.temporal_patch = int(v.get("temporal_patch_size", 2))
        self.merge = int(v.get("spatial_merge_size", 2))
        self.window_size = int(v.get("window_size", 112))
        self.full_blocks = (
            set(v.get("fullatt_block_indexes", ())) if self.v25 else set(range(self.depth))
        )
        rope = v.get("rope_parameters") or {}
        self.theta = float(rope.get("rope_theta", 10000.0))


class PatchEmbed(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.c = c
        kernel = (c.temporal_patch, c.patch, c.patch)
        self.proj = nn.Conv3d(c.in_channels, c.width, kernel_size=kernel, stride=kernel, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.c
        x = x.view(-1, c.in_channels, c.temporal_patch, c.patch, c.patch).to(self.proj.weight.dtype)
        return self.proj(x).view(-1, c.width)  # (N, width)


class VisionAttention(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.c = c
        self.qkv = nn.Linear(c.width, 3 * c.width)
        self.proj = nn.Linear(c.width, c.width)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], lengths: list[int]
    ) -> torch.Tensor:
        n, c = x.shape[0], self.c
        q, k, v = self.qkv(x).view(n, 3, c.num_heads, c.head_dim).unbind(1)  # each (N, H, hd)
        q, k = _rotate(q, rope), _rotate(k, rope)
        outs = []
        for qs, ks, vs in zip(*(t.split(lengths) for t in (q, k, v))):  # attention within each span
            o = F.scaled_dot_product_attention(
                qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1)
            )
            outs.append(o.transpose(0, 1))  # (L, H, hd)
        return self.proj(torch.cat(outs).reshape(n, c.width))


def _rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate-half RoPE in float32, cast back (as HF's apply_rotary_pos_emb_vision)."""
    cos, sin = rope  # (N, 1, hd) float32
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class VisionMLP(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.act = c.act
        self.fc1 = nn.Linear(c.width, c.intermediate)
        self.fc2 = nn.Linear(c.intermediate, c.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class GatedVisionMLP(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.act = c.act
        self.gate_proj = nn.Linear(c.width, c.intermediate)
        self.up_proj = nn.Linear(c.width, c.intermediate)
        self.down_proj = nn.Linear(c.intermediate, c.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def _norm(c: VisionConfig, dim: int) -> nn.Module:
    return RMSNorm(dim, 1e-6) if c.v25 else nn.LayerNorm(dim, eps=1e-6)


class VisionBlock(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.norm1 = _norm(c, c.width)
        self.norm2 = _norm(c, c.width)
        self.attn = VisionAttention(c)
        self.mlp = GatedVisionMLP(c) if c.v25 else VisionMLP(c)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], lengths: list[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, lengths)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.merged = c.width * c.merge * c.merge
        self.ln_q = _norm(c, c.width)
        self.mlp = nn.Sequential(
            nn.Linear(self.merged, self.merged), nn.GELU(), nn.Linear(self.merged, c.out)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.merged))  # (N / merge^2, out)


class VisionTransformer(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.c = c
        self.patch_embed = PatchEmbed(c)
        self.blocks = nn.ModuleList(VisionBlock(c) for _ in range(c.depth))
        self.merger = PatchMerger(c)

    def _rope(
        self, grids: list[tuple[int, int, int]], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (N, 1, hd) float32: the first half of each head rotates by the patch row, the
        second by its column; rows listed merge-window by merge-window like the pixels."""
        c, m = self.c, self.c.merge
        dim = c.head_dim // 2
        inv = 1.0 / (c.theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
        rows = []
        for t, h, w in grids:
            hpos = torch.arange(h, device=device).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
            wpos = torch.arange(w, device=device).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
            hw = torch.stack(
                [hpos.transpose(1, 2).flatten(), wpos.transpose(1, 2).flatten()], dim=-1
            )
            rows.append(hw.repeat(t, 1))
        pos = torch.cat(rows)  # (N, 2)
        freqs = (pos[..., None].float() * inv).flatten(
            1
        )  # (N, hd / 2): row freqs, then column freqs
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]

    def _windows(self, grids: list[tuple[int, int, int]]) -> tuple[torch.Tensor, list[int]]:
        """Qwen2.5-VL window attention: a permutation of the merge units that makes each window
        (window_size pixels square) contiguous, per frame, and the windows' lengths in patches."""
        c = self.c
        win = c.window_size // c.merge // c.patch  # window side in merge units
        unit = c.merge * c.merge
        order: list[torch.Tensor] = []
        lengths: list[int] = []
        base = 0
        for t, h, w in grids:
            gh, gw = h // c.merge, w // c.merge
            index = torch.arange(t * gh * gw).view(t, gh, gw)
            ph, pw = -gh % win or win, -gw % win or win  # HF pads by a full window when divisible
            padded = F.pad(index, (0, pw, 0, ph), value=-1)
            nh, nw = (gh + ph) // win, (gw + pw) // win
            padded = (
                padded.view(t, nh, win, nw, win)
                .permute(0, 1, 3, 2, 4)
                .reshape(t, nh * nw, win * win)
            )
            for frame in padded:
                for window in frame:
                    kept = window[window >= 0]
                    if kept.numel():
                        order.append(kept + base)
                        lengths.append(kept.numel() * unit)
            base += t * gh * gw
        return torch.cat(order), lengths

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """(patches, C*T*p*p) pixel rows of one or more items -> (patches / merge^2, out)."""
        c = self.c
        x = self.patch_embed(pixels)
        rope = self._rope(grids, x.device)
        full = [h * w for t, h, w in grids for _ in range(t)]  # attention within each frame
        window_lengths: list[int] = full
        order = None
        if c.v25:
            order, window_lengths = self._windows(grids)
            unit = c.merge * c.merge
            n = x.shape[0]
            x = x.view(n // unit, unit, -1)[order].view(n, -1)
            rope = tuple(r.view(n // unit, unit, 1, -1)[order].view(n, 1, -1) for r in rope)  # type: ignore[assignment]
        for i, block in enumerate(self.blocks):
            x = block(x, rope, full if i in c.full_blocks else window_lengths)
        x = self.merger(x)
        if order is not None:
            x = x[torch.argsort(order)]
        return x


class Qwen2VLForConditionalGeneration(LlamaForCausalLM):
    """Also serves Qwen2_5_VLForConditionalGeneration (the vision config says which tower)."""

    def __init__(self, hf: dict[str, Any], max_positions: int) -> None:
        text = flatten_text_config(hf)
        super().__init__(text, max_positions)
        self.vision_config = VisionConfig(hf, self.spec.hidden)
        self.visual = VisionTransformer(self.vision_config)
        rotary = self.model.rotary
        sections = _mrope_sections(text)
        half = rotary.rot_dim // 2
        if sum(sections) != half:
            raise ValueError(
                f"rope_scaling.mrope_section: {sections} must add up to head_dim / 2 = {half}"
            )
        # column -> position component (0 temporal, 1 height, 2 width), both halves of the head
        sel = [i % 3 for i, n in enumerate(sections) for _ in range(n)]
        self.mrope_select = sel + sel

    @staticmethod
    def checkpoint_name(name: str) -> str:
        """transformers >= 4.52 names -> the hub layout our modules mirror."""
        if name.startswith("model.language_model."):
            return "model." + name[len("model.language_model.") :]
        if name.startswith("model.visual."):
            return name[len("model.") :]
        return name

    def encode_vision(
        self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        """Embeddings (sum of items' tokens, hidden) of one or more items, in order."""
        dtype = self.model.embed_tokens.weight.dtype
        return self.visual(pixels.to(dtype), grids).to(dtype)

    def rope(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,): plain RoPE; (3, T): M-RoPE, each column of the head from its component."""
        rotary = self.model.rotary
        if positions.dim() == 1:
            return rotary.lookup(positions, dtype)
        t = positions.shape[1]
        select = (
            torch.tensor(self.mrope_select, device=positions.device).view(1, 1, -1).expand(1, t, -1)
        )
        cos = rotary.cos[positions].gather(0, select)[0]  # (3, T, D) -> (T, D)
        sin = rotary.sin[positions].gather(0, select)[0]
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)


def _mrope_sections(hf: dict[str, Any]) -> list[int]:
    for key in ("rope_parameters", "rope_scaling"):
        sec = (hf.get(key) or {}).get("mrope_section")
        if sec:
            return [int(s) for s in sec]
    return [16, 24, 24]
