"""Benchmark prompts: synthetic random prompts of exact token lengths, or a JSONL file.

Synthetic prompts are text, so every backend (completions, chat, /v2 generate, offline)
sends the same thing. A prompt of N tokens is built by sampling N random non-special token
ids, decoding them, and re-encoding the text: BPE merges across token boundaries change the
count, so the ids of the re-encoding are cut or topped up with fresh random ids and the
round trip repeats until decode -> encode is stable at exactly N tokens (a few rounds; a new
draw if it does not settle). N counts the special tokens the tokenizer adds (a Llama BOS),
so the server's prompt_tokens equals --input-len for /v1/completions and /v2 generate.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

_ROUNDS = 8  # decode/encode round trips per draw; 1-3 are usually enough
_DRAWS = 20  # fresh draws before settling for an inexact length


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens as the server counts them, special tokens included; 0 = unknown
    output_len: int  # max_tokens asked for (exact with ignore_eos)


def load_tokenizer(path: str) -> Any | None:
    """The tokenizer at `path` (a directory or a hub name), or None (the reason is logged)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        logger.warning("no tokenizer loads from %r: %s", path, e)
        return None
    tokenizer.model_max_length = 1 << 62  # no "sequence longer than" warnings: we only count
    return tokenizer


def sample_lengths(rng: np.random.Generator, mean: int, range_ratio: float, num: int) -> list[int]:
    """Uniform integers in [mean * (1 - r), mean * (1 + r)], at least 1."""
    lo = max(1, int(mean * (1 - range_ratio)))
    hi = max(lo, int(mean * (1 + range_ratio)))
    return [int(n) for n in rng.integers(lo, hi + 1, size=num)]


class PromptMaker:
    """Random text prompts that encode to an exact number of tokens."""

    def __init__(self, tokenizer: Any, rng: np.random.Generator) -> None:
        self.tok = tokenizer
        self.rng = rng
        special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
        self.ids = np.array([i for i in range(len(tokenizer)) if i not in special])
        self.num_special = len(self._encode("a", True)) - len(self._encode("a", False))

    def make(self, num_tokens: int) -> tuple[str, int]:
        """(text, its token count with special tokens); the count is num_tokens when possible."""
        target = max(1, num_tokens - self.num_special)
        text = ""
        for _ in range(_DRAWS):
            text, ok = self._fit(target)
            if ok:
                break
        else:
            logger.warning(
                "no prompt of exactly %d tokens found; using one of %d",
                num_tokens,
                self.count(text),
            )
        return text, self.count(text)

    def count(self, text: str) -> int:
        return len(self._encode(text, True))

    def _fit(self, target: int) -> tuple[str, bool]:
        ids = self._sample(target)
        text = ""
        for _ in range(_ROUNDS):
            text = self.tok.decode(ids)
            again = self._encode(text, False)
            if len(again) == target and text.strip():
                return text, True
            ids = (
                again[:target] if len(again) > target else again + self._sample(target - len(again))
            )
        return text, False

    def _sample(self, num: int) -> list[int]:
        return [int(i) for i in self.rng.choice(self.ids, size=num)]

    def _encode(self, text: str, special: bool) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=special))


def random_requests(
    tokenizer: Any, num: int, input_len: int, output_len: int, range_ratio: float, seed: int
) -> list[SampleRequest]:
    rng = np.random.default_rng(seed)
    in_lens = sample_lengths(rng, input_len, range_ratio, num)
    out_lens = sample_lengths(rng, output_len, range_ratio, num)
    maker = PromptMaker(tokenizer, rng)
    out = []
    for n_in, n_out in zip(in_lens, out_lens):
        text, count = maker.make(n_in)
        out.append(SampleRequest(text, count, n_out))
    return out


def jsonl_requests(
    path: str, num: int, output_len: int, tokenizer: Any | None
) -> list[SampleRequest]:
    """The first `num` lines of {"prompt": str, "output_len": int (optional)}."""
    out: list[SampleRequest] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if len(out) == num:
            break
        if line.strip():
            out.append(_jsonl_line(line, f"{path}:{lineno}", output_len, tokenizer))
    if len(out) < num:
        logger.warning("%s holds %d prompts; --num-prompts asked for %d", path, len(out), num)
    return out


def _jsonl_line(line: str, where: str, output_len: int, tokenizer: Any | None) -> SampleRequest:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise SystemExit(f"{where}: invalid JSON ({e})") from e
    obj = obj if isinstance(obj, dict) else {}
    prompt, n_out = obj.get("prompt"), obj.get("output_len")
    if not isinstance(prompt, str) or not prompt:
        raise SystemExit(
            f'{where}: need {{"prompt": non-empty string, "output_len": optional int}}'
        )
    if n_out is not None and (not isinstance(n_out, int) or n_out < 1):
        raise SystemExit(f"{where}: output_len must be a positive integer")
    prompt_len = (
        len(tokenizer.encode(prompt, add_special_tokens=True)) if tokenizer is not None else 0
    )
    return SampleRequest(prompt, prompt_len, n_out or output_len)
