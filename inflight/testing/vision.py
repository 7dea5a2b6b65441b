"""Tiny Qwen2-VL / Qwen2.5-VL checkpoints and their tokenizer (vision special tokens, template)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from inflight.testing.checkpoints import randomize_
from inflight.testing.tokenizer import ENDOFTEXT, IM_END, chatml_fast_tokenizer, tiny_tokenizer_json

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
    tok = Tokenizer.from_str(tiny_tokenizer_json())
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
    randomize_(model, seed)
    model = model.to(dtype).eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    GenerationConfig(bos_token_id=ids[ENDOFTEXT], eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT]).save_pretrained(
        str(out_dir)
    )
    _write_preprocessors(out_dir, preprocessor or {})
    if nested_names:
        _nest_names(out_dir / "model.safetensors")
    return out_dir


def _write_preprocessors(out_dir: Path, overrides: dict[str, Any]) -> None:
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps({**VL_PREPROCESSOR, **overrides, "image_processor_type": "Qwen2VLImageProcessor"}, indent=2) + "\n"
    )
    video = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 20, **overrides}  # frames as small
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")


def _nest_names(path: Path) -> None:
    """Tensor names as transformers 4.52+ modules name them: `model.language_model.*`, `model.visual.*`."""
    from safetensors.torch import load_file

    renamed = {}
    for name, t in load_file(str(path)).items():
        if name.startswith("visual."):
            name = "model." + name
        elif name.startswith("model."):
            name = "model.language_model." + name[len("model.") :]
        renamed[name] = t
    save_file(renamed, str(path), metadata={"format": "pt"})
