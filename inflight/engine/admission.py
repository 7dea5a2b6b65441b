"""Admission control for the engine client: the queue limit and deadline-aware admission.

Both are decided when a request is registered, atomically with the registration (under the
client's lock), so simultaneous arrivals can't all pass a check that only one of them fits.

- Queue limit: counted in engine sequences (an n = 8 request is 8, a 4-wide beam search 4,
  a 40-prompt completions body 40 x n), not HTTP requests.
- Deadline: a request whose first token can't come before its `timeout` is refused now rather
  than queued to expire. The wait is estimated as (prompt tokens registered ahead of it, at
  its priority or better, that have not produced a first token yet + its own) / the engine's
  measured prefill rate (tokens per second of steps that ran at least `_MIN_RATE_TOKENS`). No
  estimate before the first such step. Decoding time is not counted: `max_tokens` is a bound,
  not a forecast, so only what must happen before any output can be promised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inflight.errors import ParamError

_MIN_RATE_TOKENS = 32  # steps smaller than this measure per-step overhead, not prefill speed
_RATE_SMOOTHING = 0.2  # weight of the newest step in the moving average


class QueueFullError(RuntimeError):
    """The queue limit would be exceeded (HTTP 429 + Retry-After)."""

    reason = "queue_full"

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineError(QueueFullError):
    """The request's timeout would pass before its first token (HTTP 503 + Retry-After)."""

    reason = "deadline"


@dataclass
class Ticket:
    """What one registered request holds: its sequences and its not-yet-prefilled tokens."""

    sequences: int
    priority: int
    pending_tokens: int


class Admission:
    """Counts held by registered requests; the engine client calls it under its lock."""

    def __init__(self) -> None:
        self.num_sequences = 0
        self._pending = [0] * 6  # by priority 1..5: prompt tokens not yet prefilled
        self.tokens_per_s: float | None = None

    def observe_step(self, tokens: int, seconds: float) -> None:
        """A step ran `tokens` tokens in `seconds` (engine thread)."""
        if tokens < _MIN_RATE_TOKENS or seconds <= 0:
            return
        rate = tokens / seconds
        old = self.tokens_per_s
        self.tokens_per_s = rate if old is None else old + _RATE_SMOOTHING * (rate - old)

    def wait_s(self, priority: int, tokens: int) -> float | None:
        """Estimated seconds until a request of `priority` with `tokens` prompt tokens has its first token."""
        rate = self.tokens_per_s
        if rate is None:
            return None
        ahead = sum(self._pending[1 : priority + 1])
        return (ahead + tokens) / rate

    def admit(
        self,
        tickets: list[Ticket],
        timeouts: list[float],
        queue_limit: int | None,
        field: str = "prompt",
    ) -> None:
        """Take the tickets, or raise and take none: ParamError naming `field` when they could
        never fit the limit, QueueFullError when they don't fit now, DeadlineError."""
        want = sum(t.sequences for t in tickets)
        if queue_limit is not None and want > queue_limit:  # retrying can't help: a 400, not a 429
            raise ParamError(
                f"{field}: this request needs {want} sequences; the server queues at most {queue_limit} (--max-queue)",
                field,
            )
        if queue_limit is not None and self.num_sequences + want > queue_limit:
            raise QueueFullError(
                f"the server is at capacity ({self.num_sequences} of {queue_limit} sequences queued or running; "
                f"this request needs {want}); retry shortly"
            )
        for t, timeout in zip(tickets, timeouts):
            wait = self.wait_s(t.priority, t.pending_tokens)
            own = t.pending_tokens / self.tokens_per_s if self.tokens_per_s else 0.0
            # A timeout its own prefill alone misses (or one already spent while tokenizing) is
            # admitted: retrying would not help, and it ends at once with finish_reason "timeout",
            # which is what the client asked for. Only a queue ahead of it is refused (503).
            if wait is not None and wait > timeout and own < timeout:
                ahead = wait - own
                raise DeadlineError(
                    f"timeout: {timeout:g} s can't be met: about {wait:.1f} s of prefill is queued before this "
                    f"request's first token; retry later or allow a longer timeout",
                    retry_after=max(1, math.ceil(ahead)),
                )
        for t in tickets:
            self.num_sequences += t.sequences
            self._pending[t.priority] += t.pending_tokens

    def started(self, ticket: Ticket) -> None:
        """The request produced output: its prompt is no longer ahead of anyone."""
        self._pending[ticket.priority] -= ticket.pending_tokens
        ticket.pending_tokens = 0

    def release(self, ticket: Ticket) -> None:
        self.started(ticket)
        self.num_sequences -= ticket.sequences
        ticket.sequences = 0
