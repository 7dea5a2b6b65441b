"""Hostile input, admission and abandonment on the real server (loopback, one server per module).

Every hostile body here was a 500 (or froze the server) before: each must be a 400 naming the
field. The queue limit counts engine sequences atomically; a timeout the queue can't meet is a
503 at arrival; a non-streamed request whose client hangs up is aborted; long prompts are
refused before tokenizing and tokenized off the event loop."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import httpx
import pytest

from inflight.engine.admission import Ticket
from inflight.server.config import ServerConfig

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


def _metric(text: str, name: str, labels: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[-1])
    return 0.0


def _hold(engine: Any) -> threading.Event:
    """Park the engine thread inside a call until the returned event is set (nothing steps)."""
    inside, release = threading.Event(), threading.Event()

    def park() -> None:
        inside.set()
        release.wait(30)

    threading.Thread(target=lambda: asyncio.run(engine.call(park)), daemon=True).start()
    assert inside.wait(30)
    return release


def _raw(url: str, path: str, raw: bytes) -> httpx.Response:
    return httpx.post(
        url + path, content=raw, headers={"content-type": "application/json"}, timeout=60
    )


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        pytest.param(
            CMPL,
            b'{"prompt": "hi", "max_tokens": 1, "temperature": 1' + b"0" * 400 + b"}",
            "temperature",
            id="int-beyond-float",
        ),
        pytest.param(
            CMPL,
            b'{"prompt": "hi", "max_tokens": 1, "whatever": ' + b"9" * 5000 + b"}",
            "body",
            id="int-over-4300-digits",
        ),
        pytest.param(
            CMPL,
            b'{"prompt": "hi", "max_tokens": 1, "logit_bias": {"\xc2\xb2": 1}}',
            "logit_bias",
            id="logit-bias-superscript-key",
        ),
        pytest.param(
            CMPL,
            b'{"prompt": "hi \\ud800 there", "max_tokens": 1}',
            "prompt",
            id="surrogate-prompt",
        ),
        pytest.param(
            CHAT,
            b'{"messages": [{"role": "user", "content": "x\\udfff"}], "max_tokens": 1}',
            "messages",
            id="surrogate-messages",
        ),
        pytest.param(
            "/v2/models/tiny/generate",
            b'{"text_input": "\\ud800", "parameters": {"max_new_tokens": 1}}',
            "text_input",
            id="surrogate-text-input",
        ),
        pytest.param(
            "/v1/embeddings", b'{"input": ["ok", "\\ud834"]}', "input", id="surrogate-embeddings"
        ),
        pytest.param(
            CMPL,
            b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "body",
            id="nested-arrays",
        ),
        pytest.param(
            CMPL,
            b'{"prompt": "x", "a": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}",
            "body",
            id="nested-objects",
        ),
        pytest.param(
            CMPL,
            b'{"prompt": "hi", "max_tokens": 2, "use_beam_search": true, "best_of": 65, "temperature": 0}',
            "best_of",
            id="beam-wider-than-batch",
        ),
        pytest.param(
            CMPL,
            b'{"prompt": "hi", "max_tokens": 2, "n": 100, "temperature": 1}',
            "n",
            id="n-wider-than-batch",
        ),
        pytest.param(
            CMPL,
            b'{"prompt": "hi", "max_tokens": 2, "use_beam_search": true, "n": 2, "temperature": 0, "length_penalty": 1e308}',
            "length_penalty",
            id="length-penalty-overflow",
        ),
        pytest.param(
            "/v2/models/tiny/generate",
            b'{"text_input": "hi", "parameters": {"end_id": 123456789012345678901234567890}}',
            "end_id",
            id="end-id-beyond-vocab",
        ),
        pytest.param(  # found by schemathesis: an AttributeError (500)
            CHAT,
            b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": [null]}}',
            "tool_choice",
            id="tool-choice-function-not-an-object",
        ),
        pytest.param("/v1/embeddings", b'{"input": ["a", ""]}', "input", id="embeddings-empty-text"),
        pytest.param(  # parsed, then a RecursionError (500) copying the tool schema
            CHAT,
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": '
            + b'{"a": ' * 600 + b"{}" + b"}" * 600 + b"}}]}",
            "body",
            id="tool-schema-600-deep",
        ),
    ],
)
def test_hostile_bodies_are_400_naming_the_field(server, path: str, raw: bytes, param: str) -> None:  # type: ignore[no-untyped-def]
    r = _raw(server.url, path, raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_chat_template_errors_are_400(server) -> None:  # type: ignore[no-untyped-def]
    # the tiny template reads message['content'], which an assistant tool-call turn doesn't have
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [call]},
        ],
        "max_tokens": 1,
    }
    r = httpx.post(server.url + CHAT, json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert "UndefinedError" in r.json()["error"]["message"]
    assert (
        httpx.post(
            server.url + CHAT,
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=60,
        ).status_code
        == 200
    )


def _background(url: str, bodies: list[dict[str, Any]]) -> tuple[threading.Thread, list[list[int]]]:
    """POST the bodies at once from another thread; their statuses, in order, when it ends."""

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            return [
                r.status_code
                for r in await asyncio.gather(*(client.post(url + CMPL, json=b) for b in bodies))
            ]

    result: list[list[int]] = []
    t = threading.Thread(target=lambda: result.append(asyncio.run(burst())))
    t.start()
    return t, result


def _until(cond: Any) -> None:
    for _ in range(1000):
        if cond():
            return
        threading.Event().wait(0.01)


def test_queue_limit_counts_sequences_atomically(server, app_with) -> None:  # type: ignore[no-untyped-def]
    url = app_with(
        ServerConfig(served_model_names=("tiny",), max_queue=4, embedding_pooling="last")
    )
    engine = server.engine
    one = {"prompt": "x", "max_tokens": 3, "temperature": 0}
    # more sequences than the limit can never be queued: a 400 naming what made them, not a 429
    for path, body, field in ((CMPL, one | {"n": 5, "temperature": 1}, "n"), (CMPL, one | {"prompt": ["a", "b", "c", "d", "e"]}, "prompt"),
                              ("/v1/embeddings", {"model": "tiny", "input": ["a", "b", "c", "d", "e"]}, "input")):  # fmt: skip
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (path, r.text)

    release = _hold(engine)  # nothing finishes while held: simultaneous arrivals race for 4 places
    try:
        t, result = _background(url, [one] * 10)
        _until(lambda: engine.num_queued_sequences == 4 and engine.num_unfinished == 4)
        t.join(1)  # the 6 refused are answered at once
        assert engine.num_queued_sequences == 4  # never more, however many arrive at once
    finally:
        release.set()
    t.join(60)
    assert sorted(result[0]) == [200] * 4 + [429] * 6
    server.wait_idle()

    release = _hold(engine)
    try:  # n counts: 3 sequences in, then a 2-prompt body doesn't fit, one more sequence does
        t1, first = _background(url, [one | {"n": 3, "temperature": 1}])
        _until(lambda: engine.num_queued_sequences == 3)
        refused = httpx.post(url + CMPL, json=one | {"prompt": ["a", "b"]}, timeout=60)
        assert (
            refused.status_code == 429
            and refused.headers["retry-after"] == "1"
            and refused.json()["error"]["code"] == "queue_full"
        )
        t2, last = _background(url, [one])
        _until(lambda: engine.num_queued_sequences == 4)
        assert engine.num_queued_sequences == 4
    finally:
        release.set()
    t1.join(60)
    t2.join(60)
    assert first == [[200]] and last == [[200]]
    server.wait_idle()
    assert engine.num_queued_sequences == 0
    text = httpx.get(url + "/metrics", timeout=10).text
    assert _metric(text, "inflight_requests_rejected_total", '{reason="queue_full"}') >= 7


def test_a_timeout_the_queue_cannot_meet_is_503_at_arrival(server) -> None:  # type: ignore[no-untyped-def]
    long = {
        "prompt": "the quick brown fox jumps over the lazy dog " * 8,
        "max_tokens": 2,
        "temperature": 0,
    }
    assert (
        httpx.post(server.url + CMPL, json=long, timeout=60).status_code == 200
    )  # the prefill rate is measured
    admission = server.engine.admission
    assert admission.tokens_per_s is not None
    # shorter than its own prefill: no queue is to blame, retrying can't help: it runs out at once
    r = httpx.post(server.url + CMPL, json=long | {"timeout": 1e-6}, timeout=60)
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["text"] == "" and choice["finish_detail"] == "timeout"
    # behind an hour of queued prefill (as many prompt tokens as the measured rate does in one)
    queued = Ticket(sequences=0, priority=5, pending_tokens=int(admission.tokens_per_s * 3600))
    with server.engine.streams.lock:  # as the engine client admits a request
        admission.admit([queued], [float("inf")], None)
    try:
        r = httpx.post(server.url + CMPL, json=long | {"timeout": 600}, timeout=60)
    finally:
        with server.engine.streams.lock:
            admission.release(queued)
    assert (
        r.status_code == 503
        and r.json()["error"]["code"] == "deadline"
        and int(r.headers["retry-after"]) >= 600
    )
    assert r.json()["error"]["param"] == "timeout"
    assert (
        httpx.post(server.url + CMPL, json=long | {"timeout": 600}, timeout=60).status_code == 200
    )
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert _metric(text, "inflight_requests_rejected_total", '{reason="deadline"}') >= 1


def test_a_non_streamed_request_whose_client_leaves_is_aborted(server) -> None:  # type: ignore[no-untyped-def]
    before = httpx.get(server.url + "/metrics", timeout=10).text
    body = json.dumps(
        {"prompt": "tell me everything", "max_tokens": 480, "temperature": 0, "ignore_eos": True}
    ).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        head = f"POST {CMPL} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        client.sendall(head.encode() + body)
        _until(lambda: server.engine.stats.num_running == 1)  # generating; the client hangs up now
    server.wait_idle(timeout=30)  # aborted at the next step, not after 480 tokens
    after = httpx.get(server.url + "/metrics", timeout=10).text
    abort = '{finish_reason="abort"}'
    assert (
        _metric(after, "inflight_requests_finished_total", abort)
        == _metric(before, "inflight_requests_finished_total", abort) + 1
    )
    generated = _metric(after, "inflight_generation_tokens_total") - _metric(
        before, "inflight_generation_tokens_total"
    )
    wasted = _metric(after, "inflight_wasted_tokens_total") - _metric(
        before, "inflight_wasted_tokens_total"
    )
    assert 0 < generated < 480 and wasted >= generated


def test_long_prompts_are_refused_before_tokenizing_and_tokenized_off_the_loop(
    server, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    limit = server.engine.model_info.max_prompt_chars
    tok = server.engine.tokenizer
    encode = tok.encode
    calls: list[int] = []
    entered, release = threading.Event(), threading.Event()

    def slow_encode(text: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(text))
        if "SLOW" in text:  # stands in for a tokenization that takes seconds
            entered.set()
            release.wait(30)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tok, "encode", slow_encode)
    r = httpx.post(
        server.url + CMPL, json={"prompt": "y" * (limit + 1), "max_tokens": 1}, timeout=60
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and not calls
    r = httpx.post(
        server.url + CHAT,
        json={"messages": [{"role": "user", "content": "y" * (limit + 1)}]},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages" and not calls

    got: list[httpx.Response] = []
    t = threading.Thread(
        target=lambda: got.append(
            httpx.post(
                server.url + CMPL, json={"prompt": "SLOW words", "max_tokens": 2}, timeout=60
            )
        )
    )
    t.start()
    try:
        assert entered.wait(30)  # tokenizing now, and the event loop answers meanwhile:
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert httpx.get(server.url + "/metrics", timeout=10).status_code == 200
    finally:
        release.set()
    t.join(60)
    assert got[0].status_code == 200


def test_engine_errors_reach_the_client_cleanly(server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from inflight.engine.beam import BeamGroup

    def broken(self: BeamGroup) -> Any:
        raise OverflowError("injected")

    monkeypatch.setattr(BeamGroup, "step", broken)
    beam = {"prompt": "hi", "max_tokens": 3, "use_beam_search": True, "n": 2, "temperature": 0}
    r = httpx.post(server.url + CMPL, json=beam, timeout=60)
    assert r.status_code == 500 and "injected" in r.json()["error"]["message"]
    with httpx.stream("POST", server.url + CMPL, json=beam | {"stream": True}, timeout=60) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert (
        "injected" in json.loads(lines[-2][6:])["error"]["message"] and lines[-1] == "data: [DONE]"
    )
    ok = httpx.post(
        server.url + CMPL, json={"prompt": "hi", "max_tokens": 3, "temperature": 0}, timeout=60
    )
    assert (
        ok.status_code == 200 and httpx.get(server.url + "/health", timeout=10).status_code == 200
    )
    server.wait_idle()


def test_extreme_but_valid_numbers_generate(server) -> None:  # type: ignore[no-untyped-def]
    """Temperatures float32 can't divide by (1e-40 is a subnormal whose quotient is inf, 1e308 is inf)
    must not give NaN probabilities: a tiny temperature samples the greedy tokens, a huge one samples."""

    def ids(t: float | None) -> list[int]:
        p = {"max_new_tokens": 4, "ignore_eos": True, "details": True} | (
            {"temperature": t, "do_sample": True} if t else {}
        )
        r = httpx.post(
            server.url + "/v2/models/tiny/generate",
            json={"text_input": "hi there", "parameters": p},
            timeout=60,
        )
        assert r.status_code == 200, (t, r.text)
        return [tok["id"] for tok in r.json()["details"]["tokens"]]

    greedy = ids(None)
    assert ids(1e-40) == greedy and ids(1e-300) == greedy
    assert len(ids(1e308)) == 4
    big = {
        "prompt": "hi",
        "max_tokens": 2,
        "min_tokens": 10**40,
        "ignore_eos": True,
        "seed": 2**64 - 1,
        "temperature": 1,
    }
    r = httpx.post(server.url + CMPL, json=big, timeout=60)
    assert r.status_code in (200, 400), r.text  # never a 500
    server.wait_idle()


def test_no_per_request_state_outlives_its_request(server) -> None:  # type: ignore[no-untyped-def]
    """The long soak's flat RSS (docs/OPERATIONS.md "Soak") depends on it: after a mixed burst (n, best_of,
    beams, structured output, streams hung up on, expired and aborted requests) every per-request
    map of the client, engine, scheduler, KV manager and runner is empty again."""
    p = {"prompt": "the cat sat", "max_tokens": 6, "temperature": 0.8}
    bodies = [p, p | {"n": 3}, p | {"n": 2, "best_of": 3}, p | {"use_beam_search": True, "best_of": 3, "temperature": 0},
              p | {"timeout": 0.001, "max_tokens": 50, "ignore_eos": True}, p | {"response_format": {"type": "json_object"}}]  # fmt: skip
    t, _ = _background(server.url, bodies * 2)
    with httpx.stream("POST", server.url + CMPL, json=p | {"stream": True, "max_tokens": 200, "ignore_eos": True}, timeout=60) as r:
        next(r.iter_lines())  # hang up after the first event
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:  # a non-streamed request given up
        body = json.dumps(p | {"max_tokens": 200, "ignore_eos": True}).encode()
        client.sendall(f"POST {CMPL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        _until(lambda: server.engine.num_unfinished > 0)
    t.join(60)
    server.wait_idle(timeout=30)
    client, eng = server.engine, server.engine.engine
    _until(lambda: not client.streams.queues)
    maps = {
        "client streams": client.streams.queues, "client tickets": client.streams.tickets, "engine requests": eng.requests,
        "engine groups": eng.parents, "engine sequences": eng.seqs.parent_of, "output states": eng.output_processor.states,
        "scheduler requests": eng.scheduler.requests, "scheduler aborts": eng.scheduler.pending_aborts,
        "held siblings": eng.scheduler.held, "runner requests": eng.executor.runner.batch.requests,
    }  # fmt: skip
    sizes = {name: len(m) for name, m in maps.items()} | {f"kv {name}": n for name, n in eng.kv.num_tracked().items()}
    assert {name: n for name, n in sizes.items() if n} == {}
    assert client.admission.num_sequences == 0 and client.num_queued_sequences == 0



@pytest.mark.parametrize("pad", [0, 3000])  # few commas: the walk over the body; many: the bracket scan
def test_depth_limit_counts_containers_not_brackets_in_strings(pad: int) -> None:
    from inflight.sampling_params import ParamError
    from inflight.server.fields import MAX_DEPTH, parse_body

    for depth in (MAX_DEPTH, MAX_DEPTH + 1):
        x: object = ']]}}[[{{\\"['  # brackets and an escaped quote inside a string are not nesting
        for i in range(depth - 1):
            x = {"a": x} if i % 2 else [x]
        raw = json.dumps({"x": x, "pad": [1] * pad}).encode()  # the body: `depth` levels
        if depth < MAX_DEPTH + 1:
            assert parse_body(raw)["x"] == x
        else:
            with pytest.raises(ParamError, match="nested deeper than 128"):
                parse_body(raw)
