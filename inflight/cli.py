"""`inflight serve | generate`: the command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from inflight.engine.llm_engine import LLMEngine
from inflight.sampling_params import SamplingParams
from inflight.server import options as options_mod


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens per request")
    p.add_argument("--max-num-seqs", type=int, default=64, help="running requests per step")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per step")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="KV pool size in bytes")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")


def _build_engine(args: argparse.Namespace) -> LLMEngine:
    return LLMEngine.from_args(
        args.model,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        enable_prefix_caching=not args.no_prefix_caching,
    )


def demo_model_path() -> str:
    return str(Path(__file__).parent / "demo_model")


def cmd_serve(args: argparse.Namespace) -> None:
    import ssl

    import uvicorn

    from inflight.engine.async_engine import AsyncEngine
    from inflight.server import options
    from inflight.server.app import build_app
    from inflight.server.config import ServerConfig

    opts = options.load(args)
    model = opts.model or demo_model_path()

    def build() -> LLMEngine:
        engine = LLMEngine.from_args(
            model, dtype=opts.dtype, device=opts.device, max_model_len=opts.max_seq_len,
            max_num_seqs=opts.max_num_seqs, max_num_batched_tokens=opts.max_num_batched_tokens,
            block_size=opts.block_size, kv_cache_memory_bytes=opts.kv_cache_memory_bytes,
            enable_prefix_caching=not opts.no_prefix_caching, max_input_tokens=opts.max_input_token_len,
            max_iter_times=opts.max_iter_times, attention_backend=opts.attention_backend,
            enforce_eager=opts.enforce_eager, load_format=opts.load_format,
        )  # fmt: skip
        if opts.chat_template and engine.tokenizer is not None:
            engine.tokenizer.chat_template = Path(opts.chat_template).read_text()
        return engine

    # the model is loaded and run on the engine thread only: see AsyncEngine
    async_engine = AsyncEngine.launch(build)
    names = tuple(opts.served_model_name or [Path(model).name])
    config = ServerConfig(
        served_model_names=names, full_text_enabled=opts.full_text_enabled, api_keys=options.api_keys(opts),
        auth_metrics=not opts.no_auth_metrics, max_body_bytes=opts.max_body_bytes, max_queue=opts.max_queue,
        perf_extras=opts.perf_extras, embedding_pooling=opts.embedding_pooling, tool_call_parser=opts.tool_call_parser,
    )  # fmt: skip
    tls: dict = {}
    if opts.ssl_certfile:
        tls = {"ssl_certfile": opts.ssl_certfile, "ssl_keyfile": opts.ssl_keyfile}
        if opts.ssl_ca_certs:
            tls |= {"ssl_ca_certs": opts.ssl_ca_certs, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    uvicorn.run(build_app(async_engine, config), host=opts.host, port=opts.port, log_level=opts.log_level, **tls)


def cmd_generate(args: argparse.Namespace) -> None:
    from inflight.llm import LLM

    llm = LLM.from_engine(_build_engine(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    for out in llm.generate(args.prompt, params, use_tqdm=False):
        c = out.outputs[0]
        print(json.dumps({"prompt": out.prompt, "text": c.text, "finish_reason": c.finish_reason}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="inflight", description="In-flight batching LLM server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible and /v2 generate APIs")
    options_mod.add_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    gen = sub.add_parser("generate", help="generate offline for prompts given on the command line")
    _engine_args(gen)
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=cmd_generate)
    # inflight.bench.cli imports only argparse at load: `inflight serve` start-up is unaffected
    from inflight.bench import cli as bench_cli

    bench = sub.add_parser("bench", help="benchmark a server (or the engine: --offline)")
    bench_cli.add_arguments(bench)
    bench.set_defaults(func=bench_cli.run)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
