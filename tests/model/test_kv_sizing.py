"""The KV pool is sized from the memory the loaded weights left (not measured before loading)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from inflight import LLM, SamplingParams


def test_pool_is_sized_after_the_model_loads(
    tiny_model_dir: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inflight")
    llm = LLM(model=str(tiny_model_dir("llama")), device="cpu", dtype="float32", max_num_seqs=2, progress=False)
    messages = [r.getMessage() for r in caplog.records]
    loaded = next(i for i, m in enumerate(messages) if m.startswith("model loaded:"))
    sized = next(i for i, m in enumerate(messages) if m.startswith("KV cache:"))
    assert loaded < sized
    runner = llm.engine.runner
    blocks = runner.kv_pool.shape[3] // llm.engine.config.cache.block_size
    assert blocks == llm.engine.kv.pool.num_blocks  # the scheduler's pool is the one allocated
    out = llm.generate(["hello"], SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
