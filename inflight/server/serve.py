"""Running the server process: start-up checks before any weight loads, uvicorn with our
connection limits, and the SIGTERM drain.

Drain (first SIGTERM or SIGINT): `/health/ready` turns 503 and every new request gets 503 +
`Retry-After` at once (the port stays open so that load balancers see both); requests in flight
run on until they finish or `shutdown_timeout` passes; then the rest are aborted (streams end
with a final event, finish reason `abort`), and the process exits 0. A second signal exits at
once (status 1).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
import ssl
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from inflight.server.config import ServerConfig
from inflight.server.connection import protocol_class

if TYPE_CHECKING:  # the start-up checks run before torch is imported (`inflight serve` reports them in < 1 s)
    from inflight.engine.client import EngineClient
    from inflight.server.context import Lifecycle

logger = logging.getLogger(__name__)

_AFTER_ABORT_S = 5.0  # aborted requests end within a step; then uvicorn's own close gets this long


class StartupError(Exception):
    """A problem found before loading the model: `inflight serve` prints it on one line, exits 2."""


def uvicorn_config(app: Any, cfg: ServerConfig, host: str = "127.0.0.1", port: int = 0, **kw: Any) -> uvicorn.Config:
    """uvicorn settings for our app: the connection protocol with `cfg.limits`."""
    return uvicorn.Config(
        app, host=host, port=port, http=protocol_class(cfg.limits), timeout_keep_alive=int(max(1, cfg.limits.keep_alive_s)),
        timeout_graceful_shutdown=int(_AFTER_ABORT_S), **kw,
    )  # fmt: skip


# ------------------------------------------------------------------ start-up checks
def check_files(model_path: str, device: str, tls: dict[str, str | None], chat_template: str | None, api_key_file: str | None) -> None:
    """Everything a user can get wrong that would otherwise surface after the weights loaded."""
    model = Path(model_path)
    if model.suffix == ".gguf":  # llama.cpp's file (or the first shard of a split one)
        if not model.is_file():
            raise StartupError(f"model: {model_path} does not exist (a .gguf file or a Hugging Face checkpoint directory is expected)")  # the reader checks its contents at load
    elif not model.is_dir():
        raise StartupError(f"model: {model_path} is not a directory (a Hugging Face checkpoint directory is expected)")
    elif not (model / "config.json").is_file():
        raise StartupError(f"model: {model_path} has no config.json (not a Hugging Face checkpoint directory)")
    if device.startswith("cuda"):
        from inflight.config import check_device_and_dtype

        try:  # no GPU driver at all: said before torch loads
            check_device_and_dtype(device, "auto")
        except ValueError as e:
            raise StartupError(str(e)) from None
        import torch

        if not torch.cuda.is_available():
            raise StartupError(f"device: {device} requested but CUDA is not available (torch {torch.__version__})")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise StartupError(f"device: {device} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    for what, path in (("chat_template", chat_template), ("api_key_file", api_key_file)):
        if path is not None and not Path(path).is_file():
            raise StartupError(f"{what}: {path} does not exist")
    _check_tls(tls.get("ssl_certfile"), tls.get("ssl_keyfile"), tls.get("ssl_ca_certs"))


def check_engine_config(args: Any) -> Any:
    """The engine config's own checks (`EngineArgs.check`: block_size a power of two, the length,
    tensor-parallel shape and quantization against config.json or the GGUF header, a draft model's
    vocabulary, ...), before torch is imported; `LLM(...)` raises the same messages."""
    try:
        return args.check()  # the Checkpoint
    except (ValueError, TypeError, OSError) as e:
        raise StartupError(f"config: {e}") from e


def check_lora_modules(modules: list[tuple[str, str]], hf_config: dict[str, Any], max_rank: int) -> None:
    """Each `--lora-modules` adapter's config and tensor headers against the model (its rank,
    layers and projection sizes; lora/adapter.py `check_peft`), before the model loads."""
    from inflight.lora.adapter import LoRAShapes, check_peft
    from inflight.sampling_params import ParamError

    for name, path in modules:
        try:
            check_peft(path, LoRAShapes.from_hf(hf_config), max_rank, f"lora_modules: {name}={path}")
        except ParamError as e:
            raise StartupError(str(e)) from e


def _check_tls(cert: str | None, key: str | None, ca: str | None) -> None:
    if cert is None:
        for what, path in (("ssl_keyfile", key), ("ssl_ca_certs", ca)):
            if path is not None:
                raise StartupError(f"{what}: given without --ssl-certfile")
        return
    for what, path in (("ssl_certfile", cert), ("ssl_keyfile", key), ("ssl_ca_certs", ca)):
        if path is not None and not Path(path).is_file():
            raise StartupError(f"{what}: {path} does not exist")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        raise StartupError(f"ssl_certfile / ssl_keyfile: {cert}{' + ' + key if key else ''} is not a usable certificate and key ({e})") from e
    if ca is not None:
        try:
            ctx.load_verify_locations(ca)
        except (ssl.SSLError, OSError) as e:
            raise StartupError(f"ssl_ca_certs: {ca} is not a usable CA bundle ({e})") from e


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now (before the model loads): a port in use fails in a second."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = "is already in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
        raise StartupError(f"port: {host}:{port} {why}") from e
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


# ------------------------------------------------------------------ drain
class DrainingServer(uvicorn.Server):
    """uvicorn's server with our signal handling: drain with a deadline, a second signal exits."""

    def __init__(self, config: uvicorn.Config, engine: EngineClient, life: Lifecycle, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.engine, self.life, self.shutdown_timeout = engine, life, shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # runs in the main (event-loop) thread between two bytecodes: only schedule work here
        if self.life.draining or self.should_exit:
            logger.warning("second %s: exiting now", signal.Signals(sig).name)
            logging.shutdown()
            os._exit(1)
        self.life.draining = True  # at once: the next request already sees it
        if self._loop is None:  # not serving yet
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_drain, signal.Signals(sig).name)

    def _start_drain(self, name: str) -> None:
        self._drain_task = asyncio.ensure_future(self._drain(name))

    async def _drain(self, name: str) -> None:
        live = self.engine.num_unfinished
        logger.info("%s: draining (%d requests in flight, up to %g s; new requests get 503)", name, live, self.shutdown_timeout)
        deadline = time.monotonic() + self.shutdown_timeout
        while self._busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.engine.num_unfinished:
            n = self.engine.abort_all()
            logger.warning("drain deadline (%g s): aborted %d requests", self.shutdown_timeout, n)
            end = time.monotonic() + _AFTER_ABORT_S
            while self._busy() and time.monotonic() < end:
                await asyncio.sleep(0.05)
        logger.info("drained: shutting down")
        self.should_exit = True

    def _busy(self) -> bool:
        return self.engine.num_unfinished > 0 or bool(self.server_state.tasks)


def serve(app: Any, engine: EngineClient, cfg: ServerConfig, sock: socket.socket, **uvicorn_kw: Any) -> None:
    """Serve on the bound socket until drained; returns for a clean exit (status 0)."""
    config = uvicorn_config(app, cfg, **uvicorn_kw)
    server = DrainingServer(config, engine, app.state.lifecycle, cfg.shutdown_timeout)
    server.run(sockets=[sock])
