"""Per-request results -> the benchmark's metrics.

  TTFT  request sent -> first generated output received
  TPOT  (E2E - TTFT) / (output tokens - 1): decode time per token, excluding the first
  ITL   the gaps between successive streamed chunks, pooled over all requests
  E2E   request sent -> last event received
Each as mean / median / std / p90 / p99 in ms, over the successful requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# (key, table heading, short name)
LATENCIES = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)
STATS = ("mean", "median", "std", "p90", "p99")


@dataclass
class RequestResult:
    prompt_len: int  # from the dataset
    output_len: int  # asked for
    success: bool = False
    error: str = ""
    start_s: float = 0.0  # when it was sent, since the benchmark began
    ttft_s: float | None = None
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    output_tokens_source: str = ""  # "server" (usage / details) | "engine" | "tokenizer" | "chunks"
    server_prompt_tokens: int | None = None
    finish_reason: str | None = None
    generated_text: str = ""

    @property
    def num_chunks(self) -> int:
        return 0 if self.ttft_s is None else 1 + len(self.itl_s)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    def chunk_times(self) -> list[float]:
        """When each chunk arrived, since the benchmark began."""
        if self.ttft_s is None:
            return []
        return (self.start_s + self.ttft_s + np.cumsum([0.0, *self.itl_s])).tolist()


def stats(key: str, values_s: list[float]) -> dict[str, float | None]:
    """{mean_<key>_ms, median_..., std_..., p90_..., p99_...}; None when there is no sample."""
    if not values_s:
        return {f"{s}_{key}_ms": None for s in STATS}
    ms = np.asarray(values_s) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    values = (ms.mean(), p50, ms.std(), p90, p99)
    return {f"{s}_{key}_ms": float(v) for s, v in zip(STATS, values)}


def peak_concurrency(results: list[RequestResult]) -> int:
    events = sorted(
        [(r.start_s, 1) for r in results] + [(r.start_s + r.latency_s, -1) for r in results]
    )
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    return peak


def summarize(results: list[RequestResult], duration_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    n_in = sum(r.server_prompt_tokens or r.prompt_len for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    d = max(duration_s, 1e-9)
    metrics: dict[str, Any] = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration_s,
        "total_input_tokens": n_in, "total_output_tokens": n_out,
        "request_throughput": len(ok) / d, "output_throughput": n_out / d,
        "total_token_throughput": (n_in + n_out) / d, "peak_concurrent_requests": peak_concurrency(results),
        "num_output_len_mismatch": sum(r.output_tokens != r.output_len for r in ok),
    }  # fmt: skip
    samples = {
        "ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
        "tpot": [t for r in ok if (t := r.tpot_s) is not None],
        "itl": [x for r in ok for x in r.itl_s],
        "e2el": [r.latency_s for r in ok],
    }
    for key, values in samples.items():
        metrics |= stats(key, values)
    return metrics
