"""Triton / TensorRT-LLM's tensor-shaped /v2 inputs: the input and output tables GET
/v2/models/{model} reports, `stop_words_list` / `bad_words_list`, embedding biases, the p-tuning
table and LoRA tensors. Triton sends every input as a tensor, so a batch dimension of 1 is unwrapped."""

from __future__ import annotations

from typing import Any

import torch

from inflight.sampling_params import ParamError
from inflight.server import fields as F

U64 = 2**64 - 1


# what GET /v2/models/{model} reports: the input and output tensors this endpoint reads / returns,
# with the types and shapes of tensorrtllm_backend's configs (-1: any length)
TRITON_INPUTS = [
    (name, kind, shape)
    for names, kind, shape in (
        ("text_input bad_words stop_words embedding_bias_words", "BYTES", [-1]),
        ("input_ids draft_input_ids", "INT32", [-1]),
        ("input_lengths max_tokens request_output_len end_id pad_id top_k runtime_top_k min_length "
         "no_repeat_ngram_size beam_width prompt_vocab_size", "INT32", [1]),
        ("top_p runtime_top_p temperature length_penalty len_penalty repetition_penalty presence_penalty "
         "frequency_penalty", "FP32", [1]),
        ("early_stopping return_log_probs return_context_logits return_generation_logits stream streaming",
         "BOOL", [1]),
        ("random_seed lora_task_id", "UINT64", [1]),
        ("bad_words_list stop_words_list", "INT32", [2, -1]),
        ("embedding_bias embedding_bias_weights", "FP32", [-1]),
        ("prompt_embedding_table lora_weights", "FP16", [-1, -1]),
        ("draft_logits", "FP32", [-1, -1]),
        ("lora_config", "INT32", [-1, 3]),
    )
    for name in names.split()
]  # fmt: skip
TRITON_OUTPUTS = [
    ("text_output", "BYTES", [-1]), ("output_ids", "INT32", [-1, -1]), ("sequence_length", "INT32", [-1]),
    ("cum_log_probs", "FP32", [-1]), ("output_log_probs", "FP32", [-1, -1]), ("context_logits", "FP32", [-1, -1]),
    ("generation_logits", "FP32", [-1, -1, -1]),
]  # fmt: skip


def ints(v: Any) -> Any:
    """Integral floats in a (nested) list as ints: 274.0 is an integer to JSON Schema (fields.get_int)."""
    if isinstance(v, list):
        return [ints(t) for t in v]
    return int(v) if isinstance(v, float) and v.is_integer() else v


def trt_word_list(v: Any, name: str) -> list[list[int]]:
    """TensorRT-LLM's `stop_words_list` / `bad_words_list` layout: [1, 2, N] or [2, N], row 0 the
    concatenated token ids, row 1 the inclusive-scan end offsets padded with -1:
    [[[5, 7, 3, 9, 2], [3, 5, -1, -1, -1]]] is the words [5, 7, 3] and [9, 2]."""
    v = ints(v)
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], list) and len(v[0]) == 2:
        v = v[0]
    ok = (
        isinstance(v, list)
        and len(v) == 2
        and all(isinstance(r, list) for r in v)
        and len(v[0]) == len(v[1])
    )
    if not ok or not all(isinstance(t, int) and not isinstance(t, bool) for r in v for t in r):
        raise ParamError(
            f"{name}: must be [2, N] (or [1, 2, N]) integers: token ids, then end offsets padded with -1",
            name,
        )
    ids, offsets = v
    ends = [o for o in offsets if o != -1]
    if offsets[len(ends) :] != [-1] * (len(offsets) - len(ends)) or any(t < 0 for t in ids):
        raise ParamError(
            f"{name}: offsets must come first and be padded with -1; token ids must be >= 0", name
        )
    words, start = [], 0
    for end in ends:
        if not start < end <= len(ids):
            raise ParamError(
                f"{name}: offsets must increase and stay within the {len(ids)} token ids", name
            )
        words.append(ids[start:end])
        start = end
    return words


# ---------------------------------------------------------------- biases and tables
def float_rows(v: Any, name: str, dims: int) -> torch.Tensor:
    try:
        t = torch.tensor(v, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ParamError(f"{name}: must be a {dims}-d array of numbers", name) from e
    if t.dim() == dims + 1 and t.shape[0] == 1:
        t = t[0]  # Triton's batch dimension
    if t.dim() != dims or t.numel() == 0 or not bool(torch.isfinite(t).all()):
        raise ParamError(f"{name}: must be a {dims}-d array of finite numbers", name)
    return t


def embedding_bias(p: dict[str, Any], tokenizer: Any, vocab: int) -> list[float] | None:
    """`embedding_bias` ([vocab] or [1, vocab]) and/or `embedding_bias_words` + `embedding_bias_weights`
    (each word's tokens get its weight added, as Triton's preprocessing does)."""
    bias = None
    if p.get("embedding_bias") is not None:
        bias = float_rows(p["embedding_bias"], "embedding_bias", 1)
        if bias.shape[0] != vocab:
            raise ParamError(
                f"embedding_bias: needs {vocab} values, one per token id", "embedding_bias"
            )
    words, weights = p.get("embedding_bias_words"), p.get("embedding_bias_weights")
    if words is None and weights is None:
        return None if bias is None else bias.tolist()
    words = [words] if isinstance(words, str) else _unwrap_batch(words)
    weights = (
        [weights]
        if isinstance(weights, (int, float)) and not isinstance(weights, bool)
        else _unwrap_batch(weights)
    )
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ParamError(
            "embedding_bias_words: must be a string or an array of strings", "embedding_bias_words"
        )
    if not isinstance(weights, list) or not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights
    ):
        raise ParamError(
            "embedding_bias_weights: must be a number or an array of numbers",
            "embedding_bias_weights",
        )
    if len(words) != len(weights):
        raise ParamError(
            "embedding_bias_weights: needs one weight per embedding_bias_words entry",
            "embedding_bias_weights",
        )
    if tokenizer is None:
        raise ParamError(
            "embedding_bias_words: this model has no tokenizer", "embedding_bias_words"
        )
    bias = torch.zeros(vocab) if bias is None else bias
    for word, weight in zip(words, weights):
        for t in tokenizer.encode(word, add_special_tokens=False) if word else []:
            if t < vocab:
                bias[t] += float(weight)
    return bias.tolist()


def _unwrap_batch(v: Any) -> Any:
    return v[0] if isinstance(v, list) and len(v) == 1 and isinstance(v[0], list) else v


def ptuning(p: dict[str, Any], prompt: Any) -> None:
    """`prompt_embedding_table` ([rows, hidden] or [1, rows, hidden]) for ids >= vocab in input_ids."""
    if p.get("prompt_embedding_table") is None:
        if p.get("prompt_vocab_size") is not None:
            raise ParamError(
                "prompt_vocab_size: only with prompt_embedding_table", "prompt_vocab_size"
            )
        return
    if not isinstance(prompt, dict):
        raise ParamError(
            "prompt_embedding_table: its rows are addressed by token ids >= the vocabulary size; send input_ids",
            "prompt_embedding_table",
        )
    table = float_rows(p["prompt_embedding_table"], "prompt_embedding_table", 2)
    rows = F.get_int(p, "prompt_vocab_size", None, lo=1)
    if rows is not None and rows != table.shape[0]:
        raise ParamError(
            f"prompt_vocab_size: {rows} but the table has {table.shape[0]} rows",
            "prompt_vocab_size",
        )
    prompt["prompt_embedding_table"] = table


def lora_field(p: dict[str, Any], name: str) -> Any:
    if name == "lora_task_id":
        return F.get_int(p, name, None, lo=0, hi=U64)
    v = F.get_list(p, name)  # [rows, values] or [1, rows, values]; checked against the model later
    if v is not None and not v:
        raise ParamError(f"{name}: must not be empty", name)
    return v
