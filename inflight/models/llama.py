"""Llama-family decoder: Llama (incl. Llama 3 rope scaling), Mistral, Qwen2, Qwen3.

One module, switched by config fields:
  * qkv bias          Qwen2 (always), Llama when `attention_bias`
  * q/k RMSNorm       Qwen3 (per head, before rotary)
  * explicit head_dim Qwen3 / Mistral variants (`head_dim` != hidden / heads)
  * sliding window    Mistral (`sliding_window`), Qwen2 when `use_sliding_window`
  * tied lm_head      `tie_word_embeddings`

Module names mirror the checkpoint; the q/k/v and gate/up projections are fused (one GEMM
each), and each fused layer declares the checkpoint projections it holds (models/linear.py),
which the loader follows. Every linear layer multiplies through its linear method.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from inflight.models.attention import StepMetadata
from inflight.models.layers import RMSNorm, RotaryEmbedding
from inflight.models.linear import GateUpLinear, Linear, MergedLinear


class ArchSpec:
    """The config switches of one checkpoint, read once."""

    def __init__(self, hf: dict[str, Any]) -> None:
        arch = (hf.get("architectures") or ["LlamaForCausalLM"])[0]
        self.hidden = int(hf["hidden_size"])
        self.num_heads = int(hf["num_attention_heads"])
        self.num_kv_heads = int(hf.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(hf.get("head_dim") or self.hidden // self.num_heads)
        self.intermediate = int(hf["intermediate_size"])
        self.num_layers = int(hf["num_hidden_layers"])
        self.vocab_size = int(hf["vocab_size"])
        self.eps = float(hf.get("rms_norm_eps", 1e-6))
        self.qkv_bias = arch.startswith("Qwen2") or bool(hf.get("attention_bias", False))
        self.o_bias = bool(hf.get("attention_bias", False)) and not arch.startswith("Qwen2")
        self.mlp_bias = bool(hf.get("mlp_bias", False))
        self.qk_norm = arch.startswith("Qwen3")
        self.tie_embeddings = bool(hf.get("tie_word_embeddings", False))
        self.sliding_window = self._window(arch, hf)
        act = hf.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"hidden_act: {act!r} is not supported (silu only)")

    @staticmethod
    def _window(arch: str, hf: dict[str, Any]) -> int | None:
        window = hf.get("sliding_window")
        if not window:
            return None
        if arch.startswith("Qwen") and not hf.get("use_sliding_window", False):
            return None
        return int(window)


class Attention(nn.Module):
    def __init__(self, spec: ArchSpec, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.spec = spec
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        shards = {"q_proj": self.q_size, "k_proj": self.kv_size, "v_proj": self.kv_size}
        self.qkv_proj = MergedLinear(spec.hidden, shards, bias=spec.qkv_bias)
        self.o_proj = Linear(self.q_size, spec.hidden, bias=spec.o_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.eps)
        self.rotary = rotary
        self.scale = spec.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,  # (2, KV, slots, hd): K and V of this layer
        meta: StepMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        s = self.spec
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size :].view(t, s.num_kv_heads, s.head_dim)  # (T, KV, hd)
        if s.qk_norm:
            q, k = qkv[:, : self.q_size], qkv[:, self.q_size : self.q_size + self.kv_size]
            q = self.rotary.apply(rope, self.q_norm(q.view(t, s.num_heads, s.head_dim)))
            k = self.rotary.apply(rope, self.k_norm(k.view(t, s.num_kv_heads, s.head_dim)))
        else:  # q and k sit side by side in the GEMM output: one rotation for both
            qk = self.rotary.apply(rope, qkv[:, : self.q_size + self.kv_size].view(t, -1, s.head_dim))
            q, k = qk[:, : s.num_heads], qk[:, s.num_heads :]  # (T, H, hd), (T, KV, hd)
        o = meta.forward(q, k, v, kv_cache, self.scale)
        return self.o_proj(o.reshape(t, self.q_size))


class MLP(nn.Module):
    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        self.gate_up_proj = GateUpLinear(spec.hidden, spec.intermediate, bias=spec.mlp_bias)  # SiLU(gate) * up
        self.down_proj = Linear(spec.intermediate, spec.hidden, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ArchSpec, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden, spec.eps)
        self.self_attn = Attention(spec, rotary)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.eps)
        self.mlp = MLP(spec)

    def forward(self, x, rope, kv_cache, meta):  # type: ignore[no-untyped-def]
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, spec: ArchSpec, hf: dict[str, Any], max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden)
        rotary = RotaryEmbedding(hf, spec.head_dim, max_positions)
        self.rotary = rotary  # registered once; layers share it
        self.layers = nn.ModuleList(DecoderLayer(spec, rotary) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden, spec.eps)


class LlamaForCausalLM(nn.Module):
    """Also serves MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM."""

    def __init__(self, hf: dict[str, Any], max_positions: int) -> None:
        super().__init__()
        self.spec = ArchSpec(hf)
        self.model = DecoderModel(self.spec, hf, max_positions)
        # tied: multiplies by the embedding, given to it by tie_weights once that is real
        self.lm_head = Linear(self.spec.hidden, self.spec.vocab_size, bias=False, tied=self.spec.tie_embeddings)

    def tie_weights(self) -> None:
        """Give a tied lm_head the embedding's weight (after the model left the meta device)."""
        if self.lm_head.tied:
            self.lm_head.tie(self.model.embed_tokens.weight)

    @property
    def sliding_window(self) -> int | None:
        return self.spec.sliding_window

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.rotary.lookup(positions, dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[torch.Tensor],  # one (2, KV, slots, hd) per layer
        meta: StepMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Returns final hidden states (T, hidden)."""
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        rope = self.rope(positions, x.dtype)
        for layer, kv in zip(self.model.layers, kv_caches):
            x = layer(x, rope, kv, meta)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, hidden) -> (B, vocab) float32."""
        return self.lm_head(hidden).float()
