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

Tensor parallel (`tp`, models/parallel.py): each rank builds the same modules at its share of
the heads, intermediate rows and vocabulary; `ArchSpec` keeps the checkpoint's whole counts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from inflight.models.attention import StepMetadata
from inflight.models.layers import RMSNorm, Rope, RotaryEmbedding, VocabEmbedding
from inflight.models.linear import (
    GateUpLinear,
    Linear,
    MergedLinear,
    RowParallelLinear,
    linear_layers,
    silu_down,
)
from inflight.models.parallel import TensorParallel


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
    def __init__(self, spec: ArchSpec, rotary: RotaryEmbedding, tp: TensorParallel) -> None:
        super().__init__()
        self.spec = spec
        hd = spec.head_dim
        self.num_heads = tp.split(spec.num_heads, "num_attention_heads")  # this rank's
        self.num_kv_heads, first_kv = tp.kv_heads(spec.num_kv_heads)  # replicated when KV < ranks
        self.q_size = self.num_heads * hd
        self.kv_size = self.num_kv_heads * hd
        shards = {"q_proj": self.q_size, "k_proj": self.kv_size, "v_proj": self.kv_size}
        offsets = {"q_proj": tp.rank * self.q_size, "k_proj": first_kv * hd, "v_proj": first_kv * hd}
        self.qkv_proj = MergedLinear(spec.hidden, shards, bias=spec.qkv_bias, offsets=offsets)
        self.o_proj = RowParallelLinear(self.q_size, spec.hidden, bias=spec.o_bias, tp=tp)
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.eps)
        self.rotary = rotary
        self.scale = spec.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        rope: Rope,
        kv_cache: torch.Tensor,  # (2, KV, slots, hd): K and V of this layer
        meta: StepMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        s = self.spec
        h, kv = self.num_heads, self.num_kv_heads  # this rank's
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size :].view(t, kv, s.head_dim)  # (T, KV, hd)
        qk = qkv[:, : self.q_size + self.kv_size].view(t, h + kv, s.head_dim)  # (T, H + KV, hd)
        norms = (self.q_norm, self.k_norm) if s.qk_norm else None
        q, k = self.rotary.apply_qk(rope, qk, h, norms)  # (T, H, hd), (T, KV, hd)
        o = meta.forward(q, k, v, kv_cache, self.scale)
        return self.o_proj(o.reshape(t, self.q_size))


class MLP(nn.Module):
    def __init__(self, spec: ArchSpec, tp: TensorParallel) -> None:
        super().__init__()
        inter, start = tp.block_share(spec.intermediate, "intermediate_size")  # this rank's rows
        self.gate_up_proj = GateUpLinear(spec.hidden, inter, bias=spec.mlp_bias, row_start=start)  # SiLU(gate) * up
        self.down_proj = RowParallelLinear(inter, spec.hidden, bias=spec.mlp_bias, tp=tp, col_start=start)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = silu_down(self.gate_up_proj, self.down_proj, x)  # decode rows on CUDA, when switched on
        return fused if fused is not None else self.down_proj(self.gate_up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ArchSpec, rotary: RotaryEmbedding, tp: TensorParallel) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden, spec.eps)
        self.self_attn = Attention(spec, rotary, tp)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.eps)
        self.mlp = MLP(spec, tp)

    def forward(self, x, rope, kv_cache, meta):  # type: ignore[no-untyped-def]
        x, mlp_out = self.step(x, self.input_layernorm(x), rope, kv_cache, meta)
        return x + mlp_out

    def step(
        self, x: torch.Tensor, normed: torch.Tensor, rope: Rope, kv_cache: torch.Tensor, meta: StepMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream after attention, MLP output) from the layer's input x and its input norm:
        the model adds the MLP output in the next norm's add_forward (one fused pass on CUDA)."""
        x, h = self.post_attention_layernorm.add_forward(x, self.self_attn(normed, rope, kv_cache, meta))
        return x, self.mlp(h)


class DecoderModel(nn.Module):
    def __init__(self, spec: ArchSpec, hf: dict[str, Any], max_positions: int, tp: TensorParallel) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(spec.vocab_size, spec.hidden, tp)
        rotary = RotaryEmbedding(hf, spec.head_dim, max_positions)
        self.rotary = rotary  # registered once; layers share it
        self.layers = nn.ModuleList(DecoderLayer(spec, rotary, tp) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden, spec.eps)


class LlamaForCausalLM(nn.Module):
    """Also serves MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM."""

    def __init__(self, hf: dict[str, Any], max_positions: int, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.spec = ArchSpec(hf)
        self.tp = tp or TensorParallel.single()
        self.model = DecoderModel(self.spec, hf, max_positions, self.tp)
        # tied: multiplies by the embedding, given to it by tie_weights once that is real;
        # vocab-parallel: this rank's rows of the (padded) vocabulary, the same rows as its embedding
        rows, start = self.tp.padded_share(self.spec.vocab_size)
        self.lm_head = Linear(self.spec.hidden, rows, bias=False, tied=self.spec.tie_embeddings, row_start=start)
        for layer in linear_layers(self):
            layer.partial = self.tp.size > 1  # each loads only its part of a checkpoint tensor

    def tie_weights(self) -> None:
        """Give a tied lm_head the embedding's weight (after the model left the meta device)."""
        if self.lm_head.tied:
            self.lm_head.tie(self.model.embed_tokens.weight)

    @property
    def sliding_window(self) -> int | None:
        return self.spec.sliding_window

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        return self.model.rotary.lookup(positions, dtype)

    @property
    def num_local_kv_heads(self) -> int:
        """KV heads this rank keeps in its KV cache (all of them unsharded)."""
        return self.model.layers[0].self_attn.num_kv_heads  # type: ignore[no-any-return]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[torch.Tensor],  # one (2, KV, slots, hd) per layer
        meta: StepMetadata,
        inputs_embeds: torch.Tensor | None = None,
        aux_layers: tuple[int, ...] = (),
        aux_hidden: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Returns final hidden states (T, hidden). `aux_hidden` gets the input (T, hidden) of each
        layer in `aux_layers`, in layer order (an EAGLE-3 head reads them: spec_decode/eagle_head.py)."""
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        rope = self.rope(positions, x.dtype)
        mlp_out = None  # the previous layer's, added to the residual stream by the next norm
        for i, (layer, kv) in enumerate(zip(self.model.layers, kv_caches)):
            if mlp_out is None:
                normed = layer.input_layernorm(x)
            else:
                x, normed = layer.input_layernorm.add_forward(x, mlp_out)
            if i in aux_layers:  # a layer named twice is captured twice (tiny test targets)
                aux_hidden.extend([x] * aux_layers.count(i))  # type: ignore[union-attr]
            x, mlp_out = layer.step(x, normed, rope, kv, meta)
        return self.model.norm(x) if mlp_out is None else self.model.norm.add_forward(x, mlp_out)[1]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, hidden) -> (B, vocab) float32. Tensor parallel: every rank computes its vocabulary
        rows and all-gathers the rest, so every rank runs the same code after it (only rank 0
        samples; see worker/model_runner.py); the padding columns are cut off."""
        logits = self.lm_head(hidden)
        if self.tp.size > 1:
            logits = self.tp.all_gather(logits)[:, : self.spec.vocab_size]
        return logits.float()
