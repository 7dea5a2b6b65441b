"""The offline fixtures themselves: they must be what the engine's tests assume they are."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from inflight.testing import (
    ARCHS,
    QWEN25_05B_CONFIG,
    build_tiny_tokenizer,
    make_random_checkpoint,
    make_tiny_checkpoint,
    read_config,
)
from inflight.testing.checkpoints import _weight_shapes

TEXTS = [
    "The brave rabbit repairs a hollow lantern near the sea.",
    "你好世界，今天天气很好。龍鳳麒麟",
    "Launch 🚀 party 🎉 with a unicorn 🦄 and a puzzle 🧩!",
]
PROMPT = "The old man finds a golden compass, 你好世界 🚀, and the children visit the harbor again."


def _load(path: Path) -> torch.nn.Module:
    model, info = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def _prompt_ids(model_dir: Path) -> torch.Tensor:
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert ids.shape[1] > 16  # long enough to cross Mistral's window
    return ids


# ------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_loads_offline_and_round_trips(tiny_tokenizer_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True)
    assert len(tok) == 1000
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 0)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    assert tok.encode("<|im_start|>user", add_special_tokens=False)[0] == 1


def test_multibyte_characters_split_across_tokens(tiny_tokenizer_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True)

    def n_tokens(ch: str) -> int:
        return len(tok.encode(ch, add_special_tokens=False))

    chinese, emoji = "你好世界今天天气龍鳳", "😀🚀🎉🦄🧩🪐"
    assert any(n_tokens(c) > 1 for c in chinese)
    assert any(n_tokens(c) > 1 for c in emoji)
    # Both kinds exist, so detokenization sees merged and split characters side by side.
    assert any(n_tokens(c) == 1 for c in chinese)
    assert any(n_tokens(c) == 1 for c in emoji)
    # A partial character decodes to U+FFFD alone: what incremental detokenizers must hold back.
    ids = tok.encode("龍🦄", add_special_tokens=False)
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_chat_template_is_chatml(tiny_tokenizer_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好 🚀"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n你好 🚀<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt.endswith("<|im_end|>\n")
    files = {p.name for p in tiny_tokenizer_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= files
    assert json.loads((tiny_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]


def test_tokenizer_is_deterministic(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    import inflight.testing.tokenizer as testing

    saved = testing._tokenizer_json
    testing._tokenizer_json = None  # force a retrain
    try:
        again = build_tiny_tokenizer(tmp_path)
    finally:
        testing._tokenizer_json = saved
    first = (tiny_tokenizer_dir / "tokenizer.json").read_text()
    assert (again / "tokenizer.json").read_text() == first


# ----------------------------------------------------------------------------- tiny checkpoints
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_checkpoint_loads_with_separated_logits(
    arch: str, tiny_model_dir: Callable[..., Path]
) -> None:
    path = tiny_model_dir(arch)
    model = _load(path)
    config = read_config(path)
    assert (config["vocab_size"], config["eos_token_id"], config["pad_token_id"]) == (1000, 2, 0)
    assert config["num_key_value_heads"] == 2 and config["num_attention_heads"] == 4
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == 2

    norm = model.model.layers[0].input_layernorm.weight
    assert norm.std() > 0.05  # not the all-ones default

    ids = _prompt_ids(path)
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 1000)
    assert torch.isfinite(logits).all()
    top2 = logits[0].topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    assert gaps.median() > 1e-3 and (gaps > 1e-5).float().mean() > 0.9

    tied = arch in ("qwen2", "qwen3")
    assert config["tie_word_embeddings"] is tied
    shares = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert shares is tied


def test_arch_specific_config(tiny_model_dir: Callable[..., Path]) -> None:
    rope = read_config(tiny_model_dir("llama3"))["rope_parameters"]
    assert rope == {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    assert read_config(tiny_model_dir("mistral"))["sliding_window"] == 16
    qwen3 = read_config(tiny_model_dir("qwen3"))
    assert qwen3["head_dim"] == 32
    qwen3_model = _load(tiny_model_dir("qwen3"))
    attn = qwen3_model.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (4 * 32, 64) and attn.q_norm.weight.shape == (32,)
    assert _load(tiny_model_dir("qwen2")).model.layers[0].self_attn.q_proj.bias is not None


def test_llama3_scaling_changes_some_frequencies(tiny_model_dir: Callable[..., Path]) -> None:
    path = tiny_model_dir("llama3")
    scaled = _load(path).model.rotary_emb.inv_freq
    plain = 1.0 / (500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    changed = ~torch.isclose(scaled, plain)
    assert changed.any() and not changed.all()  # high frequencies kept, low ones scaled


def test_mistral_sliding_window_is_exercised(tiny_model_dir: Callable[..., Path]) -> None:
    path = tiny_model_dir("mistral")
    model, ids = _load(path), _prompt_ids(path)
    with torch.no_grad():
        windowed = model(ids).logits[0]
        model.config.sliding_window = None
        full = model(ids).logits[0]
    torch.testing.assert_close(windowed[:16], full[:16])
    assert not torch.allclose(windowed[16:], full[16:])


def test_sharded_bf16_checkpoint(tiny_model_dir: Callable[..., Path]) -> None:
    sharded = tiny_model_dir("llama", dtype=torch.bfloat16, max_shard_size="100KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((sharded / s).exists() for s in shards)
    assert read_config(sharded)["dtype"] == "bfloat16"
    with safe_open(str(sharded / sorted(shards)[0]), framework="pt") as f:
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())  # noqa: SIM118 (safe_open is not a dict)
    # Same seed, same weights: dtype and sharding only change the storage.
    a = dict(_load(sharded).named_parameters())
    b = dict(_load(tiny_model_dir("llama")).named_parameters())
    assert a.keys() == b.keys()
    for name, value in a.items():
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, b[name].to(torch.bfloat16)), name


def test_without_tokenizer(tmp_path: Path) -> None:
    path = make_tiny_checkpoint("qwen2", tmp_path, with_tokenizer=False, num_hidden_layers=1)
    assert not (path / "tokenizer.json").exists()
    config = read_config(path)
    assert (config["vocab_size"], config["num_hidden_layers"]) == (1024, 1)


# ------------------------------------------------------------------------ random checkpoints
@pytest.mark.parametrize(
    "model_type, extra",
    [("qwen2", {"tie_word_embeddings": True}), ("llama", {}), ("qwen3", {"head_dim": 32})],
)
def test_random_checkpoint_loads_in_transformers(
    tmp_path: Path, model_type: str, extra: dict
) -> None:
    config = dict(
        model_type=model_type,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        eos_token_id=2,
        **extra,
    )
    path = make_random_checkpoint(tmp_path, config=config, dtype=torch.bfloat16)
    assert {p.name for p in path.iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
    }
    config_json = read_config(path)
    assert config_json["dtype"] == "bfloat16"
    assert config_json["architectures"] == [f"{model_type.capitalize()}ForCausalLM"]
    model = _load(path)
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(torch.arange(10)[None]).logits
    assert logits.shape == (1, 10, 300) and torch.isfinite(logits).all()


_SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)


@pytest.mark.parametrize(
    "config",
    [
        QWEN25_05B_CONFIG,
        # Defaults come from the config class: Qwen3 head_dim=128, Qwen2 num_key_value_heads=32.
        dict(model_type="qwen3", vocab_size=300, **_SMALL),
        dict(model_type="qwen2", vocab_size=300, **_SMALL),
        dict(model_type="llama", vocab_size=300, attention_bias=True, **_SMALL),
        dict(model_type="mistral", vocab_size=300, num_key_value_heads=1, **_SMALL),
    ],
    ids=["qwen2.5-0.5b", "qwen3-defaults", "qwen2-defaults", "llama-bias", "mistral"],
)
def test_random_checkpoint_shapes_match_transformers(config: dict) -> None:
    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    # named_parameters() lists a tied lm_head once, under the embedding's name.
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert _weight_shapes(hf_config.to_dict()) == expected
    if config is QWEN25_05B_CONFIG:
        assert sum(p.numel() for p in model.parameters()) == 494_032_768
