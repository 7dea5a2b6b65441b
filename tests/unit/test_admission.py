"""Admission (engine/admission.py): the queue limit in sequences, all-or-none, and the deadline
estimate from the prompt tokens queued ahead and the measured prefill rate."""

from __future__ import annotations

import pytest

from inflight import ParamError
from inflight.engine.admission import Admission, DeadlineError, QueueFullError, Ticket

INF = float("inf")


def test_sequences_are_counted_and_a_body_is_admitted_whole_or_not_at_all() -> None:
    a = Admission()
    first = [Ticket(3, 5, 10)]
    a.admit(first, [INF], queue_limit=4)
    with pytest.raises(QueueFullError):
        a.admit([Ticket(1, 5, 10), Ticket(1, 5, 10)], [INF, INF], queue_limit=4)
    assert a.num_sequences == 3  # the refused body took nothing
    with pytest.raises(ParamError) as e:  # could never fit: retrying is no use
        a.admit([Ticket(5, 5, 10)], [INF], queue_limit=4, field="n")
    assert e.value.param == "n"
    a.release(first[0])
    a.release(first[0])  # twice is harmless (a stream closed after it finished)
    assert a.num_sequences == 0


def test_the_deadline_counts_prompts_ahead_at_the_same_or_better_priority() -> None:
    a = Admission()
    a.admit([Ticket(1, 5, 10_000)], [0.001], None)  # no rate measured yet: never refused
    Admission().admit([Ticket(1, 5, 10)], [-0.001], None)  # ... even a timeout spent while tokenizing (was a TypeError: a 500)
    a.observe_step(16, 0.001)  # too small a step to measure prefill speed
    assert a.tokens_per_s is None
    a.observe_step(1000, 1.0)  # 1000 tokens/s
    assert a.wait_s(5, 100) == pytest.approx(10.1)  # 10,000 ahead + its own 100
    assert a.wait_s(1, 100) == pytest.approx(0.1)  # priority 1 is not behind priority-5 work
    with pytest.raises(DeadlineError) as e:
        a.admit([Ticket(1, 5, 100)], [5.0], None)
    assert e.value.retry_after == 10 and e.value.reason == "deadline"
    a.admit([Ticket(1, 2, 100)], [5.0], None)  # a better priority goes first: it fits
    a.admit([Ticket(1, 5, 100)], [20.0], None)
    assert a.num_sequences == 3


def test_a_timeout_its_own_prefill_misses_is_admitted_to_time_out() -> None:
    """Retrying can't help a timeout its own prompt alone misses (or one spent while tokenizing):
    no 503 "retry later"; it is admitted and ends at once with finish_reason "timeout"."""
    a = Admission()
    a.observe_step(1000, 1.0)  # 1000 tokens/s
    a.admit([Ticket(1, 5, 500)], [1e-40], None)  # its own 500 tokens take 0.5 s
    a.admit([Ticket(1, 5, 500)], [-0.001], None)  # spent before it was queued
    assert a.num_sequences == 2
    with pytest.raises(DeadlineError):  # behind the 1,000 queued tokens, 0.6 s is too little
        a.admit([Ticket(1, 5, 500)], [0.6], None)
