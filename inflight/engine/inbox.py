"""The messages callers hand the engine thread (engine/async_engine.py) over its inbox, a
thread-safe queue drained between steps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inflight.engine.client import EngineDeadError
from inflight.request import Request


@dataclass(frozen=True)
class AddRequest:
    request: Request  # built and validated by make_request; its stream is registered


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class CallFn:
    """Run `fn(*args)` between two steps; settle `future` on `loop` with its result."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


@dataclass(frozen=True)
class Shutdown:
    pass


InboxMessage = AddRequest | AbortRequest | CallFn | Shutdown


def run_call(msg: CallFn) -> None:
    """On the engine thread: run the call, then settle its future on the caller's loop."""
    fut = msg.future

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():  # the caller may have been cancelled meanwhile
            fut.set_result(value) if ok else fut.set_exception(value)

    try:
        result, ok = msg.fn(*msg.args), True
    except Exception as e:
        result, ok = e, False
    except BaseException as e:  # it ends the engine loop: the caller hears so, then the loop dies
        msg.loop.call_soon_threadsafe(settle, False, EngineDeadError(f"engine: not running ({type(e).__name__}: {e})"))
        raise
    msg.loop.call_soon_threadsafe(settle, ok, result)
