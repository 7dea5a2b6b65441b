"""Prometheus metrics: HTTP requests by route and status, engine gauges, latency histograms.

Each app gets its own registry (several apps can live in one process, as in tests).
Engine gauges come from the stats snapshot the engine thread published after its last step
(`EngineClient.stats`: a scrape never touches engine state); per-request figures are observed
when a request finishes (the engine client's output observer).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from inflight.engine.client import EngineClient
from inflight.outputs import RequestOutput

# seconds; CPU prefill of long prompts reaches tens of seconds
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_LENGTH_BUCKETS = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 12, 17, 33)  # 1 + accepted per step; K <= 32


class _EngineCollector:
    """Engine gauges and counters. Behind a data-parallel router (engine/router.py) every sample
    has a `replica` label: one per replica ("0", "1", ...) and "all" for the sum (KV usage and
    prefix hit rate: the mean)."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self):  # type: ignore[no-untyped-def]
        snaps = [("", self.engine.stats)]
        replicas = getattr(self.engine, "replica_stats", None)
        if replicas is not None:
            snaps = [(str(i), s) for i, s in enumerate(replicas)] + [("all", snaps[0][1])]
        labels = ["replica"] if replicas is not None else []
        families = (
            (GaugeMetricFamily, "inflight_requests_running", "Requests in the running batch", "num_running"),
            (GaugeMetricFamily, "inflight_requests_waiting", "Requests waiting to be scheduled", "num_waiting"),
            (GaugeMetricFamily, "inflight_kv_cache_usage_ratio", "Fraction of KV blocks in use", "kv_cache_usage"),
            (GaugeMetricFamily, "inflight_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / looked up", "prefix_cache_hit_rate"),
            (CounterMetricFamily, "inflight_preemptions", "Requests preempted (recomputed later)", "num_preemptions"),
            (CounterMetricFamily, "inflight_engine_steps", "Engine steps run", "num_steps"),
        )  # fmt: skip
        for kind, name, doc, field in families:
            family = kind(name, doc, labels=labels)
            for label, s in snaps:
                family.add_metric([label] if labels else [], getattr(s, field))
            yield family
        queued = GaugeMetricFamily("inflight_queued_sequences", "Engine sequences admitted and not finished (what --max-queue limits)")
        queued.add_metric([], self.engine.num_queued_sequences)
        yield queued
        yield from _worker_metrics(snaps, labels)
        s = snaps[-1][1]  # the engine, or all replicas together
        if s.lora is not None:
            yield from _lora_metrics(s.lora)


def _worker_metrics(snaps: list[tuple[str, Any]], labels: list[str]) -> Iterator[Any]:
    """The model worker process's busy and idle seconds (`mp` only: absent when the model runs in
    the engine thread); idle / (busy + idle) over a window is how much the server starves the model."""
    families = (
        ("inflight_model_worker_busy_seconds", "Seconds the model worker process ran steps", "worker_busy_s"),
        ("inflight_model_worker_idle_seconds", "Seconds the model worker waited for its next step between two steps (gaps over 50 ms excluded)", "worker_idle_s"),
    )  # fmt: skip
    for name, doc, field in families:
        rows = [(label, getattr(s, field)) for label, s in snaps if getattr(s, field) is not None]
        if rows:
            family = CounterMetricFamily(name, doc, labels=labels)
            for label, value in rows:
                family.add_metric([label] if labels else [], value)
            yield family


def _lora_metrics(lora: Any) -> Iterator[Any]:
    """The two LoRA caches, by level: device (the runner's slots) and host (memory)."""
    loaded = GaugeMetricFamily("inflight_lora_adapters_loaded", "LoRA adapters loaded, by level", labels=["level"])
    loaded.add_metric(["device"], lora.num_resident)
    loaded.add_metric(["host"], lora.host.num_cached)
    yield loaded
    for name, doc, device, host in (
        ("inflight_lora_loads", "LoRA adapters loaded into a level (device slot / host memory)", lora.loads, lora.host.loads),
        ("inflight_lora_evictions", "LoRA adapters evicted from a level", lora.evictions, lora.host.evictions),
        ("inflight_lora_hits", "LoRA adapters found loaded (device: once per step, host: once per request)", lora.hits, lora.host.hits),
    ):
        c = CounterMetricFamily(name, doc, labels=["level"])
        c.add_metric(["device"], device)
        c.add_metric(["host"], host)
        yield c


class Metrics:
    def __init__(self, engine: EngineClient) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http = Counter("inflight_http_requests", "HTTP requests", ["endpoint", "status"], registry=r)
        self.finished = Counter("inflight_requests_finished", "Requests finished", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("inflight_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("inflight_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("inflight_time_to_first_token_seconds", "Time to first token", buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("inflight_time_per_output_token_seconds", "Time per output token after the first", buckets=_TPOT_BUCKETS, registry=r)
        # admission and failures (docs/OPERATIONS.md)
        self.rejected = Counter("inflight_requests_rejected", "Requests refused at arrival: queue_full (429), deadline (503: the timeout can't be met)", ["reason"], registry=r)
        self.expired = Counter("inflight_requests_expired", "Requests ended by their timeout", registry=r)
        self.wasted = Counter("inflight_wasted_tokens", "Tokens computed for requests that were then aborted or expired", registry=r)
        self.failed = Counter("inflight_requests_failed", "Requests the engine failed (a step raised on them)", registry=r)
        # speculative decoding (docs/SPECULATIVE_DECODING.md); vLLM's counter names, our prefix
        self.spec_drafts = Counter("inflight_spec_decode_num_drafts", "Steps that verified draft tokens", registry=r)
        self.spec_draft_tokens = Counter("inflight_spec_decode_num_draft_tokens", "Draft tokens verified", registry=r)
        self.spec_accepted = Counter("inflight_spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.spec_rate = Histogram("inflight_spec_decode_acceptance_rate", "Per request: accepted / verified draft tokens", buckets=_RATE_BUCKETS, registry=r)
        self.spec_length = Histogram("inflight_spec_decode_mean_accepted_length", "Per request: tokens per verifying step (1 + accepted / steps)", buckets=_LENGTH_BUCKETS, registry=r)
        r.register(_EngineCollector(engine))  # type: ignore[arg-type]
        engine.add_observer(self.observe)

    def observe(self, out: RequestOutput) -> None:
        """Called on the engine thread for every finished request."""
        if not out.finished:
            return
        m = out.metrics
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        for c in out.outputs:
            self.generation_tokens.inc(len(c.token_ids))
            self.finished.labels(c.finish_reason or "unknown").inc()
        reasons = {c.finish_reason for c in out.outputs}
        if "timeout" in reasons:
            self.expired.inc()
        if out.error is not None:
            self.failed.inc()
        if reasons <= {"abort", "timeout"}:  # nobody got the result: what it computed was wasted
            self.wasted.inc(m.num_tokens_run)  # every sequence / beam of it (outputs.RequestMetrics)
        if m.time_to_first_token_ms is not None:
            self.ttft.observe(m.time_to_first_token_ms / 1e3)
        for d in m.decode_times_ms:
            self.tpot.observe(d / 1e3)
        if m.num_drafts:
            self.spec_drafts.inc(m.num_drafts)
            self.spec_draft_tokens.inc(m.num_draft_tokens)
            self.spec_accepted.inc(m.num_accepted_draft_tokens)
            self.spec_rate.observe(m.num_accepted_draft_tokens / max(m.num_draft_tokens, 1))
            self.spec_length.observe(1 + m.num_accepted_draft_tokens / m.num_drafts)

    def render(self) -> bytes:
        return generate_latest(self.registry)
