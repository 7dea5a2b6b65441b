"""Fixtures shared by the engine end-to-end tests (test_engine_behaviour, test_stops_and_streaming).

Module-scoped, as they were when one file held both: each test module gets its own engine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import _llm

from inflight import LLM


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("qwen2")  # ships the tiny byte-level BPE tokenizer


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return _llm(model_dir)
