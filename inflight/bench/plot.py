"""--plot: latency percentiles (TTFT / TPOT / ITL / E2E) and throughput over time, as one PNG.

matplotlib is imported here only, and without pyplot: no global backend is switched.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inflight.bench.metrics import LATENCIES, RequestResult

_BARS = (("mean", "mean"), ("median", "p50"), ("p90", "p90"), ("p99", "p99"))
_NUM_BINS = 50


def write_plot(
    path: str, title: str, metrics: dict[str, Any], results: list[RequestResult]
) -> None:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from e
    fig = Figure(figsize=(13, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    _latency_bars(left, metrics)
    _over_time(right, results, metrics["duration_s"])
    fig.suptitle(title)
    fig.savefig(path, dpi=100)


def _latency_bars(ax: Any, metrics: dict[str, Any]) -> None:
    x = np.arange(len(LATENCIES))
    width = 0.8 / len(_BARS)
    for i, (stat, label) in enumerate(_BARS):
        values = [metrics[f"{stat}_{key}_ms"] or 0.0 for key, _, _ in LATENCIES]
        ax.bar(x + (i - 1.5) * width, values, width, label=label)
    ax.set_xticks(x, [short for _, _, short in LATENCIES])
    ax.set_ylabel("ms")
    if any(metrics[f"p99_{key}_ms"] for key, _, _ in LATENCIES):
        ax.set_yscale("log")  # E2E is often 100x ITL
    ax.set_title("Latency")
    ax.legend()


def _over_time(ax: Any, results: list[RequestResult], duration_s: float) -> None:
    """Output tokens/s per time bin (a chunk's tokens spread evenly) and requests in flight."""
    edges = np.linspace(0.0, max(duration_s, 1e-3), _NUM_BINS + 1)
    width = edges[1] - edges[0]
    times, weights = [], []
    for r in results:
        chunks = r.chunk_times() if r.success else []
        times += chunks
        weights += [r.output_tokens / max(1, len(chunks))] * len(chunks)
    counts, _ = np.histogram(times, bins=edges, weights=weights)
    mids = (edges[:-1] + edges[1:]) / 2
    ax.plot(mids, counts / width, color="tab:blue", label="output tok/s")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("output tokens/s")
    live = [sum(r.start_s <= t < r.start_s + r.latency_s for r in results) for t in mids]
    twin = ax.twinx()
    twin.step(mids, live, where="mid", color="tab:orange", label="requests in flight")
    twin.set_ylabel("requests in flight")
    ax.set_title("Throughput over time")
    lines = ax.get_lines() + twin.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], loc="upper right")
