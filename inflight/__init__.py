"""inflight: an in-flight batching LLM inference engine and server."""

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.llm import LLM
from inflight.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from inflight.sample.watermark import detect_watermark, watermark_z_score
from inflight.sampling_params import ParamError, SamplingParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "LLMEngine",
    "SamplingParams",
    "ParamError",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestMetrics",
    "detect_watermark",
    "watermark_z_score",
]
__version__ = "0.1.0"
