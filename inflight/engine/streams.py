"""The requests an `AsyncEngine` has registered: each one's caller loop and output queue, and
what it holds of the queue limit (engine/admission.py). Read and written from any thread (the
event loop registers, the engine thread delivers, the garbage collector drops), always under one
reentrant lock: a `RequestStream` dropped by the collector unregisters from any frame."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from inflight.engine.admission import Admission, Ticket
from inflight.engine.client import EngineRequest
from inflight.engine.input_processor import width_field
from inflight.outputs import RequestOutput
from inflight.request import Request
from inflight.sampling_params import ParamError

Target = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[Any]"]  # the caller's loop, its queue of outputs


class Streams:
    def __init__(self) -> None:
        self.queues: dict[str, Target] = {}  # request id -> outputs, or the exception that ended it
        self.tickets: dict[str, Ticket] = {}  # what each registered request holds of the queue
        self.serials: dict[str, int] = {}  # request id -> the registered Request's serial
        self.admission = Admission()  # under lock
        self.lock = threading.RLock()
        self.dropped: collections.deque[tuple[str, bool]] = collections.deque()  # collected unclosed: (id, abort)

    def __len__(self) -> int:
        return len(self.queues)

    def register(self, requests: Sequence[EngineRequest], queue_limit: int | None, field: str) -> list[asyncio.Queue[Any]]:
        """Queues for `requests`, all or none: a duplicate id is a ParamError, admission's refusals
        (QueueFullError, DeadlineError, a ParamError naming `field`) are raised as they are."""
        loop = asyncio.get_running_loop()
        ids = [r.request_id for r in requests]
        tickets = [_ticket(r) for r in requests]
        now = time.perf_counter()
        with self.lock:
            taken = [rid for rid in ids if rid in self.queues] or ([] if len(set(ids)) == len(ids) else ids)
            if taken:
                raise ParamError(f"request_id: {taken[0]!r} is already in use", "request_id")
            field = field if len(requests) > 1 else width_field(requests[0].params)
            self.admission.admit(tickets, [r.deadline - now for r in requests], queue_limit, field)
            queues = []
            for r, rid, ticket in zip(requests, ids, tickets):
                q: asyncio.Queue[Any] = asyncio.Queue()
                self.queues[rid] = (loop, q)
                self.serials[rid] = r.serial
                self.tickets[rid] = ticket
                queues.append(q)
        return queues

    def unregister(self, request_id: str) -> None:
        with self.lock:
            self.queues.pop(request_id, None)
            self.serials.pop(request_id, None)
            ticket = self.tickets.pop(request_id, None)
            if ticket is not None:
                self.admission.release(ticket)

    @contextlib.contextmanager
    def hold(self, sequences: int, queue_limit: int | None, field: str) -> Iterator[None]:
        ticket = Ticket(sequences=sequences, priority=5, pending_tokens=0)
        with self.lock:
            self.admission.admit([ticket], [float("inf")], queue_limit, field)
        try:
            yield
        finally:
            with self.lock:
                self.admission.release(ticket)

    def ids(self) -> list[str]:
        with self.lock:
            return list(self.queues)

    def get(self, request_id: str) -> Target | None:
        with self.lock:
            return self.queues.get(request_id)

    def observe_step(self, tokens: int, seconds: float) -> None:
        with self.lock:
            self.admission.observe_step(tokens, seconds)

    def deliver(self, outputs: list[RequestOutput]) -> None:
        """Each output to its request's queue (a request no longer registered gets nothing): one
        call_soon_threadsafe per event loop per step, not per output. Each call writes the loop's
        wake-up pipe and takes the GIL from the engine thread; at 64 streams that was 64 wake-ups
        a step (benchmarks/served_overhead.py). An output of an earlier request under the same id
        (an aborted one whose end came a step late: async scheduling) goes nowhere."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], RequestOutput]]] = {}
        with self.lock:
            for o in outputs:
                target = self.queues.get(o.request_id)
                if target is not None and o.serial >= 0 and self.serials.get(o.request_id) != o.serial:
                    continue
                if target is not None:
                    by_loop.setdefault(target[0], []).append((target[1], o))
                ticket = self.tickets.get(o.request_id)
                if ticket is not None and ticket.pending_tokens:  # its prompt is done: no longer ahead of later arrivals
                    self.admission.started(ticket)
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)

    def fail_all(self, error: BaseException) -> None:
        with self.lock:
            targets = list(self.queues.values())
        for loop, q in targets:
            loop.call_soon_threadsafe(q.put_nowait, error)


def _put_all(items: list[tuple[asyncio.Queue[Any], RequestOutput]]) -> None:
    for q, out in items:
        q.put_nowait(out)


def _ticket(request: Request) -> Ticket:
    p = request.params
    return Ticket(
        sequences=p.num_beams if p.is_beam_search else p.num_sequences,
        priority=request.priority,
        pending_tokens=request.num_prompt_tokens,
    )
