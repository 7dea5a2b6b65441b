"""EAGLE head checkpoints for the tests, in the published layouts (spec_decode/eagle_head.py).

`make_mirror_target` + `make_eagle1_head(mirror=True)`: a one-layer target whose embedding rows
have unit RMS and whose norms are 1, and an EAGLE-1 head that is that layer with fc = [I | 0].
The head's entry at p then computes exactly the target's state of x_{p+1} (at rotary position p:
attention sees the same position differences), and the target's lm_head on it (unnormed: the
final norm only scales a row, argmax unchanged) gives the target's greedy token. So every draft
is accepted, which holds only if the head's paged KV, the shifted inputs and the multi-step
feed are right.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def _weights(target: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(target.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def make_mirror_target(target: Path) -> Path:
    """Rewrite a one-layer tiny checkpoint in place: unit-RMS embedding rows, norm weights 1."""
    w = _weights(target)
    emb = w["model.embed_tokens.weight"]
    w["model.embed_tokens.weight"] = (emb / emb.pow(2).mean(-1, keepdim=True).sqrt()).contiguous()
    for name in w:
        if name.endswith(("input_layernorm.weight", "model.norm.weight")):
            w[name] = torch.ones_like(w[name])
    if "lm_head.weight" in w and json.loads((target / "config.json").read_text()).get("tie_word_embeddings"):
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    for f in target.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in w.items()}, str(target / "model.safetensors"))
    return target


def make_eagle1_head(target: Path, out: Path, mirror: bool = False, seed: int = 0, **config: Any) -> Path:
    """An EAGLE-1 head for `target`: its layer 0 (mirror) or random, fc.weight (H, 2H)."""
    hf = json.loads((target / "config.json").read_text())
    hidden = hf["hidden_size"]
    w = _weights(target)
    gen = torch.Generator().manual_seed(seed)
    head: dict[str, torch.Tensor] = {}
    for name, t in w.items():
        if name.startswith("model.layers.0.") and "input_layernorm" not in name:
            head[name.removeprefix("model.")] = t if mirror else 0.1 * torch.randn(t.shape, generator=gen)
    fc = torch.zeros(hidden, 2 * hidden)
    fc[:, :hidden] = torch.eye(hidden)
    head["fc.weight"] = fc if mirror else 0.1 * torch.randn(fc.shape, generator=gen)
    head["embed_tokens.weight"] = w["model.embed_tokens.weight"]  # published heads carry a copy
    return _save(out, head, {**hf, "num_hidden_layers": 1, **config})


def make_eagle3_head(target: Path, out: Path, aux: list[int], draft_vocab: int | None = None, seed: int = 0,
                     **config: Any) -> Path:  # fmt: skip
    """A random EAGLE-3 head for `target` (LlamaForCausalLMEagle3 layout: midlayer.*, fc over 3H,
    a draft vocabulary of the target's first `draft_vocab` ids reversed, d2t / t2d)."""
    hf = json.loads((target / "config.json").read_text())
    h, vocab = hf["hidden_size"], hf["vocab_size"]
    heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads") or hf["num_attention_heads"]
    hd = hf.get("head_dim") or h // heads
    inter = hf["intermediate_size"]
    dv = draft_vocab or vocab
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return 0.1 * torch.randn(shape, generator=gen)

    head = {
        "fc.weight": rnd(h, 3 * h),
        "midlayer.input_layernorm.weight": 1 + rnd(h), "midlayer.hidden_norm.weight": 1 + rnd(h),
        "midlayer.post_attention_layernorm.weight": 1 + rnd(h),
        "midlayer.self_attn.q_proj.weight": rnd(heads * hd, 2 * h), "midlayer.self_attn.k_proj.weight": rnd(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": rnd(kv * hd, 2 * h), "midlayer.self_attn.o_proj.weight": rnd(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": rnd(inter, h), "midlayer.mlp.up_proj.weight": rnd(inter, h),
        "midlayer.mlp.down_proj.weight": rnd(h, inter), "norm.weight": 1 + rnd(h), "lm_head.weight": rnd(dv, h),
    }  # fmt: skip
    ids = torch.arange(dv - 1, -1, -1)  # draft id i is target id dv - 1 - i
    head["d2t"] = ids - torch.arange(dv)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    head["t2d"] = t2d
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": h, "intermediate_size": inter,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "num_hidden_layers": 1,
           "vocab_size": vocab, "draft_vocab_size": dv, "rms_norm_eps": hf.get("rms_norm_eps", 1e-6),
           "rope_theta": hf.get("rope_theta", 10000.0), "max_position_embeddings": hf.get("max_position_embeddings", 2048),
           "hidden_act": "silu", "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux}}  # fmt: skip
    return _save(out, head, {**cfg, **config})


def make_scripted_eagle3_head(target: Path, out: Path) -> Path:
    """An EAGLE-3 head for the scripted reasoning model (inflight/testing/reasoning.py), whose
    layers add nothing: every captured layer input at p is embed(x_p). fc = [I | 0 | 0] and zero
    output projections make the head's state embed(x_p); its lm_head maps that to the script's
    token two on, next(next(x_p)) = x_{p+2}: the right first draft of every step. The draft
    vocabulary is the script's tokens in reverse id order (d2t maps them back), so the first
    draft is right only through d2t. Later drafts repeat the first (the head feeds itself its
    own state, which the token does not change): the target rejects them."""
    w = _weights(target)
    embed, lm_head = w["model.embed_tokens.weight"], w["lm_head.weight"]
    rows = lm_head.abs().sum(-1).nonzero().flatten()  # the script's tokens after the first
    after = {int((embed @ lm_head[n]).argmax()): int(n) for n in rows}  # t -> next(t): row n = 10 embed(t)
    two_on = {t: after[n] for t, n in after.items() if n in after}
    vocab = sorted(set(two_on.values()), reverse=True)  # draft id i -> target id vocab[i]
    hf = json.loads((target / "config.json").read_text())
    head_path = make_eagle3_head(target, out, aux=[0, 0, 0], draft_vocab=len(vocab))
    head = load_file(str(head_path / "model.safetensors"))
    h = hf["hidden_size"]
    fc = torch.zeros(h, 3 * h)
    fc[:, :h] = torch.eye(h)
    head["fc.weight"] = fc
    for name in ("midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"):
        head[name] = torch.zeros_like(head[name])
    head["norm.weight"] = torch.ones(h)
    small = torch.zeros(len(vocab), h)
    for t, t2 in two_on.items():
        small[vocab.index(t2)] = 10.0 * embed[t]
    head["lm_head.weight"] = small
    head["d2t"] = torch.tensor(vocab) - torch.arange(len(vocab))
    t2d = torch.zeros(hf["vocab_size"], dtype=torch.bool)
    t2d[vocab] = True
    head["t2d"] = t2d
    save_file({k: v.contiguous() for k, v in head.items()}, str(head_path / "model.safetensors"))
    return head_path


def make_bigram_target(target: Path) -> Path:
    """Rewrite a one-layer tiny checkpoint in place so that its layer adds nothing (o_proj and
    down_proj zero): the next-token distribution after x_b is softmax(lm_head(norm(embed(x_b)))),
    a bigram model that `make_mirror_eagle3_head` can reproduce."""
    w = _weights(target)
    for name in w:
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            w[name] = torch.zeros_like(w[name])
    for f in target.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in w.items()}, str(target / "model.safetensors"))
    return target


def make_mirror_eagle3_head(target: Path, out: Path, top_k: int = 3, scale: float = 1.0) -> Path:
    """An EAGLE-3 head whose every draft has the distribution of a `make_bigram_target` target.
    Its entry at p reads x_{p+1}; sliding_window 1 makes the attention see that row alone, and
    v_proj = [I | 0], o_proj = I copy input_layernorm(embed(x_{p+1})) into the residual stream,
    which the target's final norm and lm_head rows turn into the target's logits. fc, hidden_norm
    (weight 0, norm_before_residual) and down_proj are zero, so the target's states and the head's
    own feature add nothing. The draft vocabulary is the union of the target's top-`top_k` next
    tokens over all inputs, in a shuffled order (d2t maps it back): q equals p on p's top-k only
    through d2t, and a q not renormalised over the draft vocabulary differs from p."""
    hf = json.loads((target / "config.json").read_text())
    h, inter, heads = hf["hidden_size"], hf["intermediate_size"], hf["num_attention_heads"]
    hd = h // heads
    w = _weights(target)
    embed, norm = w["model.embed_tokens.weight"], w["model.norm.weight"]
    lm_head = w.get("lm_head.weight", embed)
    eps = hf.get("rms_norm_eps", 1e-6)
    states = norm * embed * torch.rsqrt(embed.pow(2).mean(-1, keepdim=True) + eps)
    top = (states @ lm_head.T).topk(top_k, dim=-1).indices.unique()
    gen = torch.Generator().manual_seed(0)
    vocab = top[torch.randperm(top.numel(), generator=gen)]  # draft id i -> target id vocab[i]
    eye = torch.eye(h)
    head = {
        "fc.weight": torch.zeros(h, 3 * h),
        "midlayer.input_layernorm.weight": torch.ones(h), "midlayer.hidden_norm.weight": torch.zeros(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": 0.1 * torch.randn(h, 2 * h, generator=gen),
        "midlayer.self_attn.k_proj.weight": 0.1 * torch.randn(h, 2 * h, generator=gen),
        "midlayer.self_attn.v_proj.weight": torch.cat([eye, torch.zeros(h, h)], dim=1), "midlayer.self_attn.o_proj.weight": eye,
        "midlayer.mlp.gate_proj.weight": 0.1 * torch.randn(inter, h, generator=gen),
        "midlayer.mlp.up_proj.weight": 0.1 * torch.randn(inter, h, generator=gen),
        "midlayer.mlp.down_proj.weight": torch.zeros(h, inter), "norm.weight": norm.clone(), "lm_head.weight": scale * lm_head[vocab],
        "d2t": vocab - torch.arange(vocab.numel()),
    }  # fmt: skip
    t2d = torch.zeros(hf["vocab_size"], dtype=torch.bool)
    t2d[vocab] = True
    head["t2d"] = t2d
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": h, "intermediate_size": inter,
           "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": hd, "num_hidden_layers": 1,
           "vocab_size": hf["vocab_size"], "draft_vocab_size": vocab.numel(), "rms_norm_eps": eps,
           "rope_theta": 10000.0, "max_position_embeddings": hf.get("max_position_embeddings", 2048),
           "hidden_act": "silu", "sliding_window": 1, "norm_before_residual": True,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 0, 0]}}  # fmt: skip
    return _save(out, head, cfg)


def _save(out: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out
