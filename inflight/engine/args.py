"""EngineArgs: every engine option once, with its default, its help and where it goes.

One dataclass generates the `inflight serve`, `inflight generate` and `inflight bench --offline`
engine flags (`add_cli_args`), the `LLM(...)` / `LLMEngine.from_args(...)` keywords
(`from_kwargs`), the engine keys of the serve JSON config file (`config_keys`), and the
`EngineConfig` (`create_engine_config`). vLLM's `EngineArgs` is the model.

To add an engine option, add a field here: `to` names the config it lands in ("model" is a
`ModelConfig.from_path` keyword, "cache" / "scheduler" a `CacheConfig` / `SchedulerConfig`
field, "engine" an `EngineConfig` field; "cache.num_blocks" renames), and every CLI, the config
file and `LLM` take it from there.

Field metadata:
    help      the flag's help (the default is appended when it is not None)
    to        where create_engine_config passes the value (None: checked here, passed nowhere)
    flags     older flag spellings kept working (`--max-seq-len`)
    keys      older / MindIE config-file keys (`max_seq_len`, `maxSeqLen`)
    negative  a bool's inverted spelling, as flag and key (`no_prefix_caching`)
    choices   the accepted values (checked at construction and by argparse)
    minimum   the smallest integer accepted (1 unless a 0 means "off")
"""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_args, get_type_hints

# config.py imports torch only where a device or dtype is resolved: the CLI checks its flags without it
from inflight.checkpoint import Checkpoint
from inflight.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    check_device_and_dtype,
    check_lora,
    default_step_tokens,
    resolve_device,
)
from inflight.spec_decode.config import SpeculativeConfig
from inflight.spec_decode.resolve import resolve as resolve_draft

DEMO_MODEL = str(Path(__file__).resolve().parents[1] / "demo_model")


def _arg(
    default: Any,
    help: str,  # noqa: A002 - argparse's name
    *,
    to: str | None,
    flags: tuple[str, ...] = (),
    keys: tuple[str, ...] = (),
    negative: str | None = None,
    choices: tuple[str, ...] | None = None,
    minimum: int = 1,
) -> Any:
    meta = {"help": help, "to": to, "flags": flags, "keys": keys, "negative": negative, "choices": choices, "minimum": minimum}
    return field(default=default, metadata=meta)


@dataclass
class EngineArgs:
    model: str | None = _arg(None, "Hugging Face checkpoint directory or GGUF file (default: the bundled demo model)", to=None, keys=("modelWeightPath",))
    tokenizer: str | None = _arg(None, "tokenizer directory (default: the model's own; a GGUF file's is rebuilt from its metadata)", to=None)
    quantization: str | None = _arg(None, "quantize a full-precision checkpoint at load, per output channel: int8 | fp8 (quantized checkpoints need no flag)", to="model", choices=("int8", "fp8"))
    dtype: str = _arg("auto", "auto (the checkpoint's; float32 on a CPU without native bf16) | float32 | bfloat16 | float16", to="model")
    device: str = _arg("auto", "auto (CUDA when present) | cpu | cuda", to="model")
    max_model_len: int | None = _arg(None, "prompt + output tokens per request (default: the model's max_position_embeddings, capped to the KV pool)", to="model", flags=("--max-seq-len",), keys=("max_seq_len", "maxSeqLen"))
    max_num_seqs: int = _arg(64, "requests in the running batch at most", to="scheduler", keys=("maxBatchSize",))
    max_num_batched_tokens: int | None = _arg(None, "tokens per engine step, decodes + prefill chunks (default: 512 on CPU; on a GPU 2048 served, 8192 offline; see config.default_step_tokens)", to="scheduler", keys=("maxPrefillTokens",))
    block_size: int = _arg(16, "tokens per KV-cache block (a power of two)", to="cache", keys=("cacheBlockSize",))
    kv_cache_memory_bytes: int | None = _arg(None, "KV-cache pool size in bytes (default: from free memory, see worker/kv_cache.py)", to="cache")
    num_kv_blocks: int | None = _arg(None, "KV blocks in the pool; overrides kv_cache_memory_bytes (tests use tiny pools)", to="cache.num_blocks")
    enable_prefix_caching: bool = _arg(True, "share full KV blocks between requests with the same prefix", to="cache", negative="no_prefix_caching")
    mm_cache_size: int = _arg(256, "vision-language models: MiB of vision-encoder outputs kept across requests, by image hash (0: off)", to="cache.mm_cache_mib", minimum=0)
    max_input_tokens: int | None = _arg(None, "prompt tokens per request at most (MindIE maxInputTokenLen)", to="engine", flags=("--max-input-token-len",), keys=("max_input_token_len", "maxInputTokenLen"))
    max_iter_times: int | None = _arg(None, "generated tokens per request at most (MindIE maxIterTimes)", to="engine", keys=("maxIterTimes",))
    cpu_fast_path: bool = _arg(True, "oneDNN-prepacked weights on CPU (off: plain F.linear, to compare)", to="model")
    attention_backend: str = _arg("auto", "auto (Triton on CUDA) | torch | triton", to="model", choices=("auto", "torch", "triton"))
    enforce_eager: bool = _arg(False, "no CUDA graphs: run every decode step eagerly", to="model")
    load_format: str = _arg("auto", "auto (the checkpoint's safetensors) | dummy (random weights of its shapes, benchmarks)", to="model", choices=("auto", "dummy"))
    distributed_executor_backend: str = _arg("auto", "where the model runs: uni (the engine's process: its thread, or on a GPU a runner thread) | mp (a worker process; the engine process never loads the model) | auto (mp for `inflight serve` on CUDA, else uni)", to="engine", choices=("auto", "uni", "mp"))
    async_scheduling: bool = _arg(True, "with a worker process (mp), or uni on a GPU (the runner on its own thread), schedule step N+1 while the runner runs step N; steps with beams or drafts still wait for the previous one", to="engine")
    num_scheduler_steps: int = _arg(1, "decode passes per engine step when every piece is a decode of a plain greedy request: the sampled token is fed back on the device, one host sync per N tokens (vLLM's multi-step scheduling; docs/MULTISTEP.md)", to="scheduler")
    enable_lora: bool = _arg(False, "serve LoRA adapters over the base weights (on by itself with --lora-modules)", to="engine")
    max_loras: int = _arg(4, "LoRA adapters resident at once (device slots); a step runs at most this many distinct adapters", to="scheduler")
    max_lora_rank: int = _arg(64, "largest LoRA rank accepted", to="engine")
    max_cpu_loras: int | None = _arg(None, "LoRA adapters kept in host memory, least recently used evicted (default: 4 x max_loras)", to="engine")
    tensor_parallel_size: int = _arg(1, "ranks sharding the model (one worker process each; gloo on CPU, nccl on CUDA), on all nodes together", to="parallel", keys=("tpSize",))
    nnodes: int = _arg(1, "nodes the tensor-parallel ranks span (node 0 runs the front end)", to="parallel")
    node_rank: int = _arg(0, "this node's index (0: the front end and ranks 0..; K > 0: only its ranks)", to="parallel", minimum=0)
    master_addr: str = _arg("127.0.0.1", "address every rank meets rank 0 at (node 0's)", to="parallel")
    master_port: int | None = _arg(None, "port of that meeting point (default: a free port; required with --nnodes > 1)", to="parallel")
    data_parallel_size: int = _arg(1, "engine replicas behind one server, each with its own KV cache and worker process(es); a router sends a request to the replica holding its longest cached prefix, else the least loaded (inflight serve only)", to="parallel")
    speculative_config: dict[str, Any] | str | None = _arg(None, 'speculative decoding, a JSON object (vLLM\'s): {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 4, "disable_by_batch_size": 4}, or {"method": "draft_model" | "eagle" | "eagle3", "model": PATH, "num_speculative_tokens": K}; see docs/SPECULATIVE_DECODING.md', to=None)
    collective_timeout_s: float = _arg(120.0, "seconds a tensor-parallel collective may wait before the engine is declared dead (a hung or lost rank)", to="parallel")

    def __post_init__(self) -> None:
        for f in fields(self):
            choices = f.metadata["choices"]
            value = getattr(self, f.name)
            if choices and value not in choices and not (value is None and f.default is None):
                raise ValueError(f"{f.name}: {getattr(self, f.name)!r}; use {' | '.join(choices)}")
        for f in fields(self):
            value = getattr(self, f.name)
            low = f.metadata["minimum"]
            if isinstance(value, int) and not isinstance(value, bool) and value < low:
                raise ValueError(f"{f.name}: must be at least {low}, got {value}")
        SpeculativeConfig.parse(self.speculative_config)  # a bad one stops here, before any load

    @property
    def model_path(self) -> str:
        return self.model or DEMO_MODEL

    # ------------------------------------------------------------ building the engine config
    def check(self) -> Checkpoint:
        """Every check of the engine config that needs no torch, from config.json (or the GGUF
        header) alone: the `inflight` CLI runs it before importing torch, and
        `create_engine_config` runs it first, so `LLM(...)` raises the same messages. Returns
        the checkpoint's config (the CLI checks LoRA adapters against it)."""
        return self._checked()[0]

    def _checked(self) -> tuple[Checkpoint, dict[str, dict[str, Any]], ParallelConfig]:
        parts: dict[str, dict[str, Any]] = {"model": {}, "cache": {}, "scheduler": {}, "engine": {}, "parallel": {}}
        for f in fields(self):
            if f.metadata["to"] is not None:
                section, _, name = f.metadata["to"].partition(".")
                parts[section][name or f.name] = getattr(self, f.name)
        check_device_and_dtype(self.device, self.dtype)
        ckpt = Checkpoint.read(self.model_path)
        parallel = ParallelConfig(**parts["parallel"])
        ckpt.check(self.quantization, self.load_format)
        max_len = ckpt.max_model_len(self.max_model_len)
        parallel.check_model(ckpt)
        ckpt.check_shards(parallel.tensor_parallel_size)
        CacheConfig(**parts["cache"])
        sched = parts["scheduler"]
        # never below max_num_seqs (every running decode needs a token); None: the device's default, later
        sched_cfg = SchedulerConfig(**{**sched, "max_num_batched_tokens": max(sched["max_num_batched_tokens"] or 0, sched["max_num_seqs"])})
        engine = parts["engine"]
        check_lora(engine["enable_lora"], engine["max_lora_rank"], engine["max_cpu_loras"], sched_cfg, parallel)
        spec = SpeculativeConfig.parse(self.speculative_config)
        if spec is not None:
            spec.check_draft(ckpt, max_len, parallel.tensor_parallel_size)
        if self.num_scheduler_steps > 1 and (spec is not None or parallel.tensor_parallel_size > 1):
            # drafts already bring several tokens a step; ranks > 0 learn each token from the next message
            raise ValueError("num_scheduler_steps: > 1 does not combine with speculative_config or tensor_parallel_size > 1")
        return ckpt, parts, parallel

    def create_engine_config(self) -> EngineConfig:
        """The validated config tree; reads the checkpoint's config.json (no weights)."""
        ckpt, parts, parallel = self._checked()
        m = parts["model"]
        model = ModelConfig.from_checkpoint(
            ckpt, m["dtype"], m["device"], ckpt.max_model_len(m["max_model_len"]), m["cpu_fast_path"],
            m["attention_backend"], m["enforce_eager"], m["load_format"], m["quantization"],
        )  # fmt: skip
        sched = parts["scheduler"]
        step = sched["max_num_batched_tokens"] or default_step_tokens(model.device)
        sched["max_num_batched_tokens"] = max(step, sched["max_num_seqs"])
        if parts["engine"]["distributed_executor_backend"] == "auto":  # `inflight serve` decides before this (serving_backend)
            parts["engine"]["distributed_executor_backend"] = "uni"
        return EngineConfig(
            model=model, cache=CacheConfig(**parts["cache"]), scheduler=SchedulerConfig(**sched),
            parallel=parallel, speculative=self._speculative(model), **parts["engine"],
        )  # fmt: skip

    def serving_backend(self, device_type: str) -> str:
        """The executor `inflight serve` runs on a `device_type` ("cpu" | "cuda") device: `auto` is
        `mp` on CUDA. Why: in one process the event loop (HTTP, JSON, SSE) and the forward share
        the GIL; every torch call releases it, and getting it back behind a busy event loop waits up
        to the 5 ms switch interval, while the GPU sits idle. In a worker process the forward holds
        its own GIL, and async scheduling sends step N+1 before step N's outputs are streamed (the
        H100's served / offline was 0.77 with `uni`, docs/GPU.md). CPU keeps `uni`: there the
        worker's OpenMP threads and the event loop share the same cores."""
        if self.distributed_executor_backend != "auto":
            return self.distributed_executor_backend
        return "mp" if device_type == "cuda" and self.tensor_parallel_size == 1 else "uni"

    def _speculative(self, model: ModelConfig) -> SpeculativeConfig | None:
        spec = SpeculativeConfig.parse(self.speculative_config)
        return resolve_draft(spec, model) if spec is not None else None

    def for_offline(self) -> EngineArgs:
        """These arguments for a batch run (`LLM`, `inflight generate`, `inflight bench offline`):
        on a GPU with no max_num_batched_tokens given, the batch runs' larger step
        (config.default_step_tokens)."""
        try:
            device = resolve_device(self.device)
        except (RuntimeError, ValueError):  # not a device: create_engine_config says so, as the CLI does
            return self
        if self.max_num_batched_tokens is not None or device.type == "cpu":
            return self
        return replace(self, max_num_batched_tokens=default_step_tokens(device, offline=True))

    # ------------------------------------------------------------ keywords (LLM, from_args)
    @classmethod
    def from_kwargs(cls, model: str | None = None, caller: str = "LLM", **kwargs: Any) -> EngineArgs:
        """EngineArgs from keyword arguments; an unknown one is a TypeError that names it."""
        names = [f.name for f in fields(cls)]
        for key in kwargs:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise TypeError(f"{caller}: unknown engine argument {key!r}{hint}; engine arguments: {', '.join(names)}")
        return cls(model=model, **kwargs)

    # ------------------------------------------------------------ command line
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """One flag per field (`max_num_seqs` -> `--max-num-seqs`) plus the older spellings.

        Flags default to None ("not given"): `from_cli_args` fills in the field defaults, and
        `inflight serve` lets a given flag win over its config file.
        """
        hints = get_type_hints(cls)
        for f in fields(cls):
            meta = f.metadata
            flag = "--" + f.name.replace("_", "-")
            shown = "" if f.default is None else f" (default: {f.default})"
            if hints[f.name] is bool:
                parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=meta["help"] + shown)
                if meta["negative"]:
                    parser.add_argument("--" + meta["negative"].replace("_", "-"), dest=f.name, action="store_false", default=None, help=f"same as --no-{flag[2:]}")
                continue
            kind = next(t for t in (int, float, str) if t is hints[f.name] or t in get_args(hints[f.name]))
            choices = list(meta["choices"]) if meta["choices"] else None
            parser.add_argument(flag, *meta["flags"], dest=f.name, type=kind, default=None, choices=choices, help=meta["help"] + shown)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """The flags that were given, field defaults for the rest."""
        return cls(**cls.given_cli_args(args))

    @classmethod
    def given_cli_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """Field name -> value of the engine flags given on the command line."""
        return {f.name: v for f in fields(cls) if (v := getattr(args, f.name, None)) is not None}

    # ------------------------------------------------------------ config file
    @classmethod
    def config_keys(cls) -> dict[str, tuple[str, bool]]:
        """Config-file key -> (field, inverted): the field names, older names and MindIE's."""
        out: dict[str, tuple[str, bool]] = {}
        for f in fields(cls):
            out[f.name] = (f.name, False)
            out.update({k: (f.name, False) for k in f.metadata["keys"]})
            if f.metadata["negative"]:
                out[f.metadata["negative"]] = (f.name, True)
        return out
