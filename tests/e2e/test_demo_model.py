"""The demo model that ships in the package (inflight/demo_model, made by scripts/train_demo_model.py).

It is what `inflight serve` runs with no --model, so a new user's first chat must come back
as English words: these tests load it from the installed package with our engine, check the
chat output reads as words, anchor it to transformers token for token, and keep it small.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import inflight
from inflight import LLM, SamplingParams

DEMO = Path(inflight.__file__).parent / "demo_model"
PROMPTS = [
    "Hello! What is your name?",
    "What is a cat?",
    "What color is the sky?",
    "What is 3 plus 4?",
    "What day comes after Monday?",
    "Tell me a story.",
]
WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9,.!?':;-]*")


def _word_fraction(text: str) -> float:
    tokens = text.split()
    return sum(bool(WORD.fullmatch(t)) for t in tokens) / max(1, len(tokens))


def _demo_llm(dtype: str) -> LLM:
    return LLM(
        model=str(DEMO),
        dtype=dtype,
        device="cpu",
        max_num_seqs=8,
        num_kv_blocks=64,
        block_size=16,
        progress=False,
    )


@pytest.fixture(scope="module")
def llm() -> LLM:
    return _demo_llm("auto")  # as served: the checkpoint's own dtype (bfloat16)


def test_demo_model_ships_with_the_package() -> None:
    names = {p.name for p in DEMO.iterdir()}
    for required in ("config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"):
        assert required in names, f"{required} missing from {DEMO}"
    weights = sum(p.stat().st_size for p in DEMO.glob("*.safetensors"))
    assert weights < 10 * 1024 * 1024, f"demo weights are {weights / 1e6:.1f} MB"
    config = json.loads((DEMO / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    gen = json.loads((DEMO / "generation_config.json").read_text())
    assert "<|im_start|>" in json.loads((DEMO / "tokenizer_config.json").read_text())["chat_template"]
    added = {t["content"]: t["id"] for t in json.loads((DEMO / "tokenizer.json").read_text())["added_tokens"]}
    assert gen["eos_token_id"] == config["eos_token_id"] == added["<|im_end|>"]


def test_greedy_chat_is_english(llm: LLM) -> None:
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    outs = llm.chat(conversations, SamplingParams(max_tokens=96, temperature=0.0), use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        o = out.outputs[0]
        assert o.finish_reason == "stop", f"{prompt!r}: no <|im_end|> within 96 tokens: {o.text!r}"
        assert len(o.text.split()) >= 3, f"{prompt!r}: {o.text!r}"
        assert _word_fraction(o.text) >= 0.8, f"{prompt!r}: {o.text!r}"
    first = outs[0].outputs[0].text
    assert "Pip" in first, first  # it knows its name


def test_sampled_chat_is_english(llm: LLM) -> None:
    # the checkpoint's generation_config defaults (temperature 0.7, top_p 0.9), as the server uses
    defaults = llm.get_default_sampling_params()
    assert defaults.temperature == pytest.approx(0.7) and defaults.top_p == pytest.approx(0.9)
    params = [
        SamplingParams(max_tokens=96, temperature=defaults.temperature, top_p=defaults.top_p, seed=s)
        for s in range(len(PROMPTS))
    ]
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    outs = llm.chat(conversations, params, use_tqdm=False)
    texts = [o.outputs[0].text for o in outs]
    assert sum(o.outputs[0].finish_reason == "stop" for o in outs) >= len(outs) - 1, texts
    for prompt, text in zip(PROMPTS, texts):
        assert _word_fraction(text) >= 0.8, f"{prompt!r}: {text!r}"


def test_multi_turn_and_system_prompt(llm: LLM) -> None:
    conv = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "How many legs does a dog have?"},
    ]
    o = llm.chat(conv, SamplingParams(max_tokens=48, temperature=0.0), use_tqdm=False)[0].outputs[0]
    assert o.finish_reason == "stop"
    assert _word_fraction(o.text) >= 0.8, o.text


@torch.no_grad()
def test_greedy_matches_transformers() -> None:
    """Parity anchor: our engine and HF transformers agree token for token on the shipped weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours = _demo_llm("float32")
    conv = [{"role": "user", "content": "Hello! What is your name?"}]
    max_tokens = 40
    o = ours.chat(conv, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                  use_tqdm=False)[0].outputs[0]

    tok = AutoTokenizer.from_pretrained(str(DEMO))
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    model = AutoModelForCausalLM.from_pretrained(str(DEMO), dtype=torch.float32, local_files_only=True).eval()
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                         min_new_tokens=max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert o.token_ids == ref[0, ids.shape[1]:].tolist()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert eos in o.token_ids  # the answer ends within the budget
