"""Offline test and benchmark checkpoints: a tiny byte-level BPE tokenizer and random-weight models.

Nothing here touches the network. Everything is deterministic: the tokenizer is trained
in-process on a generated corpus, and weights come from seeded generators.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = [
    "ARCHS",
    "CHAT_TEMPLATE",
    "QWEN25_05B_CONFIG",
    "SPECIAL_TOKENS",
    "TINY_VOCAB_SIZE",
    "VL_ARCHS",
    "build_tiny_tokenizer",
    "make_lora_adapter",
    "make_peft_lora",
    "make_random_checkpoint",
    "make_tiny_checkpoint",
    "make_tiny_vl_checkpoint",
    "read_config",
]

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
TINY_VOCAB_SIZE = 1000

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# ------------------------------------------------------------------------------------ tokenizer
_SUBJECTS = (
    "the cat|a dog|my friend|the old man|a young girl|the teacher|our team|the robot|a small bird|"
    "the engineer|her brother|the city|a farmer|the doctor|his sister|the captain|a stranger|"
    "the children|my neighbor|the artist|a student|the pilot|the king|a merchant"
).split("|")
_VERBS = (
    "sees likes builds finds reads writes opens carries paints watches follows cleans moves takes "
    "brings sells helps drives remembers forgets loves hates chooses answers borrows catches draws "
    "explains fixes gathers hides imagines joins keeps lifts measures notices orders plants "
    "questions repairs shares teaches visits wants"
).split()
_ADJECTIVES = (
    "red big quiet happy bright heavy green strange simple fast warm cold little ancient golden "
    "wooden blue soft yellow purple silent noisy gentle brave clever dusty empty famous fragile "
    "hidden hollow lucky modern narrow perfect rapid rough shiny sleepy tiny wild"
).split()
_NOUNS = (
    "house book river garden window letter apple mountain road song table picture machine bridge "
    "story forest ship flower computer market island castle candle blanket bottle button camera "
    "carpet ceiling chimney compass desert engine feather fountain guitar hammer harbor helmet "
    "kettle ladder lantern meadow mirror needle ocean orchard pencil pillow planet puzzle rabbit "
    "saddle shadow spoon statue tunnel umbrella valley village wagon whistle"
).split()
_ENDINGS = (
    "today|every morning|at night|in the park|with care|again|near the sea|before dinner|"
    "after school|quickly|in winter|on Sunday|without a word|for the first time"
).split("|")
_CHINESE = "你好世界，今天天气很好。我们一起去公园散步吧。这是一个简单的测试。人工智能正在改变世界！明天会下雨吗？"
_EMOJI = "😀🚀🎉👍"
# Seen once only, so BPE never merges their bytes: they stay split across several tokens.
_RARE = "龍鳳麒麟饕餮魑魅魍魉🦄🧩🪐🫠🦖🧬"


def _corpus() -> list[str]:
    rng = random.Random(1234)
    lines = []
    for i in range(600):
        line = (
            f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} "
            f"{rng.choice(['a', 'the', 'one', 'every', 'that'])} {rng.choice(_ADJECTIVES)} "
            f"{rng.choice(_NOUNS)} {rng.choice(_ENDINGS)}{rng.choice('.!?.')}"
        )
        if i % 8 == 0:
            line += f" {rng.randint(0, 9999)} {rng.choice(_EMOJI)}"
        lines.append(line)
    for _ in range(80):
        start = rng.randrange(len(_CHINESE) - 8)
        lines.append(_CHINESE[start : start + rng.randint(4, 12)] + rng.choice(["", *_EMOJI]))
    lines.append(_RARE)
    return lines


_tokenizer_json: str | None = None


def train_bytelevel_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 / Qwen style) with our special tokens; deterministic for a given corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def chatml_fast_tokenizer(tok: Tokenizer, model_max_length: int) -> Any:
    """The transformers fast tokenizer around `tok`: ChatML template, eos <|im_end|>, pad <|endoftext|>."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def _tiny_tokenizer_json() -> str:
    """Train once per process; training is deterministic, so the cache is only a speed-up."""
    global _tokenizer_json
    if _tokenizer_json is None:
        _tokenizer_json = train_bytelevel_bpe(_corpus(), TINY_VOCAB_SIZE).to_str()
    return _tokenizer_json


def _tiny_tokenizer() -> Any:
    return chatml_fast_tokenizer(Tokenizer.from_str(_tiny_tokenizer_json()), model_max_length=512)


def build_tiny_tokenizer(out_dir: str | Path) -> Path:
    """Write a 1000-token byte-level BPE tokenizer (GPT-2/Qwen style, ChatML) to out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _tiny_tokenizer().save_pretrained(str(out_dir))
    # transformers 5 writes the template only to chat_template.jinja, names its own backend class
    # and drops special_tokens_map.json; add the layout of hub checkpoints and transformers 4 too.
    config_path = out_dir / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config.pop("extra_special_tokens", None)
    tok_config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
    )
    config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    special_map = {
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "additional_special_tokens": [IM_START],
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return out_dir


# ----------------------------------------------------------------------------- tiny checkpoints
ARCHS: tuple[str, ...] = ("llama", "llama3", "mistral", "qwen2", "qwen3")

_COMMON: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
_PER_ARCH: dict[str, dict[str, Any]] = {
    "llama": dict(tie_word_embeddings=False),
    "llama3": dict(
        tie_word_embeddings=False,
        rope_theta=500000.0,
        # original context 64 at head_dim 16: frequencies fall in all three llama3 bands.
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "mistral": dict(tie_word_embeddings=False, sliding_window=16),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(tie_word_embeddings=True, head_dim=32),
}
_INIT_STD = 0.1  # large enough that logits and attention scores are far from uniform


def _config_class(arch: str) -> type:
    import transformers

    names = {
        "llama": "LlamaConfig",
        "llama3": "LlamaConfig",
        "mistral": "MistralConfig",
        "qwen2": "Qwen2Config",
        "qwen3": "Qwen3Config",
    }
    if arch not in names:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    return getattr(transformers, names[arch])


@torch.no_grad()
def _randomize_(model: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter: norms near (not at) 1, so per-channel scaling bugs show up."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            value = 0.02 * noise
        else:
            value = _INIT_STD * noise
        param.copy_(value)


def make_tiny_checkpoint(
    arch: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    with_tokenizer: bool = True,
    max_shard_size: str | None = None,
    **config_overrides: Any,
) -> Path:
    """Save a 2-layer random-weight HF checkpoint of `arch` (see ARCHS) to out_dir."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    config_cls = _config_class(arch)
    # Deep copies: transformers fills rope dicts in place (rope_theta), leaking between calls.
    kwargs: dict[str, Any] = copy.deepcopy({**_COMMON, **_PER_ARCH[arch]})
    if with_tokenizer:
        tokenizer = _tiny_tokenizer()
        ids = tokenizer.convert_tokens_to_ids
        kwargs.update(
            vocab_size=len(tokenizer),
            bos_token_id=ids(ENDOFTEXT),  # as Qwen does: the tokenizer itself never adds a BOS
            eos_token_id=ids(IM_END),
            pad_token_id=ids(ENDOFTEXT),
        )
    else:
        kwargs.update(vocab_size=1024, bos_token_id=0, eos_token_id=2, pad_token_id=0)
    kwargs.update(copy.deepcopy(config_overrides))
    config = config_cls(**kwargs)

    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_(model, seed)  # tied lm_head shares the embedding Parameter, so it follows
    model = model.to(dtype).eval()
    model.config.dtype = dtype

    save_kwargs: dict[str, Any] = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(out_dir), safe_serialization=True, **save_kwargs)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(out_dir))
    if with_tokenizer:
        build_tiny_tokenizer(out_dir)
    return out_dir


# ------------------------------------------------------------------------ benchmark checkpoints
QWEN25_05B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _weight_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes for a full (defaults filled in) config dict."""
    model_type = cfg["model_type"]
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias is not supported")
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    qkv_bias = model_type == "qwen2" or bool(cfg.get("attention_bias"))

    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out_dims = {"q": heads * head_dim, "k": kv_heads * head_dim, "v": kv_heads * head_dim}
        for n, dim in out_dims.items():
            shapes[f"{p}self_attn.{n}_proj.weight"] = (dim, hidden)
            if qkv_bias:
                shapes[f"{p}self_attn.{n}_proj.bias"] = (dim,)
        shapes[f"{p}self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        if cfg.get("attention_bias"):
            shapes[f"{p}self_attn.o_proj.bias"] = (hidden,)
        if model_type == "qwen3":
            shapes[f"{p}self_attn.q_norm.weight"] = (head_dim,)
            shapes[f"{p}self_attn.k_norm.weight"] = (head_dim,)
        shapes[f"{p}mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{p}mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{p}mlp.down_proj.weight"] = (hidden, inter)
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def make_random_checkpoint(
    out_dir: str | Path,
    *,
    config: dict[str, Any],
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> Path:
    """Write random weights for an HF config dict without building a transformers model.

    Produces config.json, generation_config.json and a single model.safetensors; no tokenizer.
    """
    from transformers import AutoConfig, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = copy.deepcopy(config)
    if raw.get("model_type") not in _ARCHITECTURES:
        raise ValueError(
            f"model_type must be one of {tuple(_ARCHITECTURES)}, got {raw.get('model_type')!r}"
        )
    raw.setdefault("architectures", [_ARCHITECTURES[raw["model_type"]]])
    # The real config class fills defaults exactly as transformers will when loading (Qwen3's
    # head_dim=128, Qwen2's num_key_value_heads=32, ...), and config.json comes out in its format.
    hf_config = AutoConfig.for_model(**raw)
    hf_config.dtype = dtype
    cfg = hf_config.to_dict()

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in _weight_shapes(cfg).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            noise.mul_(0.1).add_(1.0)
        else:
            noise.mul_(0.02)
        tensors[name] = noise.to(dtype)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors

    hf_config.save_pretrained(str(out_dir))
    gen_ids = {k: cfg.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    GenerationConfig(**{k: v for k, v in gen_ids.items() if v is not None}).save_pretrained(
        str(out_dir)
    )
    return out_dir


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """The raw config.json of a checkpoint, as an engine would see it."""
    return json.loads((Path(model_dir) / "config.json").read_text())


def make_lora_adapter(
    out_dir: str | Path,
    config: dict[str, Any],
    *,
    rank: int = 16,
    alpha: float = 32.0,
    targets: Iterable[str] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    seed: int = 0,
    std: float = 0.02,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write a random PEFT LoRA directory (adapter_config.json + adapter_model.safetensors) for a
    Llama-family config without building the model (benchmarks; tests make theirs with peft)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    q, kv = heads * head_dim, int(config.get("num_key_value_heads") or heads) * head_dim
    sizes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
             "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module in targets:
            n_in, n_out = sizes[module]
            part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, n_in, generator=gen) * std).to(dtype)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(n_out, rank, generator=gen) * std).to(dtype)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets), "bias": "none",
           "use_rslora": False, "task_type": "CAUSAL_LM", "lora_dropout": 0.0}  # fmt: skip
    (out_dir / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return out_dir


def make_peft_lora(base: str | Path, out_dir: str | Path, *, seed: int = 0, std: float = 0.08, **lora_config: Any) -> Path:
    """A random LoRA adapter made and saved by `peft` itself (tests' reference), on the
    checkpoint in `base`: `lora_config` are `peft.LoraConfig` fields (r, lora_alpha,
    target_modules, use_rslora, alpha_pattern, ...); A and B are N(0, std) so the adapter
    visibly changes the outputs."""
    import peft
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    lora = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **lora_config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    lora.save_pretrained(str(out_dir))
    return Path(out_dir)


# ------------------------------------------------------------------ vision-language checkpoints
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# Qwen2-VL's chat template (tokenizer_config.json of Qwen/Qwen2-VL-2B-Instruct), without its
# default system prompt: image parts -> <|vision_start|><|image_pad|><|vision_end|>, video alike.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VL_ARCHS = ("qwen2_vl", "qwen2_5_vl")
# The real configs' layout and ratios (Qwen2-VL-2B-Instruct, Qwen2.5-VL-3B-Instruct), shrunk:
# patch 14, merge 2, temporal patch 2 as shipped; M-RoPE sections 2/3/3 of head_dim 16.
_VL_TEXT: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0,
    rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=False,
)  # fmt: skip
_VL_VISION: dict[str, dict[str, Any]] = {
    "qwen2_vl": dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, in_chans=3,
                     patch_size=14, spatial_merge_size=2, temporal_patch_size=2, hidden_act="quick_gelu"),
    "qwen2_5_vl": dict(depth=3, hidden_size=32, out_hidden_size=64, intermediate_size=48, num_heads=2,
                       in_chans=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                       hidden_act="silu", window_size=56, fullatt_block_indexes=[1], tokens_per_second=2),
}  # fmt: skip
# a small pixel budget, so test images are both resized up and down
VL_PREPROCESSOR = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 20, "patch_size": 14, "temporal_patch_size": 2,
                   "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711]}  # fmt: skip


def build_vl_tokenizer(out_dir: str | Path) -> Path:
    """The tiny tokenizer plus Qwen2-VL's vision special tokens and chat template."""
    out_dir = Path(out_dir)
    tok = Tokenizer.from_str(_tiny_tokenizer_json())
    tok.add_special_tokens(list(VISION_TOKENS))
    fast = chatml_fast_tokenizer(tok, model_max_length=1024)
    fast.chat_template = VL_CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config.pop("extra_special_tokens", None)
    tok_config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=VL_CHAT_TEMPLATE)
    config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    return out_dir


def make_tiny_vl_checkpoint(
    arch: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    nested_names: bool = False,
    dtype: torch.dtype = torch.float32,
    text: dict[str, Any] | None = None,
    vision: dict[str, Any] | None = None,
    preprocessor: dict[str, Any] | None = None,
) -> Path:
    """A random-weight Qwen2-VL / Qwen2.5-VL checkpoint (see VL_ARCHS) saved by transformers, with
    its tokenizer (vision tokens, chat template) and preprocessor_config.json. Tensor names as on
    the hub (`model.layers.*`, `visual.*`), or with `nested_names` as transformers 4.52+ modules
    name them (`model.language_model.*`, `model.visual.*`). `text` / `vision` / `preprocessor`:
    overrides of the configs (benchmark shapes, the real pixel budget)."""
    import transformers
    from safetensors.torch import load_file
    from transformers import GenerationConfig

    if arch not in VL_ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {VL_ARCHS}")
    out_dir = Path(out_dir)
    build_vl_tokenizer(out_dir)
    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in (ENDOFTEXT, IM_END, *VISION_TOKENS)}
    cls = transformers.Qwen2VLConfig if arch == "qwen2_vl" else transformers.Qwen2_5_VLConfig
    config = cls(
        **copy.deepcopy({**_VL_TEXT, **(text or {})}),
        vision_config=copy.deepcopy({**_VL_VISION[arch], **(vision or {})}),
        vocab_size=tok.get_vocab_size(),
        bos_token_id=ids[ENDOFTEXT], eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
    )  # fmt: skip
    model_cls = (
        transformers.Qwen2VLForConditionalGeneration if arch == "qwen2_vl" else transformers.Qwen2_5_VLForConditionalGeneration
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    _randomize_(model, seed)
    model = model.to(dtype).eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    GenerationConfig(bos_token_id=ids[ENDOFTEXT], eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT]).save_pretrained(
        str(out_dir)
    )
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps({**VL_PREPROCESSOR, **(preprocessor or {}), "image_processor_type": "Qwen2VLImageProcessor"}, indent=2)
        + "\n"
    )
    video = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 20, **(preprocessor or {})}  # frames as small
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    if nested_names:
        path = out_dir / "model.safetensors"
        renamed = {}
        for name, t in load_file(str(path)).items():
            if name.startswith("visual."):
                name = "model." + name
            elif name.startswith("model."):
                name = "model.language_model." + name[len("model.") :]
            renamed[name] = t
        save_file(renamed, str(path), metadata={"format": "pt"})
    return out_dir
