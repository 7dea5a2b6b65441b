"""The result table (laid out as `vllm bench serve` prints it) and the --result-json file."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from inflight.bench.metrics import LATENCIES, RequestResult

_WIDTH = 50


def _line(label: str, value: Any) -> str:
    if value is None:
        text = "n/a"
    elif isinstance(value, float):
        text = f"{value:.2f}"
    else:
        text = str(value)
    return f"{label:<40} {text:<10}"


def table(title: str, metrics: dict[str, Any], config: dict[str, Any]) -> str:
    rows = [f"{' ' + title + ' ':=^{_WIDTH}}", _line("Backend:", config["backend"])]
    rows += [
        _line("Successful requests:", metrics["completed"]),
        _line("Failed requests:", metrics["failed"]),
    ]
    if config.get("max_concurrency") and not config.get("offline"):
        rows.append(_line("Maximum request concurrency:", config["max_concurrency"]))
    if not config.get("offline"):
        rate = config["request_rate"]
        rows.append(
            _line("Request rate configured (RPS):", "inf" if math.isinf(rate) else float(rate))
        )
    rows += [
        _line("Benchmark duration (s):", metrics["duration_s"]),
        _line("Total input tokens:", metrics["total_input_tokens"]),
        _line("Total generated tokens:", metrics["total_output_tokens"]),
        _line("Request throughput (req/s):", metrics["request_throughput"]),
        _line("Output token throughput (tok/s):", metrics["output_throughput"]),
        _line("Total token throughput (tok/s):", metrics["total_token_throughput"]),
        _line("Peak concurrent requests:", metrics["peak_concurrent_requests"]),
    ]
    for key, heading, short in LATENCIES:
        rows.append(f"{heading:-^{_WIDTH}}")
        for stat, name in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
            rows.append(_line(f"{name} {short} (ms):", metrics[f"{stat}_{key}_ms"]))
    rows.append("=" * _WIDTH)
    return "\n".join(rows)


def warnings(metrics: dict[str, Any], results: list[RequestResult], ignore_eos: bool) -> list[str]:
    out = []
    errors = sorted({r.error for r in results if not r.success})
    if errors:
        out.append(f"{metrics['failed']} requests failed; first errors: " + " | ".join(errors[:3]))
    if ignore_eos and metrics["num_output_len_mismatch"]:
        out.append(
            f"{metrics['num_output_len_mismatch']} requests returned a number of output tokens other than asked (ignore_eos is on)"
        )
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # strict JSON has no inf / nan
    return (
        value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)
    )


def write_json(
    path: str, config: dict[str, Any], metrics: dict[str, Any], results: list[RequestResult]
) -> None:
    requests = [asdict(r) | {"tpot_s": r.tpot_s} for r in results]
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {k: _jsonable(v) for k, v in config.items()},
        "metrics": metrics,
        "requests": requests,
    }
    Path(path).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
