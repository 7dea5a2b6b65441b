"""`inflight serve | generate`: the command line."""

from __future__ import annotations

import argparse
import json
import logging
import ssl
import sys
from pathlib import Path

from inflight.engine.args import DEMO_MODEL, EngineArgs
from inflight.engine.llm_engine import LLMEngine
from inflight.sampling_params import SamplingParams
from inflight.server import options as options_mod


def demo_model_path() -> str:
    return DEMO_MODEL


def _engine_args(args: argparse.Namespace) -> EngineArgs:
    try:
        return EngineArgs.from_cli_args(args)
    except ValueError as e:
        raise SystemExit(f"inflight {args.command}: {e}") from e


def cmd_serve(args: argparse.Namespace) -> None:
    """Check options, files and the port (exit 2 on one line), load the model, serve until drained."""
    from inflight.engine.async_engine import AsyncEngine
    from inflight.server import options, serve
    from inflight.server.app import build_app

    try:
        opts = options.load(args)
        tls = {"ssl_certfile": opts.ssl_certfile, "ssl_keyfile": opts.ssl_keyfile, "ssl_ca_certs": opts.ssl_ca_certs}
        serve.check_files(opts.engine.model_path, opts.engine.device, tls, opts.chat_template, opts.api_key_file)
        serve.check_engine_config(opts.engine)
        config = options.server_config(opts, tuple(opts.served_model_name or [Path(opts.engine.model_path).name]))
        sock = serve.bind(opts.host, opts.port)
    except (options.ConfigError, serve.StartupError) as e:
        print(f"inflight serve: {e}", file=sys.stderr)
        raise SystemExit(2) from None

    def build() -> LLMEngine:
        engine = LLMEngine.from_engine_args(opts.engine)
        if opts.chat_template and engine.tokenizer is not None:
            engine.tokenizer.chat_template = Path(opts.chat_template).read_text()
        for name, path in options.lora_modules(opts):
            try:
                engine.load_lora_adapter(name, path)
            except ValueError as e:  # ParamError: the adapter does not fit this model
                raise SystemExit(f"--lora-modules {name}={path}: {e}") from e
        return engine

    # the model is loaded and run on the engine thread only: see AsyncEngine
    async_engine = AsyncEngine.launch(build)
    tls_kw: dict = {}
    if opts.ssl_certfile:
        tls_kw = {"ssl_certfile": opts.ssl_certfile, "ssl_keyfile": opts.ssl_keyfile}
        if opts.ssl_ca_certs:
            tls_kw |= {"ssl_ca_certs": opts.ssl_ca_certs, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    try:
        serve.serve(build_app(async_engine, config), async_engine, config, sock, log_level=opts.log_level, **tls_kw)
    finally:
        async_engine.shutdown()


def cmd_generate(args: argparse.Namespace) -> None:
    from inflight.llm import LLM

    llm = LLM.from_engine(LLMEngine.from_engine_args(_engine_args(args)))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    for out in llm.generate(args.prompt, params, use_tqdm=False):
        c = out.outputs[0]
        print(json.dumps({"prompt": out.prompt, "text": c.text, "finish_reason": c.finish_reason}))


def build_parser() -> argparse.ArgumentParser:
    """`inflight serve | generate | bench`; each has EngineArgs's engine flags."""
    parser = argparse.ArgumentParser(prog="inflight", description="In-flight batching LLM server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible and /v2 generate APIs")
    options_mod.add_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    gen = sub.add_parser("generate", help="generate offline for prompts given on the command line")
    EngineArgs.add_cli_args(gen.add_argument_group("engine"))
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
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
