"""`inflight serve` options: one dataclass behind the JSON config file and the command line.

Each field's metadata holds its help text; `add_arguments` turns the fields into flags
(`max_num_seqs` -> `--max-num-seqs`) and `load` reads a JSON file whose keys are the field
names or the MindIE names in `ALIASES`. Flags given on the command line win over the file.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any


def _opt(default: Any, help: str, **kw: Any) -> Any:  # noqa: A002 - argparse's name
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ServeOptions:
    model: str | None = _opt(None, "Hugging Face checkpoint directory (default: the bundled demo model)")
    served_model_name: list[str] | None = _opt(None, "model names clients may use; the first is reported", nargs="+")
    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8000, "port to listen on")
    api_key: list[str] | None = _opt(None, "accepted API keys (Bearer token or x-api-key)", nargs="+")
    api_key_file: str | None = _opt(None, "file with one accepted API key per line")
    no_auth_metrics: bool = _opt(False, "serve /metrics without an API key")
    ssl_certfile: str | None = _opt(None, "TLS certificate (PEM); enables HTTPS")
    ssl_keyfile: str | None = _opt(None, "TLS private key (PEM)")
    ssl_ca_certs: str | None = _opt(None, "CA bundle: require and verify client certificates (mutual TLS)")
    dtype: str = _opt("auto", "auto | float32 | bfloat16 | float16")
    device: str = _opt("auto", "auto | cpu | cuda")
    max_seq_len: int | None = _opt(None, "prompt + output tokens per request (max_model_len)")
    max_input_token_len: int | None = _opt(None, "prompt tokens per request at most")
    max_iter_times: int | None = _opt(None, "generated tokens per request at most")
    max_num_seqs: int = _opt(64, "requests in the running batch at most")
    max_num_batched_tokens: int | None = _opt(None, "tokens per engine step (decodes + prefill chunks; default 512 on CPU, 2048 on GPU)")
    block_size: int = _opt(16, "tokens per KV-cache block")
    kv_cache_memory_bytes: int | None = _opt(None, "KV-cache pool size in bytes (default: from free memory)")
    no_prefix_caching: bool = _opt(False, "disable prefix caching")
    attention_backend: str = _opt("auto", "auto (Triton on CUDA) | torch | triton", choices=["auto", "torch", "triton"])
    enforce_eager: bool = _opt(False, "no CUDA graphs: run every decode step eagerly")
    load_format: str = _opt("auto", "auto (the checkpoint's safetensors) | dummy (random weights of its shapes, benchmarks)", choices=["auto", "dummy"])
    tensor_parallel_size: int = _opt(1, "devices per model (only 1 is supported)")
    full_text_enabled: bool = _opt(False, "/v2 text_output carries the whole text so far")
    perf_extras: bool = _opt(False, "MindIE figures in responses: prefill_time, decode_time_arr, batch_size, queue_wait_time")
    max_queue: int = _opt(1024, "requests in flight before new ones get 429")
    max_body_bytes: int = _opt(64 << 20, "largest request body accepted (413 above)")
    tool_call_parser: str | None = _opt(None, "tool-call format: hermes | llama3_json | mistral (default: detected from the chat template)", choices=["hermes", "llama3_json", "mistral"])
    embedding_pooling: str | None = _opt(None, "serve /v1/embeddings from this model too: last | mean pooling", choices=["last", "mean"])
    chat_template: str | None = _opt(None, "jinja chat template file overriding the tokenizer's")
    log_level: str = _opt("info", "debug | info | warning | error")


# MindIE config keys (camelCase) -> our fields
ALIASES = {
    "modelWeightPath": "model", "modelName": "served_model_name", "ipAddress": "host",
    "maxSeqLen": "max_seq_len", "maxInputTokenLen": "max_input_token_len", "maxIterTimes": "max_iter_times",
    "maxBatchSize": "max_num_seqs", "maxPrefillTokens": "max_num_batched_tokens", "cacheBlockSize": "block_size",
    "fullTextEnabled": "full_text_enabled", "maxQueueSize": "max_queue", "tpSize": "tensor_parallel_size",
    "served_model_names": "served_model_name", "api_keys": "api_key",
}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="JSON config file (keys: the option names below, or MindIE's)")
    for f in fields(ServeOptions):
        flag = "--" + f.name.replace("_", "-")
        meta = dict(f.metadata)
        help_text = meta.pop("help")
        default = None if f.default is MISSING else f.default
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
            continue
        kind = int if "int" in str(f.type) else str
        parser.add_argument(flag, type=kind, default=None, help=f"{help_text} (default: {default})", **meta)


def load(args: argparse.Namespace) -> ServeOptions:
    """Config file values, then the flags that were given."""
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        raw = json.loads(Path(args.config).read_text())
        flat = _flatten(raw)
        names = {f.name for f in fields(ServeOptions)}
        for key, value in flat.items():
            name = ALIASES.get(key, key)
            if name not in names:
                raise SystemExit(f"config: unknown key {key!r}")
            values[name] = value
    for f in fields(ServeOptions):
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    if isinstance(values.get("served_model_name"), str):
        values["served_model_name"] = [values["served_model_name"]]
    if isinstance(values.get("api_key"), str):
        values["api_key"] = [values["api_key"]]
    opts = ServeOptions(**values)
    if opts.tensor_parallel_size != 1:
        raise SystemExit("tensor_parallel_size: only 1 is supported in this release")
    if opts.tool_call_parser not in (None, "hermes", "llama3_json", "mistral"):
        raise SystemExit("tool_call_parser: must be hermes, llama3_json or mistral")
    if opts.embedding_pooling not in (None, "last", "mean"):
        raise SystemExit('embedding_pooling: must be "last" or "mean"')
    return opts


def _flatten(raw: dict[str, Any]) -> dict[str, Any]:
    """MindIE nests its keys in sections (ServerConfig, BackendConfig, ...): take the leaves."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if isinstance(v, dict):
            out.update(_flatten(v))
        else:
            out[k] = v
    return out


def api_keys(opts: ServeOptions) -> tuple[str, ...]:
    keys = list(opts.api_key or [])
    if opts.api_key_file:
        keys += [line.strip() for line in Path(opts.api_key_file).read_text().splitlines() if line.strip()]
    return tuple(keys)
