"""`inflight serve | generate`: the command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight import memory
from inflight.engine.args import DEMO_MODEL, EngineArgs
from inflight.server import options as options_mod

if TYPE_CHECKING:
    from inflight.engine.llm_engine import LLMEngine

# Nothing imported above (or by the start-up checks of `cmd_serve`) imports torch or
# transformers: `--help` and every start-up mistake answer in well under a second, and only a
# command that will load a model pays for them (tests/e2e/test_cli_imports.py).


def demo_model_path() -> str:
    return DEMO_MODEL


def _engine_args(args: argparse.Namespace) -> EngineArgs:
    try:
        return EngineArgs.from_cli_args(args)
    except ValueError as e:
        raise SystemExit(f"inflight {args.command}: {e}") from e


def cmd_serve(args: argparse.Namespace) -> None:
    """Check options, files and the port (exit 2 on one line), load the model, serve until drained."""
    from inflight.server import options, serve

    try:
        opts = options.load(args)
        if _serve_ranks_only(opts.engine):  # node K > 0 / torchrun RANK > 0: ranks only, exits
            return
        tls = {"ssl_certfile": opts.ssl_certfile, "ssl_keyfile": opts.ssl_keyfile, "ssl_ca_certs": opts.ssl_ca_certs}
        serve.check_files(opts.engine.model_path, opts.engine.device, tls, opts.chat_template, opts.api_key_file)
        config = options.server_config(opts, tuple(opts.served_model_name or [Path(opts.engine.model_path).name]))
        for name, path in options.lora_modules(opts):
            if name in config.served_model_names:  # the adapter would hide the base model
                raise options.ConfigError(f"lora_modules: {name!r} is the base model's name")
            if not Path(path).is_dir():  # before the model loads; its files are checked at load
                raise options.ConfigError(f"lora_modules: {name}={path}: not a directory (a PEFT adapter directory is expected)")
        ckpt = serve.check_engine_config(opts.engine)  # from config.json / the GGUF header, without torch
        serve.check_lora_modules(options.lora_modules(opts), ckpt.hf_config, opts.engine.max_lora_rank)
        sock = serve.bind(opts.host, opts.port)
    except (options.ConfigError, serve.StartupError) as e:
        print(f"inflight serve: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    # OpenMP threads that spin between steps (libgomp's default: 300k turns) take the cores from
    # the event loop: on 2 cores a drain deadline fired 3.6 s late and streams stalled. A short
    # spin keeps a step's barriers quick; set before torch loads libgomp; the user's value wins.
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    from inflight.engine.llm_engine import LLMEngine
    from inflight.server.app import build_app

    def build(args: EngineArgs) -> LLMEngine:
        engine = LLMEngine.from_engine_args(_serving(args))
        if opts.chat_template and engine.tokenizer is not None:
            engine.tokenizer.chat_template = Path(opts.chat_template).read_text()
        for name, path in options.lora_modules(opts):
            try:
                engine.adapters.load(name, path)
            except ValueError as e:  # ParamError: the adapter does not fit this model
                raise SystemExit(f"--lora-modules {name}={path}: {e}") from e
        return engine

    async_engine = _launch(opts, build)
    tls_kw: dict = {}
    if opts.ssl_certfile:
        tls_kw = {"ssl_certfile": opts.ssl_certfile, "ssl_keyfile": opts.ssl_keyfile}
        if opts.ssl_ca_certs:
            tls_kw |= {"ssl_ca_certs": opts.ssl_ca_certs, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    try:
        serve.serve(build_app(async_engine, config), async_engine, config, sock, log_level=opts.log_level, **tls_kw)
    finally:
        async_engine.shutdown()


def _launch(opts: Any, build: Any) -> Any:
    """The engine client: one engine (on an engine thread, or `--engine-process` in a process of
    its own), or data-parallel replicas behind a router."""
    from inflight.engine.async_engine import AsyncEngine

    if opts.engine_process:
        from inflight.engine.core_process import CoreEngine

        if options_mod.lora_modules(opts) or opts.engine.enable_lora or opts.engine.data_parallel_size > 1:
            raise SystemExit("inflight serve: --engine-process: not with LoRA adapters or data-parallel replicas yet")
        template = Path(opts.chat_template).read_text() if opts.chat_template else None
        return CoreEngine.launch_core(opts.engine, template)
    # the model is loaded and run on the engine thread only: see AsyncEngine
    if opts.engine.data_parallel_size == 1:
        return AsyncEngine.launch(lambda: build(opts.engine))
    from inflight.engine.router import ReplicaRouter  # replicas, each in its own worker process(es)

    return ReplicaRouter.of([AsyncEngine.launch(lambda a=a: build(a)) for a in _replica_args(opts.engine)])


def _serving(args: EngineArgs) -> EngineArgs:
    """`args` with the executor `inflight serve` runs (`auto`: EngineArgs.serving_backend)."""
    from dataclasses import replace

    from inflight.config import resolve_device

    backend = args.serving_backend(resolve_device(args.device).type)
    if backend != args.distributed_executor_backend:
        logging.getLogger(__name__).info("executor: %s (distributed_executor_backend auto)", backend)
    return replace(args, distributed_executor_backend=backend)


def _replica_args(engine: EngineArgs) -> list[EngineArgs]:
    """One EngineArgs per data-parallel replica: never in the server's process (`mp`, or one
    process per rank), each tensor-parallel replica at its own master port."""
    from dataclasses import replace

    out = []
    for i in range(engine.data_parallel_size):
        port = engine.master_port + i if engine.master_port is not None else None
        backend = "mp" if engine.tensor_parallel_size == 1 else engine.distributed_executor_backend
        out.append(replace(engine, distributed_executor_backend=backend, master_port=port))
    return out


def _serve_ranks_only(engine: EngineArgs) -> bool:
    """Run this process's tensor-parallel ranks without a front end, if that is its job: a node
    other than 0 (`--node-rank K`) spawns its ranks and waits for them; under torchrun a RANK
    other than 0 is a rank itself. Node 0 / RANK 0 returns False and serves (under torchrun
    with tensor_parallel_size from WORLD_SIZE)."""
    if engine.node_rank == 0 and not _under_torchrun():
        return False  # the common case, decided without importing torch
    from dataclasses import replace

    from inflight.config import resolve_device
    from inflight.worker import distributed

    backend = "nccl" if resolve_device(engine.device).type == "cuda" else "gloo"
    place = distributed.RankPlace.from_env()
    if place is not None:  # torchrun
        if engine.tensor_parallel_size == 1:
            engine.tensor_parallel_size = place.world_size
        if place.rank == 0:
            return False
        place = replace(place, backend=backend, timeout_s=engine.collective_timeout_s)
        from inflight.worker.worker_process import follower_main

        raise SystemExit(follower_main(distributed.RankGroup(place)))
    if engine.node_rank == 0:
        return False
    from inflight.config import ParallelConfig
    from inflight.worker.executor import spawn_worker

    par = ParallelConfig(
        engine.tensor_parallel_size, engine.nnodes, engine.node_rank, engine.master_addr, engine.master_port,
        engine.collective_timeout_s,
    )  # fmt: skip
    logging.getLogger(__name__).info(
        "node %d of %d: ranks %s of %d, meeting rank 0 at %s:%s; no front end on this node",
        par.node_rank, par.nnodes, [p.rank for p in distributed.node_places(par, par.node_rank, backend)],
        par.tensor_parallel_size, par.master_addr, par.master_port,
    )  # fmt: skip
    procs = [spawn_worker(None, p, par.core_sharers) for p in distributed.node_places(par, par.node_rank, backend)]
    codes = [proc.wait() for proc in procs]
    raise SystemExit(max(codes))


def _under_torchrun() -> bool:
    """What `RankPlace.from_env` reads first: a group of 2 or more with a RANK."""
    return int(os.environ.get("WORLD_SIZE", "1")) >= 2 and "RANK" in os.environ


def cmd_generate(args: argparse.Namespace) -> None:
    engine_args = _engine_args(args)
    if engine_args.data_parallel_size != 1:
        raise SystemExit("inflight generate: --data-parallel-size: replicas are served (inflight serve)")
    try:  # the engine config's checks, before torch loads
        engine_args.check()
    except (ValueError, OSError) as e:
        raise SystemExit(f"inflight generate: {e}") from e
    from inflight.engine.llm_engine import LLMEngine
    from inflight.llm import LLM
    from inflight.sampling_params import SamplingParams

    llm = LLM.from_engine(LLMEngine.from_engine_args(engine_args.for_offline()))
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
    serve.set_defaults(func=cmd_serve, subparser=serve)
    gen = sub.add_parser("generate", help="generate offline for prompts given on the command line")
    EngineArgs.add_cli_args(gen.add_argument_group("engine"))
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=cmd_generate, subparser=gen)
    from inflight.lora import make as lora_make

    lora = sub.add_parser("lora", help="LoRA tools: `inflight lora make OUT_DIR` writes an adapter to try")
    lora.set_defaults(subparser=lora)
    lora_make.add_arguments(lora)
    # inflight.bench.cli imports only argparse at load: `inflight serve` start-up is unaffected
    from inflight.bench import cli as bench_cli

    bench = sub.add_parser("bench", help="benchmark a server (or the engine: --offline)")
    bench_cli.add_arguments(bench)
    bench.set_defaults(func=bench_cli.run, subparser=bench)
    return parser


def main(argv: list[str] | None = None) -> None:
    memory.configure()  # before any model loads: oneDNN reads its cache sizes at its first primitive
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # argparse would print the top-level usage: the command's own is the useful one
        args.subparser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
