"""EAGLE heads in their published layouts (methods eagle, eagle3): the module and its loader.

EAGLE-1 (e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B): one Llama decoder layer without its input norm,
fed `fc([embed(x_{p+1}); h_p])`, h_p the target's final (normed) hidden state at p; its output
goes to the target's lm_head unnormed and is also the feature of the next draft step.
  fc.weight (H, 2H) [fc.bias], layers.0.{self_attn,mlp,post_attention_layernorm}.*

EAGLE-3 (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): h_p is `fc` over three target layers'
hidden states [low; mid; high] (3H -> H); the layer attends over [norm(embed); hidden_norm(h)]
(2H wide q/k/v input), its own final norm and a draft-vocabulary lm_head; draft id i is target
id i + d2t[i]. The next step's feature is the pre-norm output (H wide: no fc).
  fc.weight (H, 3H), midlayer.{input_layernorm,hidden_norm,self_attn,mlp,post_attention_layernorm}.*,
  norm.weight, lm_head.weight (draft_vocab, H), d2t (draft_vocab,), t2d (vocab,) [unused]

Both share the target's token embedding (an `embed_tokens.weight` in the head checkpoint is the
target's copy, vLLM skips it too). Names may carry a `model.` prefix; pytorch_model.bin (what the
EAGLE authors publish) and safetensors both load. Every error names speculative_config.model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from inflight.models.layers import RMSNorm, RotaryEmbedding
from inflight.models.linear import InMemory, Linear, MergedLinear
from inflight.models.llama import ArchSpec, DecoderLayer
from inflight.models.parallel import TensorParallel
from inflight.spec_decode.eagle_config import FIELD

_SKIPPED = ("embed_tokens.weight", "t2d", "rotary_emb.inv_freq")


class EagleHead(nn.Module):
    def __init__(self, hf: dict[str, Any], target_hidden: int, eagle3: bool, fc_bias: bool, max_positions: int) -> None:
        super().__init__()
        self.spec = spec = ArchSpec(hf)
        self.eagle3 = eagle3
        self.rotary = RotaryEmbedding(hf, spec.head_dim, max_positions)
        layer = DecoderLayer(spec, self.rotary, TensorParallel.single())
        if eagle3:
            attn = layer.self_attn
            attn.qkv_proj = MergedLinear(2 * spec.hidden, attn.qkv_proj.shards, bias=spec.qkv_bias)  # [embeds; hidden]
            layer.hidden_norm = RMSNorm(spec.hidden, spec.eps)
            self.norm_before_residual = bool(hf.get("norm_before_residual", False))
            self.fc = Linear(3 * target_hidden, spec.hidden, bias=False)
            self.norm = RMSNorm(spec.hidden, spec.eps)
            self.draft_vocab = int(hf.get("draft_vocab_size") or spec.vocab_size)
            self.lm_head = Linear(spec.hidden, self.draft_vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.int64))
        else:
            layer.input_layernorm = nn.Identity()  # EAGLE-1 trains without it (vLLM drops it too)
            self.fc = Linear(2 * spec.hidden, spec.hidden, bias=fc_bias)
        self.layers = nn.ModuleList([layer])
        self.identity = True  # EAGLE-3: draft id == target id (set by load_head from d2t)

    def forward(
        self,
        embeds: torch.Tensor,  # (T, H) target embeddings of the input tokens
        feature: torch.Tensor,  # (T, H) EAGLE-1, (T, 3H) EAGLE-3 target states, (T, H) own feature
        positions: torch.Tensor,  # (T,)
        kv_cache: torch.Tensor,  # (2, KV, slots, hd)
        meta: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden for the logits, feature of the next draft step), both (T, H)."""
        layer = self.layers[0]
        rope = self.rotary.lookup(positions, embeds.dtype)
        if not self.eagle3:
            x = layer(self.fc(torch.cat([embeds, feature], dim=-1)), rope, kv_cache, meta)
            return x, x
        h = feature if feature.shape[-1] == self.spec.hidden else self.fc(feature)
        normed = layer.hidden_norm(h)
        residual = normed if self.norm_before_residual else h
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)  # (T, 2H)
        x = residual + layer.self_attn(x, rope, kv_cache, meta)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x), x

    def logits(self, hidden: torch.Tensor, target: nn.Module) -> torch.Tensor:
        """(T, vocab) float32 over the target's vocabulary (EAGLE-3: -inf off the draft vocabulary)."""
        if not self.eagle3:
            return target.compute_logits(hidden)  # type: ignore[operator,no-any-return]
        small = self.lm_head(hidden).float()  # (T, draft_vocab)
        if self.identity:
            return small
        full = small.new_full((small.shape[0], self.spec.vocab_size), float("-inf"))
        full[:, self.targets] = small
        return full


def load_head(cfg: Any, target_hidden: int, eagle3: bool) -> EagleHead:
    """The head of `cfg` (its ModelConfig: path, hf_config, dtype, device) with its weights."""
    tensors = dict(_tensors(Path(cfg.path)))
    with torch.device("meta"):
        head = EagleHead(cfg.hf_config, target_hidden, eagle3, "fc.bias" in tensors, cfg.max_model_len)
    head.to_empty(device=cfg.device)
    head.to(cfg.dtype)
    rotary = RotaryEmbedding(cfg.hf_config, head.spec.head_dim, cfg.max_model_len)
    head.rotary.cos, head.rotary.sin = rotary.cos.to(cfg.device), rotary.sin.to(cfg.device)
    targets = _targets(head)
    skip = _SKIPPED if eagle3 else (*_SKIPPED, "layers.0.input_layernorm.weight", "lm_head.weight")
    loaded = set()
    with torch.no_grad():
        for name, get in tensors.items():
            if name.endswith(skip):
                continue
            if name not in targets:
                raise ValueError(f"{FIELD}: unexpected tensor {name!r} for an EAGLE-{3 if eagle3 else 1} head")
            try:
                targets[name](InMemory(get()))
            except (ValueError, RuntimeError) as e:
                raise ValueError(f"{FIELD}: tensor {name!r}: {e}") from e
            loaded.add(name)
    missing = sorted(set(targets) - loaded - ({"d2t"} if eagle3 and head.draft_vocab == head.spec.vocab_size else set()))
    if missing:
        raise ValueError(f"{FIELD}: the head checkpoint lacks {missing[:6]}")
    if eagle3:
        head.targets = torch.arange(head.draft_vocab, device=cfg.device) + head.d2t  # (draft_vocab,) target ids
        head.identity = head.draft_vocab == head.spec.vocab_size and not bool(head.d2t.any())
        if int(head.targets.min()) < 0 or int(head.targets.max()) >= head.spec.vocab_size:
            raise ValueError(f"{FIELD}: d2t maps draft ids outside the target's vocabulary")
    return head.eval()


def _targets(head: EagleHead) -> dict[str, Callable[[torch.Tensor], object]]:
    from inflight.models.loader import checkpoint_targets

    targets: dict[str, Callable[[torch.Tensor], object]] = checkpoint_targets(head)  # type: ignore[assignment]
    targets.pop("d2t", None)
    if head.eagle3:
        targets["d2t"] = lambda src: _copy_exact(head.d2t, src.read(0, 0, src.shape[0]))
    return targets


def _copy_exact(dst: torch.Tensor, src: torch.Tensor) -> None:
    if tuple(src.shape) != tuple(dst.shape):
        raise ValueError(f"shape {list(src.shape)}, expected {list(dst.shape)}")
    dst.copy_(src)


def _tensors(path: Path) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """(checkpoint name without `model.` / with `midlayer.` as layers.0, a reader) of every tensor."""
    if not path.is_dir():
        raise ValueError(f"{FIELD}: {path} is not a directory")
    files = sorted(path.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        for f in files:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():  # noqa: SIM118 (a safetensors handle)
                    yield _rename(name), (lambda f=f, name=name: _read(f, name))
        return
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise ValueError(f"{FIELD}: no .safetensors or pytorch_model.bin weights in {path}")
    for f in bins:
        for name, t in torch.load(f, map_location="cpu", weights_only=True).items():
            yield _rename(name), (lambda t=t: t)


def _read(file: Path, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as sf:
        return sf.get_tensor(name)  # type: ignore[no-any-return]


def _rename(name: str) -> str:
    name = name.removeprefix("model.")
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name
