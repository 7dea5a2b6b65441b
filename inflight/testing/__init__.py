"""Offline test and benchmark checkpoints: a tiny byte-level BPE tokenizer and random-weight models.

Nothing here touches the network. Everything is deterministic: the tokenizer is trained
in-process on a generated corpus, and weights come from seeded generators.

    tokenizer.py     the tiny ChatML tokenizer (build_tiny_tokenizer)
    checkpoints.py   tiny checkpoints of every arch, full-size random ones for benchmarks
    lora.py          PEFT LoRA adapter directories
    vision.py        tiny Qwen2-VL / Qwen2.5-VL checkpoints
"""

from inflight.testing.checkpoints import (
    ARCHS,
    QWEN25_05B_CONFIG,
    make_random_checkpoint,
    make_tiny_checkpoint,
    read_config,
)
from inflight.testing.lora import make_lora_adapter, make_peft_lora
from inflight.testing.tokenizer import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TINY_VOCAB_SIZE,
    build_tiny_tokenizer,
    chatml_fast_tokenizer,
    train_bytelevel_bpe,
)
from inflight.testing.vision import (
    VISION_TOKENS,
    VL_ARCHS,
    VL_CHAT_TEMPLATE,
    VL_PREPROCESSOR,
    build_vl_tokenizer,
    make_tiny_vl_checkpoint,
)

__all__ = [
    "ARCHS",
    "CHAT_TEMPLATE",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "QWEN25_05B_CONFIG",
    "SPECIAL_TOKENS",
    "TINY_VOCAB_SIZE",
    "VISION_TOKENS",
    "VL_ARCHS",
    "VL_CHAT_TEMPLATE",
    "VL_PREPROCESSOR",
    "build_tiny_tokenizer",
    "build_vl_tokenizer",
    "chatml_fast_tokenizer",
    "make_lora_adapter",
    "make_peft_lora",
    "make_random_checkpoint",
    "make_tiny_checkpoint",
    "make_tiny_vl_checkpoint",
    "read_config",
    "train_bytelevel_bpe",
]
