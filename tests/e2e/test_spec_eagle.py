"""EAGLE heads (methods eagle, eagle3) in their published layouts, and the p / q rule for drafts
the runner draws (draft model, EAGLE): greedy identical with and without speculation on every
architecture, the target's own hidden states feeding the head (EAGLE-3's aux layers against HF's
output_hidden_states), sampled outputs keep the target distribution (chi-square), and a bad head
checkpoint is one start-up error naming speculative_config.model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_spec_decode import ARGS, PROMPTS, _greedy, _run, _tokens, check_distribution

from inflight import LLM
from inflight.testing import ARCHS
from inflight.testing.eagle import (
    make_bigram_target,
    make_eagle1_head,
    make_eagle3_head,
    make_mirror_eagle3_head,
    make_mirror_target,
)


def _mirror(tiny_model_dir: Callable[..., Path], tmp_path: Path, arch: str) -> tuple[Path, Path]:
    target = tmp_path / "target"
    shutil.copytree(tiny_model_dir(arch, num_hidden_layers=1), target)
    make_mirror_target(target)
    return target, make_eagle1_head(target, tmp_path / "head", mirror=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_eagle1_mirror_head_on_every_architecture(tiny_model_dir: Callable[..., Path], tmp_path: Path, arch: str) -> None:
    """The head mirrors the one-layer target (inflight/testing/eagle.py), except that it never sees
    the first token: with Mistral's 16-token window that token is out of sight on both sides, so
    every draft must be accepted; elsewhere most are. Greedy tokens are identical either way."""
    target, head = _mirror(tiny_model_dir, tmp_path, arch)
    llm = LLM(model=str(target), speculative_config={"method": "eagle", "model": str(head), "num_speculative_tokens": 3}, **ARGS)
    base, spec = _run(llm, PROMPTS[:2], _greedy(16), False), _run(llm, PROMPTS[:2], _greedy(16))
    assert _tokens(spec) == _tokens(base)
    drafted = sum(o.metrics.num_draft_tokens for o in spec)
    accepted = sum(o.metrics.num_accepted_draft_tokens for o in spec)
    assert drafted > 0 and accepted >= (drafted if arch == "mistral" else drafted / 2), (accepted, drafted)


@pytest.mark.parametrize("arch", ["llama3", "qwen3"])
def test_eagle3_head_greedy_identical_under_preemption(tiny_model_dir: Callable[..., Path], tmp_path: Path, arch: str) -> None:
    """A random EAGLE-3 head (draft vocabulary of 200 ids mapped by d2t) over a small pool:
    chunked prefill and preemption; the tokens are the target's whatever the head proposes."""
    target = tiny_model_dir(arch)
    head = make_eagle3_head(target, tmp_path / "head", aux=[0, 1, 1], draft_vocab=200)
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3, "disable_by_batch_size": 8}
    llm = LLM(model=str(target), speculative_config=spec, max_num_seqs=4, max_num_batched_tokens=24, num_kv_blocks=12, **ARGS)
    prompts = PROMPTS + [list(range(200, 250))]
    base, outs = _run(llm, prompts, _greedy(24), False), _run(llm, prompts, _greedy(24))
    assert _tokens(outs) == _tokens(base) and llm.engine.scheduler.num_preemptions > 0
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0


def test_eagle3_reads_the_target_layers_hf_reports(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """What the head is fed: the inputs of layers (0, 1, 1) of the prompt's forward equal HF's
    output_hidden_states[0], [1], [1] (the embedding, and the state after layer 0)."""
    from transformers import AutoModelForCausalLM

    target = tiny_model_dir("llama")
    head = make_eagle3_head(target, tmp_path / "head", aux=[1, 0, 1])
    llm = LLM(model=str(target), speculative_config={"method": "eagle3", "model": str(head), "num_speculative_tokens": 2}, **ARGS)
    runner = llm.engine.executor.runner
    seen: list[list[torch.Tensor]] = []
    forward = runner.forward

    def spy(step: Any, aux: list[torch.Tensor] | None = None, head: Any = False) -> torch.Tensor:
        out = forward(step, aux, head)
        seen.append([a.clone() for a in aux or []])
        return out

    runner.forward = spy
    prompt = PROMPTS[0]
    _run(llm, [prompt], _greedy(2))
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    with torch.no_grad():
        states = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    assert len(seen[0]) == 3 and seen[0][0].shape[0] == len(prompt)  # in layer order: 0, 1, 1
    for got, layer in zip(seen[0], (0, 1, 1)):
        torch.testing.assert_close(got, states[layer][0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_sampled_drafts_keep_the_target_distribution(tiny_model_dir: Callable[..., Path], tmp_path: Path, method: str) -> None:
    """Drafts drawn from the proposer's q, verified by the p / q rule: the first two tokens over
    300 seeds follow the target's joint distribution, and most drafts are kept (the proposer
    mirrors the target: the rule keeps a draft with probability min(1, p / q) ~ 1)."""
    target, head = _mirror(tiny_model_dir, tmp_path, "mistral")
    model = str(head) if method == "eagle" else str(target)
    spec = {"method": method, "model": model, "num_speculative_tokens": 2, "disable_by_batch_size": 32}
    llm = LLM(model=str(target), max_num_seqs=32, speculative_config=spec, **ARGS)
    prompt = list(range(3, 24))
    accepted, drafted = check_distribution(llm, prompt, max_tokens=3)
    assert drafted >= 300 and accepted > 0.6 * drafted, (accepted, drafted)


def test_sampled_eagle3_drafts_keep_the_target_distribution(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """EAGLE-3 drafts drawn from q over a shuffled, reduced draft vocabulary (d2t), verified by
    the p / q rule: the first two tokens over 300 seeds follow the target's joint distribution.
    The head reproduces the bigram target's next-token logits times 3 (inflight/testing/eagle.py):
    q is a sharpened p on the right target ids only through d2t, so most drafts are kept and the
    rejected ones exercise the residual draw. A q mapped to the wrong ids keeps almost none (the
    floor); a verifying q that is not the one drawn from (unmapped, or not renormalised over the
    top-k) biases the tokens (the chi-square)."""
    target = tmp_path / "target"
    shutil.copytree(tiny_model_dir("llama", num_hidden_layers=1), target)
    make_bigram_target(target)
    head = make_mirror_eagle3_head(target, tmp_path / "head", scale=3.0)
    assert json.loads((head / "config.json").read_text())["draft_vocab_size"] < 1000
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 2, "disable_by_batch_size": 32}
    llm = LLM(model=str(target), max_num_seqs=32, speculative_config=spec, **ARGS)
    accepted, drafted = check_distribution(llm, list(range(3, 24)), max_tokens=3)
    assert drafted >= 300 and accepted > 0.7 * drafted, (accepted, drafted)  # 253 of 300 kept


def test_bad_head_checkpoints_are_start_up_errors(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    target = tiny_model_dir("qwen2")
    good = make_eagle1_head(target, tmp_path / "good")
    three = make_eagle3_head(target, tmp_path / "three", aux=[0, 1, 1])
    missing = tmp_path / "missing"
    shutil.copytree(good, missing)
    from safetensors.torch import load_file, save_file

    w = load_file(str(missing / "model.safetensors"))
    del w["layers.0.mlp.down_proj.weight"]
    save_file(w, str(missing / "model.safetensors"))
    wide = make_eagle1_head(tiny_model_dir("qwen2", hidden_size=96), tmp_path / "wide")
    bad_aux = make_eagle3_head(target, tmp_path / "aux", aux=[0, 1, 7])
    cases = [
        ("eagle", missing, r"speculative_config.model: the head checkpoint lacks \['layers.0.mlp.down_proj.weight'\]"),
        ("eagle", wide, "speculative_config.model: hidden_size 96 does not match the target's 64"),
        ("eagle3", wide, "speculative_config.model: hidden_size 96 does not match the target's 64"),
        ("eagle", three, "speculative_config.method: eagle, but .* is an EAGLE-3 head"),
        ("eagle3", bad_aux, r"speculative_config.model: eagle_aux_hidden_state_layer_ids \[0, 1, 7\]"),
        ("eagle", tmp_path / "none", "speculative_config.model: no config.json"),
    ]
    for method, head, match in cases:
        with pytest.raises(ValueError, match=match):
            LLM(model=str(target), speculative_config={"method": method, "model": str(head), "num_speculative_tokens": 2}, **ARGS)
    cfg = json.loads((good / "config.json").read_text())
    (good / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}))
    with pytest.raises(ValueError, match="speculative_config.model: num_hidden_layers 2"):
        LLM(model=str(target), speculative_config={"method": "eagle", "model": str(good), "num_speculative_tokens": 2}, **ARGS)
    with pytest.raises(ValueError, match="speculative_config.model: required with method eagle3"):
        LLM(model=str(target), speculative_config={"method": "eagle3", "num_speculative_tokens": 2}, **ARGS)


def test_adaptive_k_shrinks_when_drafts_are_rejected(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """adaptive_k: a random EAGLE-3 head's drafts are almost all rejected, so after the first
    verification a request proposes one draft per step (not K = 4); the mirror head keeps all, so
    K stays. Greedy tokens are the target's either way."""
    target = tiny_model_dir("qwen2")
    head = make_eagle3_head(target, tmp_path / "head", aux=[0, 1, 1])
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 4, "adaptive_k": True}
    llm = LLM(model=str(target), speculative_config=spec, **ARGS)
    base, outs = _run(llm, PROMPTS[:1], _greedy(20), False), _run(llm, PROMPTS[:1], _greedy(20))
    m = outs[0].metrics
    assert _tokens(outs) == _tokens(base) and m.num_accepted_draft_tokens <= 2
    # 4 drafts once, then (accepted + 1) per step: far fewer than 4 per verifying step
    assert m.num_draft_tokens <= 4 + 2 * (m.num_drafts - 1), (m.num_draft_tokens, m.num_drafts)
    mirror_target, mirror = _mirror(tiny_model_dir, tmp_path / "m", "mistral")
    llm = LLM(model=str(mirror_target), speculative_config={**spec, "method": "eagle", "model": str(mirror)}, **ARGS)
    m = _run(llm, PROMPTS[1:2], _greedy(21))[0].metrics
    assert m.num_draft_tokens == m.num_accepted_draft_tokens == 4 * m.num_drafts, (m.num_draft_tokens, m.num_drafts)


def test_eagle_under_tensor_parallelism(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """Two ranks share the target; the head lives on rank 0 with whole copies of the target's
    embedding and lm_head (the target's are vocab-parallel): the mirror's drafts are all kept."""
    target, head = _mirror(tiny_model_dir, tmp_path, "mistral")
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    ref = _tokens(_run(LLM(model=str(target), **ARGS), PROMPTS[:2], _greedy(16), False))
    llm = LLM(model=str(target), speculative_config=spec, tensor_parallel_size=2, **ARGS)
    try:
        outs = _run(llm, PROMPTS[:2], _greedy(16))
    finally:
        llm.engine.shutdown()
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    assert _tokens(outs) == ref and drafted > 0 and sum(o.metrics.num_accepted_draft_tokens for o in outs) == drafted
