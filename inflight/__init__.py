"""inflight: an in-flight batching LLM inference engine and server.

The names below load on first use (PEP 562): `inflight --help` and the CLI's start-up checks
import this package without paying for torch and transformers (tests/e2e/test_cli_imports.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inflight.engine.async_engine import AsyncEngine
    from inflight.engine.llm_engine import LLMEngine
    from inflight.llm import LLM
    from inflight.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
    from inflight.sample.watermark import detect_watermark, watermark_z_score
    from inflight.sampling_params import ParamError, SamplingParams

_WHERE = {
    "LLM": "inflight.llm",
    "AsyncEngine": "inflight.engine.async_engine",
    "LLMEngine": "inflight.engine.llm_engine",
    "SamplingParams": "inflight.sampling_params",
    "ParamError": "inflight.sampling_params",
    "RequestOutput": "inflight.outputs",
    "CompletionOutput": "inflight.outputs",
    "Logprob": "inflight.outputs",
    "RequestMetrics": "inflight.outputs",
    "detect_watermark": "inflight.sample.watermark",
    "watermark_z_score": "inflight.sample.watermark",
}
__all__ = [
    "LLM", "AsyncEngine", "LLMEngine", "SamplingParams", "ParamError", "RequestOutput", "CompletionOutput",
    "Logprob", "RequestMetrics", "detect_watermark", "watermark_z_score",
]  # fmt: skip
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'inflight' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
