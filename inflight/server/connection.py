"""HTTP connections with the limits a server on an open port needs.

uvicorn's httptools protocol (C parser: little CPU per streamed token) has a keep-alive timeout
between requests and nothing else: a connection that never sends, headers trickled a byte at a
time, a body that never ends or a megabyte of headers were all held without limit. This
subclass adds, per connection:

    idle       no request started within `keep_alive_s` of connecting or of the last
               response: closed (nothing to answer)
    head       request line + headers not complete `header_s` after their first byte: 408
    head size  more than `max_header_bytes` before the headers end: 431
    body       the body not complete `body_s` after the headers: 408 (or closed, when the
               app already answered, e.g. a 413 while the client was still uploading)
    count      more than `max_connections` open: 503 + Retry-After, closed at once

A body the app stops reading (413) is discarded as it arrives, never buffered, and the
connection stays usable once the upload ends (closing with unread data would make the
client's kernel drop our 413 on the RST).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from inflight.server.errors import error_bytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    keep_alive_s: float = 5.0  # as uvicorn's and vLLM's default
    header_s: float = 10.0  # a request line + headers are < 32 KiB: seconds even on a bad link
    body_s: float = 60.0  # 64 MiB (the body limit) at ~1 MB/s
    max_header_bytes: int = 32 << 10  # nginx's large_client_header_buffers: 4 x 8 KiB
    max_connections: int = 2048  # > the default --max-queue (1024) streams plus their pools' idle ones


def protocol_class(limits: ConnectionLimits) -> type[LimitedHttpProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` enforcing `limits`."""
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), {"limits": limits})


class LimitedHttpProtocol(HttpToolsProtocol):
    limits = ConnectionLimits()
    _last_refusal_log = 0.0  # class-wide: one warning per second at most under a connection flood

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keep_alive_s
        self._reading_head = True  # between requests and until a request's headers end
        self._head_bytes = 0  # raw bytes received while the head is incomplete
        self._head_size = 0  # the parsed request line + headers of the current request
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            now = time.monotonic()
            if now - LimitedHttpProtocol._last_refusal_log > 1.0:
                LimitedHttpProtocol._last_refusal_log = now
                logger.warning("refusing connections: %d open (--max-connections)", len(self.connections) - 1)
            self._answer(503, "the server has too many open connections; retry shortly", "too_many_connections", retry_after=True)
            return
        # uvicorn arms its keep-alive timer only after a response: a connection that never
        # sends anything would otherwise be held forever
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            if self._head_bytes == 0 and self._head_timer is None:
                self._head_timer = self.loop.call_later(self.limits.header_s, self._head_timeout)
            self._head_bytes += len(data)
        super().data_received(data)
        if self._reading_head and self._head_bytes > self.limits.max_header_bytes and not self.transport.is_closing():
            self._answer(431, f"request headers larger than {self.limits.max_header_bytes} bytes", "headers_too_large")

    # ------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        self._head_size = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._cancel(self._head_timer)
        self._head_timer = None
        self._body_timer = self.loop.call_later(self.limits.body_s, self._body_timeout)
        if self._head_size <= self.limits.max_header_bytes:
            super().on_headers_complete()
            return
        # a head over the limit that arrived in one read: its request gets the 431 instead of the app
        app, self.app = self.app, self._head_too_large
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    async def _head_too_large(self, scope: Any, receive: Any, send: Any) -> None:
        body = error_bytes(f"request headers larger than {self.limits.max_header_bytes} bytes", 431, "headers_too_large")
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 431, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def on_message_complete(self) -> None:
        self._cancel(self._body_timer)
        self._body_timer = None
        self._reading_head, self._head_bytes = True, 0
        super().on_message_complete()

    # ------------------------------------------------------------ timeouts
    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._reading_head and not self.transport.is_closing():
            self._answer(408, f"request headers not received within {self.limits.header_s:g} s", "header_timeout")

    def _body_timeout(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or self.transport.is_closing():
            return
        if not cycle.response_started:
            self._answer(408, f"request body not received within {self.limits.body_s:g} s", "body_timeout")
        # the app sees a disconnect (its receive() returns http.disconnect; its sends are dropped)
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    def _answer(self, status: int, message: str, code: str, retry_after: bool = False) -> None:
        """Answer outside any request cycle (our error body, `Connection: close`) and close."""
        if self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete:
            self._cancel_timers()  # a pipelined request went wrong while a response is under way:
            self.transport.close()  # nothing may be written into that response
            return
        body = error_bytes(message, status, code)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(), b"\r\nconnection: close\r\n"]
        if retry_after:
            head.append(b"retry-after: 1\r\n")
        self.transport.write(b"".join(head) + b"\r\n" + body)
        self._cancel_timers()
        if self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            self._cancel(timer)
        self._head_timer = self._body_timer = None
        self._unset_keepalive_if_required()

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()
