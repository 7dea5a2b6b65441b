"""The engine core in its own process (`inflight serve --engine-process`): vLLM v1's split.

    server process   HTTP event loop, input threads (tokenizing, chat templates, grammars), the
                     registered streams and admission (engine/streams.py): `CoreEngine`
    core process     `python -m inflight.engine.core_process FD LOGLEVEL`: the `LLMEngine`
                     (scheduler, detokenizer, stop strings, outputs; the model in its thread, or in
                     a worker process of its own with `mp`) stepped by an `EngineThread` as in-process

Why: in one process the event loop and the engine thread share the GIL; every torch call and
every socket write releases it, and winning it back from a busy thread waits up to the 5 ms
switch interval (docs/SERVING.md). Here each side holds its own.

The wire (a socket pair, pickled tuples; `Request` and `RequestOutput` pickle as they are):
front -> core: ("build", EngineArgs) once, then ("add", Request) | ("abort", id) | ("stop",);
core -> front: ("ready", EngineConfig, num_kv_blocks) | ("error", message) once, then per step
("out", outputs, StatsSnapshot, tokens, seconds) (outputs: what grew, engine/core_wire.py), ("failed", id, exception) for a request the
engine refused, ("dead", reason). A core that dies (EOF) ends every stream with EngineDeadError
and /health answers 503. Not yet across the boundary: LoRA adapters (refused at start) and
`AsyncEngine.call` runs its function on a thread of the server process (the embedding encoder).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from inflight.engine.args import EngineArgs
from inflight.engine.async_engine import AsyncEngine
from inflight.engine.client import EngineDeadError, StatsSnapshot
from inflight.engine.core_wire import Decoder, Encoder
from inflight.engine.inbox import AbortRequest, AddRequest, CallFn, Shutdown, run_call
from inflight.engine.input_processor import InputProcessor
from inflight.engine.streams import Streams
from inflight.engine.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- the core's side
class _CoreStreams:
    """What `EngineThread` hands its outputs to, in the core: the front, over the socket."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.lock = conn, threading.Lock()
        self.dropped: list[tuple[str, bool]] = []  # the front unregisters its own streams
        self.et: Any = None
        self.step: tuple[int, float] = (0, 0.0)
        self.encoder = Encoder()  # outputs cross as what grew (engine/core_wire.py)

    def send(self, msg: tuple[Any, ...]) -> None:
        with self.lock:
            self.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    def get(self, request_id: str) -> tuple[Any, Any]:  # EngineThread.add reports a refusal to it
        return self, _Refusal(self, request_id)

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        fn(*args)

    def unregister(self, request_id: str) -> None:
        pass

    def observe_step(self, tokens: int, seconds: float) -> None:
        self.step = (tokens, seconds)

    def deliver(self, outputs: list[Any]) -> None:
        self.send(("out", [self.encoder.encode(o) for o in outputs], self.et.stats, *self.step))
        self.step = (0, 0.0)

    def fail_all(self, error: BaseException) -> None:
        self.send(("dead", str(error)))


@dataclasses.dataclass
class _Refusal:
    streams: _CoreStreams
    request_id: str

    def put_nowait(self, error: BaseException) -> None:
        self.streams.send(("failed", self.request_id, error))


def core_main(conn: Connection) -> None:
    from inflight.engine.engine_thread import EngineThread
    from inflight.engine.llm_engine import LLMEngine

    _, args = pickle.loads(conn.recv_bytes())
    streams = _CoreStreams(conn)
    try:
        engine = LLMEngine.from_engine_args(args)
    except BaseException as e:  # the front raises it as the start-up error
        streams.send(("error", f"{type(e).__name__}: {e}"))
        return
    streams.send(("ready", engine.config, engine.inputs.num_kv_blocks))
    et = EngineThread(engine, streams)  # type: ignore[arg-type]
    streams.et = et

    def read() -> None:  # messages as they arrive, into the step loop's inbox
        while True:
            try:
                msg = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                msg = ("stop",)
            if msg[0] == "add":
                et.inbox.put(AddRequest(msg[1]))
            elif msg[0] == "abort":
                et.inbox.put(AbortRequest(msg[1]))
            else:
                et.stop.set()
                et.inbox.put(Shutdown())
                return

    threading.Thread(target=read, name="inflight-core-inbox", daemon=True).start()
    et.run()
    engine.shutdown()


# ---------------------------------------------------------------------------- the front's side
class _FrontEngine:
    """What `AsyncEngine` reads of its `LLMEngine`, in the server process: the config the core
    built, tokenizing and validation (InputProcessor), grammars; no scheduler, no model."""

    def __init__(self, config: Any, num_kv_blocks: int, tokenizer: Any, link: _CoreLink) -> None:
        self.config, self.tokenizer, self.link = config, tokenizer, link
        self.inputs = InputProcessor(config, tokenizer)
        self.inputs.num_kv_blocks = num_kv_blocks
        self.adapters = _NoAdapters()

    @property
    def max_model_len(self) -> int:
        return int(self.config.model.max_model_len)

    def make_request(self, prompt: Any, params: Any = None, **options: Any) -> Any:
        return self.inputs.make_request(prompt, params, **options)

    def compile_grammar(self, request: Any) -> None:
        self.inputs.compile_grammar(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.link.streams.queues)

    def shutdown(self) -> None:
        self.link.close()


class _NoAdapters:
    registry = None

    def listed(self) -> list[tuple[str, str]]:
        return []

    def load(self, name: str, path: str) -> None:
        from inflight.sampling_params import ParamError

        raise ParamError("lora: adapters are not served with --engine-process", "lora_name")

    unload = load


class _CoreLink:
    """The `EngineThread` of a `CoreEngine`: its inbox sends to the core, its loop (`run`, the
    receiving thread) delivers the core's outputs to the streams and keeps the stats snapshot."""

    def __init__(self, conn: Connection, proc: subprocess.Popen[bytes]) -> None:
        self.conn, self.proc = conn, proc
        self.streams: Streams = Streams()  # CoreEngine hands it its own
        self.inbox = self  # put(msg): AsyncEngine's messages go over the socket
        self.stop = threading.Event()
        self.stats = StatsSnapshot()
        self.errored: BaseException | None = None
        self.observers: list[Any] = []
        self.last_step_s = 0.0
        self.send_lock = threading.Lock()
        self.calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inflight-front-torch")
        self.decoder = Decoder()

    def send(self, msg: tuple[Any, ...]) -> None:
        try:
            with self.send_lock:
                self.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # the core is gone: `run` sees EOF and ends the streams
            pass

    def put(self, msg: Any) -> None:
        if isinstance(msg, AddRequest):
            self.send(("add", msg.request))
        elif isinstance(msg, AbortRequest):
            self.send(("abort", msg.request_id))
        elif isinstance(msg, CallFn):  # no engine state here: the server process's torch thread
            self.calls.submit(run_call, msg)
        elif isinstance(msg, Shutdown):
            self.send(("stop",))

    def unregister(self, request_id: str, abort: bool) -> None:
        self.streams.unregister(request_id)
        if abort:
            self.send(("abort", request_id))

    def run(self) -> None:
        while True:
            while self.streams.dropped:
                self.unregister(*self.streams.dropped.popleft())
            try:
                msg = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                code = self.proc.poll() if self.stop.is_set() else self.proc.wait()
                return self.die(f"engine process exited (code {code})")
            if msg[0] == "out":
                _, wire, self.stats, tokens, seconds = msg
                outputs = [self.decoder.decode(x) for x in wire]
                if seconds:
                    self.last_step_s = seconds
                    self.streams.observe_step(tokens, seconds)
                for fn in self.observers:
                    for out in outputs:
                        try:
                            fn(out)
                        except Exception:  # an observer must never stop the delivery
                            logger.exception("output observer failed")
                self.streams.deliver(outputs)
            elif msg[0] == "failed":
                target = self.streams.get(msg[1])
                if target is not None:
                    target[0].call_soon_threadsafe(target[1].put_nowait, msg[2])
            elif msg[0] == "dead":
                return self.die(msg[1])

    def die(self, reason: str) -> None:
        self.stats = dataclasses.replace(self.stats, dead=reason)
        self.streams.fail_all(EngineDeadError(f"engine: not running ({reason})"))

    def close(self) -> None:
        self.stop.set()
        self.send(("stop",))
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.calls.shutdown(wait=False)


class CoreEngine(AsyncEngine):
    """An `AsyncEngine` whose engine runs in a core process (`launch_core`); same `EngineClient`."""

    def _step_loop(self, engine: Any) -> Any:
        link: _CoreLink = engine.link
        link.streams = self.streams
        return link

    @classmethod
    def launch_core(cls, args: EngineArgs, chat_template: str | None = None) -> CoreEngine:
        """Start the core process, build its engine there (its error is raised here), and the
        front here: the tokenizer and the checks of `make_request`."""
        if args.enable_lora or args.data_parallel_size > 1:
            raise ValueError("--engine-process: not with LoRA adapters or data-parallel replicas yet")
        ours, theirs = socket.socketpair()
        level = str(logging.getLogger("inflight").getEffectiveLevel())
        proc = subprocess.Popen([sys.executable, "-m", "inflight.engine.core_process", str(theirs.fileno()), level],
                                pass_fds=[theirs.fileno()])  # fmt: skip
        theirs.close()
        conn = Connection(ours.detach())
        conn.send_bytes(pickle.dumps(("build", args)))
        try:
            reply = pickle.loads(conn.recv_bytes())
        except EOFError:
            reply = ("error", f"engine process exited (code {proc.wait()})")
        if reply[0] == "error":
            proc.wait()
            raise RuntimeError(f"engine process: {reply[1]}")
        tokenizer = load_tokenizer(args.tokenizer or args.model_path)
        if chat_template is not None and tokenizer is not None:
            tokenizer.chat_template = chat_template
        link = _CoreLink(conn, proc)
        self = cls(_FrontEngine(reply[1], reply[2], tokenizer, link))  # type: ignore[arg-type]
        self._thread = threading.Thread(target=link.run, name="inflight-core-link", daemon=True)
        self._thread.start()
        return self


if __name__ == "__main__":
    from inflight import memory

    memory.configure()  # before the model loads (oneDNN reads it at its first primitive)
    logging.basicConfig(format="%(levelname)s %(name)s (engine core): %(message)s")
    logging.getLogger("inflight").setLevel(int(sys.argv[2]))
    core_main(Connection(int(sys.argv[1])))
