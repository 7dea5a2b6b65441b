"""`--speculative-config`: vLLM's JSON spelling, parsed and checked once at start-up.

Every failure is a ValueError naming the field (`speculative_config.num_speculative_tokens`),
so `inflight serve` stops with one line and `LLM(...)` raises before any weights load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

METHODS = ("ngram", "draft_model", "eagle", "eagle3")
RUNNER_METHODS = ("draft_model", "eagle", "eagle3")  # proposed by the runner after each step, from a checkpoint
_EAGLE_TARGETS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MAX_SPECULATIVE_TOKENS = 32  # K + 1 rows per request per step: more only adds rejected rows


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # K: drafts proposed per request per step
    # ngram (prompt lookup): the longest suffix of n tokens, prompt_lookup_max >= n >=
    # prompt_lookup_min, that occurred before proposes the K tokens that followed it
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    # no drafts in a step when more than this many requests are running or waiting: a large
    # batch is compute-bound, so the K extra rows per request cost more than they save (vLLM's
    # name; benchmarks/spec_decode.py measures the batch-32 case)
    disable_by_batch_size: int = 4
    # per request: after a step that kept every draft, one more (up to num_speculative_tokens);
    # after one that rejected a draft, the number kept + 1. Rejected rows cost a full row of the
    # target's forward (and a draft-model / head step each): shrinking saves them where the
    # proposer disagrees. Off by default, as vLLM's K is fixed
    adaptive_k: bool = False
    # draft_model: a smaller checkpoint of the same vocabulary; eagle / eagle3: an EAGLE head.
    # `draft` is its ModelConfig, made by `resolve` once the target's is known (same dtype, device)
    model: str | None = None
    draft: Any = None
    aux_layers: tuple[int, ...] = ()  # eagle3: the target layers whose inputs the head reads
    target_path: str = ""  # eagle / eagle3 under tensor parallelism: the head reads the target's tables whole

    @classmethod
    def parse(cls, value: dict[str, Any] | str | None) -> SpeculativeConfig | None:
        """The option as given (a JSON object or its text; None / "" / {}: off)."""
        if value is None or value == "":
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config: not valid JSON ({e})") from e
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config: must be a JSON object, got {value!r}")
        if not value:
            return None
        names = {f.name for f in fields(cls)} - {"draft", "aux_layers", "target_path"}
        for key in value:
            if key not in names:
                raise ValueError(f"speculative_config.{key}: unknown field; fields: {', '.join(sorted(names))}")
        method = value.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config.method: {method!r}; use {' | '.join(METHODS)}")
        if method in RUNNER_METHODS:
            _check_draft_fields(value)
        elif value.get("model") is not None:
            raise ValueError(f"speculative_config.model: only with method {' | '.join(RUNNER_METHODS)}")
        if not isinstance(value.get("adaptive_k", False), bool):
            raise ValueError(f"speculative_config.adaptive_k: must be true or false, got {value['adaptive_k']!r}")
        for key in names - {"method", "model", "adaptive_k"}:
            v = value.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise ValueError(f"speculative_config.{key}: must be an integer, got {v!r}")
        k = value.get("num_speculative_tokens")
        if k is None:
            raise ValueError("speculative_config.num_speculative_tokens: required")
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens: must be in [1, {MAX_SPECULATIVE_TOKENS}], got {k}")
        extra = {"model": value["model"]} if method in RUNNER_METHODS else _lookup_window(value)
        adaptive = {"adaptive_k": value["adaptive_k"]} if "adaptive_k" in value else {}
        return cls(method=method, num_speculative_tokens=k, **extra, **_batch_limit(value), **adaptive)

    def check_draft(self, target: Any, max_model_len: int, tensor_parallel_size: int = 1) -> None:
        """A draft model shares the target's vocabulary and tokenizer and takes its length; an
        EAGLE head fits the target (`target`: the target's `Checkpoint`); read from config.json
        alone, before torch."""
        if self.method in ("eagle", "eagle3"):
            self.eagle_head(target, tensor_parallel_size)
            return
        if self.method != "draft_model":
            return
        from inflight.checkpoint import Checkpoint

        try:
            draft = Checkpoint.read(self.model)  # type: ignore[arg-type]
            draft.check()  # loaded by the same loader: the same refusals (its config's fields, architecture ...)
            draft.max_model_len(max_model_len)
        except (OSError, ValueError) as e:
            raise ValueError(f"speculative_config.model: {e}") from e
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"speculative_config.model: vocabulary of {draft.vocab_size} tokens, the target's has {target.vocab_size}")
        if not _same_tokens(_tokens(draft.path), _tokens(target.path)):
            raise ValueError("speculative_config.model: its tokenizer differs from the target's (tokenizer.json vocab / added tokens)")

    def eagle_head(self, target: Any, tp: int) -> tuple[dict[str, Any], tuple[int, ...]]:
        """The head's config checked against the target (hidden size, vocabulary, one layer, the
        aux layers) and the aux layers; the weights are checked when the runner loads them."""
        from inflight.spec_decode.eagle_config import aux_layers, head_config

        if target.architecture not in _EAGLE_TARGETS:
            raise ValueError(f"speculative_config.method: {self.method} needs a Llama-family target, not {target.architecture}")
        if tp > 1 and getattr(target, "quantized", None):  # the head reads the embedding / lm_head tables whole
            raise ValueError(f"speculative_config.method: {self.method} with tensor_parallel_size {tp} needs a safetensors target")
        hf = head_config(str(self.model), target.hf_config, self.method == "eagle3")
        layers = int(target.hf_config["num_hidden_layers"])
        return hf, aux_layers(hf, layers) if self.method == "eagle3" else ()


def _check_draft_fields(value: dict[str, Any]) -> None:
    if not isinstance(value.get("model"), str) or not value["model"]:
        raise ValueError(f"speculative_config.model: required with method {value['method']} (a checkpoint directory)")
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if value.get(key) is not None:
            raise ValueError(f"speculative_config.{key}: only with method ngram")


def _tokens(path: Any) -> dict[int, str] | None:
    """A checkpoint's tokens by id: tokenizer.json's vocab + added tokens, or a GGUF's
    tokenizer.ggml.tokens (its tokenizer lives in the file: a Q4_K_M target with a safetensors
    draft of the same tokenizer is the common pairing); None without a tokenizer."""
    p = Path(path)
    if p.suffix == ".gguf":
        from inflight.quant.gguf import GGUFCheckpoint, shard_paths

        meta = GGUFCheckpoint(shard_paths(p)[0])
        if meta.get("tokenizer.ggml.model", "no_vocab") == "no_vocab":
            return None
        return dict(enumerate(meta.get("tokenizer.ggml.tokens", [])))
    file = p / "tokenizer.json"
    if not file.is_file():
        return None
    data = json.loads(file.read_text())
    ids = {i: t for t, i in (data.get("model", {}).get("vocab") or {}).items()}
    return ids | {t["id"]: t["content"] for t in data.get("added_tokens", [])}


def _same_tokens(a: dict[int, str] | None, b: dict[int, str] | None) -> bool:
    """The same text at every id; ids only one side has are llama.cpp's padding to vocab_size
    (`[PAD<id>]`, its convert script). Without a tokenizer on one side there is nothing to compare
    (token-id prompts; the vocabulary sizes are checked)."""
    if a is None or b is None:
        return True
    extra = a.keys() ^ b.keys()
    return all(a[i] == b[i] for i in a.keys() & b.keys()) and all((a.get(i) or b[i]).startswith("[PAD") for i in extra)


def _lookup_window(value: dict[str, Any]) -> dict[str, int]:
    """As vLLM: one bound given sets the other; none given: [1, 4] (short n-grams find more
    matches, and the longest one found wins)."""
    lo, hi = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if lo is None and hi is None:
        lo, hi = 1, 4
    lo = hi if lo is None else lo
    hi = lo if hi is None else hi
    if lo < 1:
        raise ValueError(f"speculative_config.prompt_lookup_min: must be at least 1, got {lo}")
    if hi < lo:
        raise ValueError(f"speculative_config.prompt_lookup_max: must be >= prompt_lookup_min ({lo}), got {hi}")
    return {"prompt_lookup_min": lo, "prompt_lookup_max": hi}


def _batch_limit(value: dict[str, Any]) -> dict[str, int]:
    n = value.get("disable_by_batch_size")
    if n is None:
        return {}
    if n < 1:
        raise ValueError(f"speculative_config.disable_by_batch_size: must be at least 1, got {n}")
    return {"disable_by_batch_size": n}
