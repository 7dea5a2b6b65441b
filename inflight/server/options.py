"""`inflight serve` options: the engine's `EngineArgs` plus the server's own fields, behind the
JSON config file and the command line.

Engine options (names, defaults, help, older spellings, MindIE keys) live in
`inflight/engine/args.py` only; this module adds the server fields below. Each field's metadata
holds its help text; `add_arguments` turns the fields into flags (`max_queue` -> `--max-queue`)
and `load` reads a JSON file whose keys are option names or the MindIE names (engine keys from
`EngineArgs.config_keys`, server keys from `ALIASES`), also nested in sections. Flags given on
the command line win over the file.
"""

from __future__ import annotations

import argparse
import json
import types
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from inflight.engine.args import EngineArgs
from inflight.multimodal.media import MAX_MEDIA_ITEMS, MediaOptions, media_root_ok
from inflight.server import mindie_config
from inflight.server.config import ServerConfig
from inflight.server.connection import ConnectionLimits


def _opt(default: Any, help: str, **kw: Any) -> Any:  # noqa: A002 - argparse's name
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ServeOptions:
    engine: EngineArgs = field(default_factory=EngineArgs)  # every engine option (one set of defaults)
    served_model_name: list[str] | None = _opt(None, "model names clients may use; the first is reported", nargs="+")
    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8000, "port to listen on")
    api_key: list[str] | None = _opt(None, "accepted API keys (Bearer token or x-api-key)", nargs="+")
    api_key_file: str | None = _opt(None, "file with one accepted API key per line")
    no_auth_metrics: bool = _opt(False, "serve /metrics without an API key")
    ssl_certfile: str | None = _opt(None, "TLS certificate (PEM); enables HTTPS")
    ssl_keyfile: str | None = _opt(None, "TLS private key (PEM)")
    ssl_ca_certs: str | None = _opt(None, "CA bundle: require and verify client certificates (mutual TLS)")
    full_text_enabled: bool = _opt(False, "/v2 text_output carries the whole text so far")
    perf_extras: bool = _opt(False, "MindIE figures in responses: prefill_time, decode_time_arr, batch_size, queue_wait_time")
    max_logprobs: int = _opt(20, "most logprobs / top_logprobs / prompt_logprobs a request may ask (vLLM's); -1: no cap, so -1 (the whole vocabulary) is accepted")
    enable_per_request_metrics: bool = _opt(False, "chat / completions responses carry vLLM's per-request metrics object (ttft, generation, queue time, mean ITL, tokens/s; streams: in the usage chunk)")
    v2_stream_dialect: str = _opt("auto", "/v2 generate_stream event framing: auto (Triton / TensorRT-LLM bodies get Triton's 'data: {...}', MindIE bodies MindIE's 'data:{...}') | mindie | triton", choices=["auto", "mindie", "triton"])
    mindie_defaults: bool = _opt(False, "MindIE's defaults over OpenAI's: usage in every stream's final chunk, completions max_tokens up to max_iter_times (not 16)")
    max_queue: int = _opt(1024, "requests in flight before new ones get 429")
    max_body_bytes: int = _opt(64 << 20, "largest request body accepted (413 above)")
    timeout_keep_alive: float = _opt(5.0, "seconds an idle connection is kept open (before its first request and between requests)")
    timeout_header: float = _opt(10.0, "seconds a request's line and headers may take to arrive (408 after)")
    timeout_body: float = _opt(60.0, "seconds a request body may take to arrive after its headers (408 after)")
    max_header_bytes: int = _opt(32 << 10, "largest request line + headers accepted (431 above)")
    max_connections: int = _opt(2048, "open connections at most; more are answered 503 and closed")
    shutdown_timeout: float = _opt(30.0, "SIGTERM / SIGINT: seconds in-flight requests may run on before they are aborted (a second signal exits at once)")
    tool_call_parser: str | None = _opt(None, "tool-call format: hermes | llama3_json | mistral (default: detected from the chat template)", choices=["hermes", "llama3_json", "mistral"])
    reasoning_parser: str | None = _opt(None, "split thinking from the answer: qwen3 | deepseek_r1 | tags | none (default: detected from the chat template)", choices=["qwen3", "deepseek_r1", "tags", "none"])
    reasoning_start_token: str | None = _opt(None, "the tags reasoning parser: the token that opens thinking")
    reasoning_end_token: str | None = _opt(None, "the tags reasoning parser: the token that closes thinking")
    responses_store_size: int = _opt(1024, "/v1/responses stored for GET and previous_response_id (least recently used out; 0: store none)")
    responses_store_bytes: int = _opt(256 << 20, "bytes of stored /v1/responses at most (their JSON)")
    embedding_pooling: str | None = _opt(None, "serve /v1/embeddings from this model too: last | mean pooling, none: off (default: last for the bundled demo model, else off)", choices=["last", "mean", "none"])
    chat_template: str | None = _opt(None, "jinja chat template file overriding the tokenizer's")
    lora_modules: list[str] | None = _opt(None, "LoRA adapters to serve, name=path (PEFT directories); turns LoRA on", nargs="+")
    lora_root: str | None = _opt(None, "POST /v1/load_lora_adapter reads only directories under this one, symlinks resolved (default: only the --lora-modules directories)")
    allowed_local_media_path: str | None = _opt(None, "vision models: serve image / video files under this directory (file:// URLs or paths; off by default)")
    allow_remote_media: bool = _opt(False, "vision models: fetch http(s) image / video URLs")
    allowed_media_domains: list[str] | None = _opt(None, "with --allow-remote-media: fetch only from these hosts (the way to allow a private or loopback one; default: any public host)", nargs="+")
    media_fetch_timeout: float = _opt(10.0, "seconds to fetch one http(s) media URL")
    max_image_bytes: int = _opt(20 << 20, "largest image accepted, bytes (MindIE: 20 MB)")
    max_video_bytes: int = _opt(512 << 20, "largest video accepted, bytes (MindIE: 512 MB)")
    max_image_pixels: int = _opt(64 << 20, "largest decoded image (width x height)")
    max_pixels_per_request: int = _opt(64 << 20, "decoded pixels of all a request's images together, checked from their headers before decoding")
    max_images_per_request: int = _opt(20, "images per request at most (all media together: 20)")
    max_videos_per_request: int = _opt(4, "videos per request at most")
    video_fps: float = _opt(2.0, "frames sampled per second of video")
    video_max_frames: int = _opt(32, "frames sampled per video at most")
    log_level: str = _opt("info", "debug | info | warning | error")
    engine_process: bool = _opt(False, "run the engine (scheduler, outputs, the model) in a process of its own, apart from the HTTP event loop's GIL (engine/core_process.py; not yet with LoRA or data-parallel replicas)")


# MindIE config keys (camelCase) and older names -> server fields (engine keys: EngineArgs)
ALIASES = {
    "modelName": "served_model_name", "ipAddress": "host", "fullTextEnabled": "full_text_enabled", "mindieDefaults": "mindie_defaults",
    "maxQueueSize": "max_queue", "served_model_names": "served_model_name", "api_keys": "api_key",
    "loraModules": "lora_modules",
}  # fmt: skip


def _server_fields() -> list[Any]:
    return [f for f in fields(ServeOptions) if f.name != "engine"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="JSON config file (keys: the option names below, or MindIE's)")
    for f in _server_fields():
        flag = "--" + f.name.replace("_", "-")
        meta = dict(f.metadata)
        help_text = meta.pop("help")
        default = None if f.default is MISSING else f.default
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
            continue
        kind = int if "int" in str(f.type) else float if "float" in str(f.type) else str
        parser.add_argument(flag, type=kind, default=None, help=f"{help_text} (default: {default})", **meta)
    EngineArgs.add_cli_args(parser.add_argument_group("engine"))


class ConfigError(SystemExit):
    """A bad option or config value: `inflight serve` prints it on one line and exits 2."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def load(args: argparse.Namespace) -> ServeOptions:
    """Config file values, then the flags that were given; ConfigError names what is wrong."""
    engine: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if getattr(args, "config", None):
        engine, server = _read_config(Path(args.config))
    for f in _server_fields():
        v = getattr(args, f.name, None)
        if v is not None:
            server[f.name] = v
    engine |= EngineArgs.given_cli_args(args)
    for name in ("served_model_name", "api_key", "lora_modules", "allowed_media_domains"):
        if isinstance(server.get(name), str):
            server[name] = [server[name]]
    if isinstance(server.get("lora_modules"), dict):  # config file: {"name": "path", ...}
        server["lora_modules"] = [f"{k}={v}" for k, v in server["lora_modules"].items()]
    if server.get("lora_modules"):
        engine.setdefault("enable_lora", True)
    _check_types(EngineArgs, engine)
    _check_types(ServeOptions, server)
    try:
        opts = ServeOptions(engine=EngineArgs(**engine), **server)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config: {e}") from e
    lora_modules(opts)  # a malformed entry stops the start here
    if opts.tool_call_parser not in (None, "hermes", "llama3_json", "mistral"):
        raise ConfigError("tool_call_parser: must be hermes, llama3_json or mistral")
    if opts.reasoning_parser not in (None, "qwen3", "deepseek_r1", "tags", "none"):
        raise ConfigError("reasoning_parser: must be qwen3, deepseek_r1, tags or none")
    if (opts.reasoning_parser == "tags") != bool(opts.reasoning_start_token and opts.reasoning_end_token):
        raise ConfigError("reasoning_parser tags: takes --reasoning-start-token and --reasoning-end-token (and only it does)")
    if opts.embedding_pooling not in (None, "last", "mean", "none"):
        raise ConfigError('embedding_pooling: must be "last", "mean" or "none"')
    _check_ranges(opts)
    try:
        media_options(opts)
    except ValueError as e:
        raise ConfigError(f"config: {e}") from e
    return opts


_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _check_types(cls: type, values: dict[str, Any]) -> None:
    """A config-file value of the wrong JSON type is named here (not a TypeError deep in start-up)."""
    hints = get_type_hints(cls)
    for name, value in values.items():
        hint = hints.get(name)
        if hint is not None and not _fits(value, hint):
            wants = " or ".join(_kind(t) for t in get_args(hint) or (hint,) if t is not type(None))
            raise ConfigError(f"config: {name}: expected {wants}, got {json.dumps(value)}")


def _kind(hint: Any) -> str:
    if get_origin(hint) is list:
        return "a list of strings" if get_args(hint)[0] is str else "a list"
    return _KINDS.get(hint, str(hint))


def _fits(value: Any, hint: Any) -> bool:
    args = get_args(hint)
    if get_origin(hint) in (Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if get_origin(hint) is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if get_origin(hint) is dict:
        return isinstance(value, dict)
    return True


def _check_ranges(opts: ServeOptions) -> None:
    if not 0 <= opts.port <= 65535:
        raise ConfigError(f"port: {opts.port} is not a TCP port (0-65535)")
    if opts.responses_store_size < 0 or opts.responses_store_bytes < 0:
        raise ConfigError("responses_store_size / responses_store_bytes: must be 0 or more")
    for name in ("max_queue", "max_body_bytes", "max_header_bytes", "max_connections", "max_pixels_per_request"):
        if getattr(opts, name) < 1:
            raise ConfigError(f"{name}: must be at least 1, got {getattr(opts, name)}")
    for name in ("timeout_keep_alive", "timeout_header", "timeout_body"):
        if not getattr(opts, name) > 0:
            raise ConfigError(f"{name}: must be more than 0 seconds, got {getattr(opts, name)}")
    if opts.shutdown_timeout < 0:
        raise ConfigError(f"shutdown_timeout: must be 0 seconds or more, got {opts.shutdown_timeout}")


def server_config(opts: ServeOptions, names: tuple[str, ...]) -> ServerConfig:
    """The app's configuration from the options."""
    limits = ConnectionLimits(
        keep_alive_s=opts.timeout_keep_alive, header_s=opts.timeout_header, body_s=opts.timeout_body,
        max_header_bytes=opts.max_header_bytes, max_connections=opts.max_connections,
    )  # fmt: skip
    pooling = opts.embedding_pooling
    if pooling is None and opts.engine.model is None:
        pooling = "last"  # the bundled demo model shows every feature: decoder embeddings on
    return ServerConfig(
        served_model_names=names, full_text_enabled=opts.full_text_enabled, api_keys=api_keys(opts),
        auth_metrics=not opts.no_auth_metrics, max_body_bytes=opts.max_body_bytes, max_queue=opts.max_queue,
        perf_extras=opts.perf_extras, embedding_pooling=None if pooling == "none" else pooling, tool_call_parser=opts.tool_call_parser,
        limits=limits, shutdown_timeout=opts.shutdown_timeout, media=media_options(opts),
        mindie_defaults=opts.mindie_defaults, v2_stream_dialect=opts.v2_stream_dialect, per_request_metrics=opts.enable_per_request_metrics, max_logprobs=opts.max_logprobs, reasoning_parser=opts.reasoning_parser, lora_root=opts.lora_root,
        responses_store_size=opts.responses_store_size, responses_store_bytes=opts.responses_store_bytes,
        reasoning_tags=(opts.reasoning_start_token, opts.reasoning_end_token) if opts.reasoning_parser == "tags" else None,
    )  # fmt: skip


def media_options(opts: ServeOptions) -> MediaOptions:
    """Where images / videos may come from and their limits (server/media_fields.py)."""
    if not 1 <= opts.max_images_per_request <= MAX_MEDIA_ITEMS:
        raise ValueError(f"max_images_per_request: must be in [1, {MAX_MEDIA_ITEMS}]")
    if opts.video_fps <= 0 or opts.video_max_frames < 2 or opts.media_fetch_timeout <= 0:
        raise ValueError("video_fps and media_fetch_timeout must be > 0, video_max_frames >= 2")
    return MediaOptions(
        allowed_local_media_path=media_root_ok(opts.allowed_local_media_path),
        allow_remote_media=opts.allow_remote_media, media_fetch_timeout_s=float(opts.media_fetch_timeout),
        max_image_bytes=opts.max_image_bytes, max_video_bytes=opts.max_video_bytes,
        max_image_pixels=opts.max_image_pixels, max_images=opts.max_images_per_request,
        max_pixels_per_request=opts.max_pixels_per_request,
        allowed_media_domains=tuple(d.lower() for d in opts.allowed_media_domains or ()),
        max_videos=opts.max_videos_per_request, video_fps=float(opts.video_fps), video_max_frames=opts.video_max_frames,
    )  # fmt: skip


def _read_config(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(engine values, server values) from a JSON config file."""
    engine_keys = EngineArgs.config_keys()
    server_names = {f.name for f in _server_fields()}
    engine: dict[str, Any] = {}
    server: dict[str, Any] = {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"config: cannot read {path} ({e})") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"config: {path} must hold a JSON object")
    objects = {n for n, hint in get_type_hints(EngineArgs).items() if any(get_origin(a) is dict for a in get_args(hint))}
    objects |= {"lora_modules", "loraModules"}  # {"name": "path", ...}, as docs/SERVING.md documents
    others: dict[str, Any] = {}
    try:
        leaves = _flatten(raw, objects)
    except ValueError as e:
        raise ConfigError(f"config: {e}") from e
    for key, value in leaves.items():
        if key in engine_keys:
            name, inverted = engine_keys[key]
            engine[name] = (not value) if inverted else value
        elif ALIASES.get(key, key) in server_names:
            server[ALIASES.get(key, key)] = value
        else:
            others[key] = value
    try:  # MindIE's own keys: mapped, or ignored with one warning (mindie_config.py)
        mindie_engine, mindie_server, unknown = mindie_config.read(others, path.parent)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config: {e}") from e
    if unknown:
        raise ConfigError(f"config: unknown key {unknown[0]!r}")
    return mindie_engine | engine, mindie_server | server


def _flatten(raw: dict[str, Any], objects: set[str]) -> dict[str, Any]:
    """MindIE nests its keys in sections (ServerConfig, BackendConfig, ...): take the leaves;
    an option whose value is an object (`objects`: speculative_config) is a leaf."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if k == "ModelConfig" and isinstance(v, list):  # MindIE's list of models (one served here)
            out.update(_flatten(mindie_config.model_entries(v), objects))
        elif isinstance(v, dict) and k not in objects:
            out.update(_flatten(v, objects))
        else:
            out[k] = v
    return out


def lora_modules(opts: ServeOptions) -> list[tuple[str, str]]:
    """(name, path) of each `--lora-modules` entry: name=path, or vLLM's JSON {"name", "path"}."""
    out = []
    for entry in opts.lora_modules or []:
        if isinstance(entry, str) and entry.lstrip().startswith("{"):
            try:
                entry = json.loads(entry)
            except json.JSONDecodeError as e:
                raise ConfigError(f"lora_modules: {entry!r} is not valid JSON ({e})") from e
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("path"), str):
            out.append((entry["name"], entry["path"]))
        elif isinstance(entry, str) and "=" in entry and entry.split("=", 1)[0] and entry.split("=", 1)[1]:
            name, path = entry.split("=", 1)
            out.append((name, path))
        else:
            raise ConfigError(f"lora_modules: {entry!r}; use name=path or {{\"name\": ..., \"path\": ...}}")
    return out


def api_keys(opts: ServeOptions) -> tuple[str, ...]:
    keys = list(opts.api_key or [])
    if opts.api_key_file:
        keys += [line.strip() for line in Path(opts.api_key_file).read_text().splitlines() if line.strip()]
    return tuple(keys)
