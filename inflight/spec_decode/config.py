"""`--speculative-config`: vLLM's JSON spelling, parsed and checked once at start-up.

Every failure is a ValueError naming the field (`speculative_config.num_speculative_tokens`),
so `inflight serve` stops with one line and `LLM(...)` raises before any weights load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram",)
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
        names = {f.name for f in fields(cls)}
        for key in value:
            if key not in names:
                raise ValueError(f"speculative_config.{key}: unknown field; fields: {', '.join(sorted(names))}")
        method = value.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config.method: {method!r}; use {' | '.join(METHODS)}")
        for key in names - {"method"}:
            v = value.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise ValueError(f"speculative_config.{key}: must be an integer, got {v!r}")
        k = value.get("num_speculative_tokens")
        if k is None:
            raise ValueError("speculative_config.num_speculative_tokens: required")
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens: must be in [1, {MAX_SPECULATIVE_TOKENS}], got {k}")
        return cls(method=method, num_speculative_tokens=k, **_lookup_window(value), **_batch_limit(value))


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
