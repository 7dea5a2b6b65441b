"""Shared helpers for the engine end-to-end tests (a plain module, not a test file).

tests/e2e has no __init__.py: pytest's default "prepend" import mode puts tests/e2e on
sys.path, so the tests and conftest.py import this as `engine_helpers`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inflight import LLM, SamplingParams

PROMPT = "The old man finds a golden compass near the sea."
N_TOKENS = 24


def _llm(path: Path, **overrides: Any) -> LLM:
    kwargs: dict[str, Any] = {
        "dtype": "float32",
        "device": "cpu",
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "num_kv_blocks": 64,
        "block_size": 16,
        "enable_prefix_caching": True,
        "progress": False,
    }
    kwargs.update(overrides)
    return LLM(model=str(path), **kwargs)


def _greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(**{"max_tokens": N_TOKENS, "temperature": 0.0, "ignore_eos": True, **kw})


def _assert_idle(llm: LLM) -> None:
    assert not llm.engine.has_unfinished_requests()
    assert not llm.engine.requests
    llm.engine.kv.pool.check_idle()
