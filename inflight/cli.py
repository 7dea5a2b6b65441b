"""`inflight serve | generate`: the command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from inflight.engine.llm_engine import LLMEngine
from inflight.sampling_params import SamplingParams


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


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from inflight.engine.async_engine import AsyncEngine
    from inflight.server.app import build_app

    engine = AsyncEngine(_build_engine(args))
    engine.start()
    name = args.served_model_name or args.model.rstrip("/").split("/")[-1]
    uvicorn.run(build_app(engine, name), host=args.host, port=args.port, log_level="info")


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
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    _engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None)
    serve.set_defaults(func=cmd_serve)
    gen = sub.add_parser("generate", help="generate offline for prompts given on the command line")
    _engine_args(gen)
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=cmd_generate)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
