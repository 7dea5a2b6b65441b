"""`inflight bench`: arguments and the run.

Only argparse and `EngineArgs` at import time: `inflight.cli` registers this subcommand for every
invocation, `inflight serve` included; aiohttp, numpy, transformers and the engine load inside `run`.
The engine flags (`--model` included) are `EngineArgs`'s, as in `inflight serve` and `generate`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from inflight.engine.args import DEMO_MODEL, EngineArgs

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    _target_args(p.add_argument_group("target"))
    _dataset_args(p.add_argument_group("dataset"))
    _load_args(p.add_argument_group("load"))
    EngineArgs.add_cli_args(
        p.add_argument_group("engine (--model also names the tokenizer and the served model; the rest apply with --offline)")
    )
    out = p.add_argument_group("output")
    out.add_argument("--result-json", help="write config, metrics and per-request data here")
    out.add_argument("--plot", help="write a PNG of latency percentiles and throughput over time")
    out.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def _target_args(g: Any) -> None:
    g.add_argument(
        "--backend",
        choices=("completions", "chat", "generate"),
        default="completions",
        help="/v1/completions, /v1/chat/completions or /v2/models/{model}/generate_stream",
    )
    g.add_argument("--base-url", help="server URL (default: http://HOST:PORT)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--served-model-name", help="model name in requests (default: --model's last path part)"
    )
    g.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    g.add_argument(
        "--extra-body",
        type=json.loads,
        default={},
        help="JSON object merged into each body ('parameters' for generate)",
    )
    g.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for each stream event"
    )
    g.add_argument(
        "--offline", action="store_true", help="run the workload through inflight.LLM, no server"
    )


def _dataset_args(g: Any) -> None:
    g.add_argument("--dataset", choices=("random", "jsonl"), default="random")
    g.add_argument(
        "--dataset-path", help='jsonl: one {"prompt": str, "output_len": int (optional)} per line'
    )
    g.add_argument("--num-prompts", type=int, default=100)
    g.add_argument("--input-len", type=int, default=128, help="random: prompt tokens")
    g.add_argument(
        "--output-len", type=int, default=128, help="output tokens (jsonl: when a line has none)"
    )
    g.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="random: lengths uniform in [len * (1 - r), len * (1 + r)]",
    )


def _load_args(g: Any) -> None:
    g.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests/s, Poisson arrivals; inf sends all at once",
    )
    g.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    g.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="generate exactly the output length (default: on for random, off for jsonl)",
    )
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0, help="prompts, lengths and arrival times")
    g.add_argument(
        "--num-warmups", type=int, default=0, help="requests sent one by one before timing"
    )


def _check(args: argparse.Namespace) -> None:
    problems = [
        (args.num_prompts < 1, "--num-prompts must be >= 1"),
        (args.input_len < 1 or args.output_len < 1, "--input-len and --output-len must be >= 1"),
        (not 0.0 <= args.range_ratio < 1.0, "--range-ratio must be in [0, 1)"),
        (not args.request_rate > 0, "--request-rate must be > 0"),
        (
            args.max_concurrency is not None and args.max_concurrency < 1,
            "--max-concurrency must be >= 1",
        ),
        (args.dataset == "jsonl" and not args.dataset_path, "--dataset jsonl needs --dataset-path"),
        (not isinstance(args.extra_body, dict), "--extra-body must be a JSON object"),
    ]
    for bad, message in problems:
        if bad:
            raise SystemExit(f"inflight bench: {message}")
    if args.plot:  # now, not after the whole run
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SystemExit("inflight bench: --plot needs matplotlib: pip install 'inflight[bench]'") from None


def _resolve(args: argparse.Namespace) -> None:
    """Fill the defaults that depend on other arguments."""
    if args.model is None:
        args.model = DEMO_MODEL  # as `inflight serve` runs it
    try:  # every engine option, given or default, so that the result JSON records them all
        engine_args = EngineArgs.from_cli_args(args)
        if args.offline:  # the engine config's checks, before torch loads (engine/args.py)
            engine_args.check()
        vars(args).update(dataclasses.asdict(engine_args))
    except (ValueError, OSError) as e:
        raise SystemExit(f"inflight bench: {e}") from e
    args.served_model_name = args.served_model_name or Path(args.model).name
    args.tokenizer = args.tokenizer or args.model
    args.base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    if args.ignore_eos is None:
        args.ignore_eos = args.dataset == "random"
    if args.offline:
        args.backend = "offline"


def _tokenizer(args: argparse.Namespace) -> Any | None:
    from inflight.bench.dataset import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    if tokenizer is None and args.dataset == "random":
        raise SystemExit(
            "inflight bench: --dataset random needs a tokenizer (pass --tokenizer PATH)"
        )
    if tokenizer is None:
        logger.warning("without a tokenizer, uncounted output tokens are counted one per chunk")
    return tokenizer


def _workload(args: argparse.Namespace, tokenizer: Any | None) -> tuple[list[Any], list[Any]]:
    """(requests, warmup requests): warmups are other random prompts, or the first jsonl ones."""
    from inflight.bench import dataset

    if args.dataset == "jsonl":
        requests = dataset.jsonl_requests(
            args.dataset_path, args.num_prompts, args.output_len, tokenizer
        )
        return requests, requests[: args.num_warmups]
    sizes = (args.input_len, args.output_len, args.range_ratio)
    requests = dataset.random_requests(tokenizer, args.num_prompts, *sizes, seed=args.seed)
    warmups = dataset.random_requests(tokenizer, args.num_warmups, *sizes, seed=args.seed + 1)
    return requests, warmups


def _measure(
    args: argparse.Namespace, requests: list[Any], warmups: list[Any]
) -> tuple[list[Any], float]:
    if args.offline:
        from inflight.bench.offline import build_llm, run_offline

        llm = build_llm(args)
        return run_offline(
            llm, requests, warmups, args.ignore_eos, args.temperature, not args.disable_tqdm
        )
    import asyncio

    from inflight.bench.backends import BACKENDS, RequestConfig
    from inflight.bench.client import LoadConfig, run_load

    cfg = RequestConfig(args.served_model_name, args.ignore_eos, args.temperature, args.extra_body)
    load = LoadConfig(
        base_url=args.base_url,
        request_rate=args.request_rate,
        max_concurrency=args.max_concurrency,
        seed=args.seed,
        timeout_s=args.timeout,
        api_key=args.api_key,
        progress=not args.disable_tqdm,
    )
    return asyncio.run(run_load(BACKENDS[args.backend](), requests, warmups, cfg, load))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark, print the table; returns {"config", "metrics", "results"}."""
    from inflight.bench import report
    from inflight.bench.client import count_missing_tokens
    from inflight.bench.metrics import summarize

    _check(args)
    _resolve(args)
    tokenizer = _tokenizer(args)
    requests, warmups = _workload(args, tokenizer)
    results, duration = _measure(args, requests, warmups)
    count_missing_tokens(results, tokenizer)
    metrics = summarize(results, duration)
    config = {k: v for k, v in vars(args).items() if k not in ("func", "command", "api_key")}
    heading = "Offline Benchmark Result" if args.offline else "Serving Benchmark Result"
    print(report.table(heading, metrics, config))
    for warning in report.warnings(metrics, results, args.ignore_eos):
        print(f"WARNING: {warning}")
    if args.result_json:
        report.write_json(args.result_json, config, metrics, results)
    if args.plot:
        from inflight.bench.plot import write_plot

        title = f"inflight bench: {args.backend}, {args.served_model_name}"
        write_plot(args.plot, title, metrics, results)
    return {"config": config, "metrics": metrics, "results": results}
