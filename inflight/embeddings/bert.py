"""A BERT encoder in plain PyTorch, loading Hugging Face ``BertModel`` checkpoints by name.

Module names mirror the HF checkpoint (``embeddings.word_embeddings``,
``encoder.layer.{i}.attention.self.query``, ...), so ``load_state_dict`` works on the checkpoint's
tensors after dropping the parts we do not build (the pooler, MLM/NSP heads, the ``position_ids``
buffer). Only what sentence embeddings need is implemented: post-LayerNorm BERT with absolute
position embeddings, eval mode (no dropout), output = last hidden state.

Padding invariant: padded key positions are masked out of every attention softmax, so a row's
hidden states at its real positions do not depend on how much padding its batch has. Hidden
states *at* padded positions are garbage and must be ignored by pooling.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # exact erf GELU, what BERT's "gelu" means
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}

# Checkpoint tensors that exist in BertModel / BertForPreTraining files but that we don't build.
_IGNORED_PREFIXES = ("pooler.", "cls.", "embeddings.position_ids")


@dataclass(frozen=True)
class BertConfig:
    """The subset of a HF ``config.json`` (model_type "bert") the encoder needs."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        model_type = d.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(
                f"embeddings: model_type {model_type!r} is not supported (only 'bert')"
            )
        pet = d.get("position_embedding_type", "absolute")
        if pet != "absolute":
            raise ValueError(f"embeddings: position_embedding_type {pet!r} is not supported")
        act = d.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(
                f"embeddings: hidden_act {act!r} is not supported; have {sorted(_ACTIVATIONS)}"
            )
        if d["hidden_size"] % d["num_attention_heads"]:
            raise ValueError("embeddings: hidden_size must be a multiple of num_attention_heads")
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        return cls.from_dict(json.loads(path.read_text()))


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id
        )
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(token_type_ids)
            + self.position_embeddings(positions)[None]
        )
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: (B, T, H); mask: bool (B, 1, 1, T), True = attend to that key."""
        b, t, _ = x.shape

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.query),
            heads(self.key),
            heads(self.value),
            attn_mask=mask,
            scale=1.0 / math.sqrt(self.head_dim),
        )
        return out.transpose(1, 2).reshape(b, t, -1)


class BertSelfOutput(nn.Module):
    """Projection + residual + post-LayerNorm (used after attention and after the MLP)."""

    def __init__(self, cfg: BertConfig, in_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg, cfg.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertSelfOutput(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.attention(x, mask)
        return self.output(self.intermediate(h), h)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertModel(nn.Module):
    """BERT without the pooler: ``forward`` returns the last hidden state (B, T, hidden)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids / attention_mask / token_type_ids: (B, T); attention_mask 1 = real token.

        Every row must have at least one real token (else its softmax has no valid key).
        """
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"embeddings: sequence of {input_ids.shape[1]} tokens exceeds "
                f"max_position_embeddings={self.config.max_position_embeddings}"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = attention_mask.bool()[:, None, None, :]
        return self.encoder(self.embeddings(input_ids, token_type_ids), mask)

    @classmethod
    def from_pretrained(
        cls, path: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> BertModel:
        """Build from ``path/config.json`` and load the checkpoint's weights by name (strict)."""
        cfg = BertConfig.from_file(path / "config.json")
        with torch.device("meta"):
            model = cls(cfg)
        model.to_empty(device=device)
        state = _normalize_names(load_checkpoint(path))
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"embeddings: checkpoint in {path} does not match BERT: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        return model.to(dtype=dtype).eval().requires_grad_(False)


def load_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF checkpoint dir: safetensors (single or sharded), else pytorch_model.bin."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = [
            path / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))
        ]
    else:
        files = sorted(path.glob("*.safetensors"))
    if files:
        state: dict[str, torch.Tensor] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    state[name] = sf.get_tensor(name)
        return state
    binary = path / "pytorch_model.bin"
    if binary.is_file():
        return torch.load(binary, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"embeddings: no model.safetensors or pytorch_model.bin in {path}")


def _normalize_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map checkpoint names onto BertModel's: drop a ``bert.`` prefix (BertFor* checkpoints), map
    TF-era LayerNorm ``gamma``/``beta`` to ``weight``/``bias``, drop tensors we don't build."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        name = name.removeprefix("bert.")
        if name.startswith(_IGNORED_PREFIXES):
            continue
        if name.endswith("LayerNorm.gamma"):
            name = name.removesuffix("gamma") + "weight"
        elif name.endswith("LayerNorm.beta"):
            name = name.removesuffix("beta") + "bias"
        out[name] = tensor
    return out
