"""/v2/models/{m}/generate[_stream]: MindIE and flat TensorRT-LLM bodies, exact event format."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
import uvicorn

from inflight.server.app import build_app
from inflight.server.config import ServerConfig

KEYS = {"id", "model_name", "model_version", "text_output", "details", "prefill_time", "decode_time"}
DETAIL_KEYS = {"generated_tokens", "first_token_cost", "decode_cost", "batch_size", "queue_wait_time"}


def _events(url: str, body: dict, prefix: str = "data:") -> list[dict]:
    """The events of a stream, each checked byte for byte: `prefix` + compact JSON (MindIE's
    `data:{...}`; Triton's `data: {...}`)."""
    events = []
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith(prefix + "{"), line
                e = json.loads(line[len(prefix) :])
                assert line == prefix + json.dumps(e, ensure_ascii=False, separators=(",", ":"))
                events.append(e)
    return events


def test_stream_dialect_per_request_and_forced(server, app_with) -> None:  # type: ignore[no-untyped-def]
    """A MindIE body streams MindIE's `data:{...}`, a Triton / TensorRT-LLM body Triton's `data: {...}`
    (genai-perf splits on `data: ` and must see one piece per event); --v2-stream-dialect forces one."""
    mindie = {"text_input": "hello world", "parameters": {"max_new_tokens": 5, "do_sample": False, "ignore_eos": True}}
    triton = {"text_input": "hello world", "max_tokens": 5, "temperature": 0.0, "ignore_eos": True, "stream": True}
    path = "/v2/models/tiny/generate_stream"
    m_events = _events(server.url + path, mindie)
    t_events = _events(server.url + path, triton, prefix="data: ")
    assert len(m_events) == len(t_events) >= 2
    with httpx.stream("POST", server.url + path, json=triton, timeout=60) as r:
        raw = r.read().decode()
    pieces = [json.loads(p) for p in raw.split("data: ") if p.strip()]  # genai-perf's reading of the stream
    assert [p["text_output"] for p in pieces] == [e["text_output"] for e in t_events]
    for dialect, body, prefix in (("triton", mindie, "data: "), ("mindie", triton, "data:")):
        url = app_with(ServerConfig(served_model_names=("tiny",), v2_stream_dialect=dialect))
        assert len(_events(url + path, body, prefix)) == len(m_events)
    server.wait_idle()


def test_a_prompt_too_long_names_the_field_sent(server) -> None:  # type: ignore[no-untyped-def]
    limit = server.engine.model_info.max_prompt_len
    url = server.url + "/v2/models/tiny/generate"
    for body, field in (({"text_input": "word " * (limit + 50)}, "text_input"), ({"input_ids": [5] * (limit + 1)}, "input_ids")):
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert r.json()["error"]["message"].startswith(field + ":")


def test_final_event_carries_the_eos_text_when_asked(server) -> None:  # type: ignore[no-untyped-def]
    """EOS with skip_special_tokens false and include_stop_str_in_output true: the last event's
    text_output is the EOS token's text (MindIE), not ""."""
    eos = server.engine.tokenizer.eos_token_id
    bias = [0.0] * server.engine.model_info.vocab_size
    bias[eos] = 1e4  # the model says EOS after min_length tokens
    body = {"text_input": "hello world", "max_tokens": 6, "temperature": 0.0, "min_length": 2, "embedding_bias": bias,
            "skip_special_tokens": False, "include_stop_str_in_output": True, "stream": True}  # fmt: skip
    eos_text = server.engine.tokenizer.decode([eos], skip_special_tokens=False)
    events = _events(server.url + "/v2/models/tiny/generate_stream", body, prefix="data: ")
    assert events[-1]["details"]["finish_reason"] == "eos_token" and events[-1]["text_output"] == eos_text
    whole = httpx.post(server.url + "/v2/models/tiny/generate", json=body | {"stream": False}, timeout=60).json()
    assert whole["text_output"] == "".join(e["text_output"] for e in events) and whole["text_output"].endswith(eos_text)
    hidden = _events(server.url + "/v2/models/tiny/generate_stream", body | {"include_stop_str_in_output": False}, prefix="data: ")
    assert eos_text not in "".join(e["text_output"] for e in hidden)
    server.wait_idle()


def test_mindie_stream_event_format(server) -> None:  # type: ignore[no-untyped-def]
    body = {"id": "a123", "text_input": "My name is Olivier and I", "parameters": {"details": True, "max_new_tokens": 8, "do_sample": False, "ignore_eos": True}}
    events = _events(server.url + "/v2/models/tiny/generate_stream", body)
    assert len(events) >= 2
    for e in events:
        assert set(e) == KEYS and e["id"] == "a123" and e["model_name"] == "tiny" and e["model_version"] is None
        assert set(e["details"]) >= DETAIL_KEYS
        assert e["details"]["batch_size"] >= 1
    assert events[0]["prefill_time"] is not None and events[0]["decode_time"] is None
    assert all(e["prefill_time"] is None and e["decode_time"] is not None for e in events[1:])
    assert [e["details"]["generated_tokens"] for e in events] == sorted(e["details"]["generated_tokens"] for e in events)
    assert events[-1]["details"]["finish_reason"] == "length" and events[-1]["details"]["generated_tokens"] == 8
    assert all("finish_reason" not in e["details"] for e in events[:-1])
    full = httpx.post(server.url + "/v2/models/tiny/generate", json={**body, "id": "a124"}, timeout=60).json()
    assert full["text_output"] == "".join(e["text_output"] for e in events)
    # not streamed, the engine makes one (final-only) output; the body is still the last event's
    assert set(full) == KEYS and full["prefill_time"] is None and full["decode_time"] is not None
    assert {k: full["details"][k] for k in ("finish_reason", "generated_tokens")} == {"finish_reason": "length", "generated_tokens": 8}
    assert len(full["details"]["tokens"]) == 8 and all(isinstance(t["logprob"], float) for t in full["details"]["tokens"])
    server.wait_idle()


def test_flat_tensorrt_llm_body(server) -> None:  # type: ignore[no-untyped-def]
    flat = {"text_input": ["the cat"], "max_tokens": 6, "temperature": 0.0, "ignore_eos": True, "stream": True}
    events = _events(server.url + "/v2/models/tiny/generate_stream", flat, prefix="data: ")
    assert events[-1]["details"]["generated_tokens"] == 6
    r = httpx.post(server.url + "/v2/models/tiny/generate", json={**flat, "stream": False}, timeout=60).json()
    assert r["text_output"] == "".join(e["text_output"] for e in events)


def test_finish_reasons_and_stop_words(server) -> None:  # type: ignore[no-untyped-def]
    url = server.url + "/v2/models/tiny/generate"
    base = {"text_input": "hello world", "parameters": {"max_new_tokens": 12, "do_sample": False, "ignore_eos": True}}
    text = httpx.post(url, json=base, timeout=60).json()["text_output"]
    words = [w for w in text.split() if len(w) >= 2]
    if words:
        stopped = httpx.post(url, json={**base, "parameters": {**base["parameters"], "stop_words": [words[0]]}}, timeout=60).json()
        assert stopped["details"]["finish_reason"] == "stop_sequence" and words[0] not in stopped["text_output"]
    tokens = httpx.post(url, json={**base, "parameters": {**base["parameters"], "details": True}}, timeout=60).json()["details"]["tokens"]
    eos = tokens[2]["id"]
    ended = httpx.post(url, json={"text_input": "hello world", "parameters": {"max_new_tokens": 12, "do_sample": False, "end_id": eos}}, timeout=60).json()
    assert ended["details"]["finish_reason"] == "eos_token" and ended["details"]["generated_tokens"] == 3


@pytest.mark.parametrize(
    "body,param",
    [
        ({"id": "bad id!", "text_input": "x"}, "id"),
        ({"id": "x" * 257, "text_input": "x"}, "id"),
        ({"text_input": ""}, "text_input"),
        ({"text_input": 5}, "text_input"),
        ({"text_input": "x", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"text_input": "x", "parameters": {"top_p": 0}}, "top_p"),
        ({"text_input": "x", "parameters": {"priority": 6}}, "priority"),
        ({"text_input": "x", "parameters": {"timeout": 0}}, "timeout"),
        ({"text_input": "x", "parameters": {"seed": -3}}, "seed"),
        ({"text_input": "x", "parameters": {"details": "yes"}}, "details"),
        ({"text_input": "x", "parameters": {"stop_words": [5]}}, "stop_words"),
        ({"text_input": "x", "parameters": {"repetition_penalty": 0}}, "repetition_penalty"),
    ],
)
def test_generate_limits(server, body, param) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v2/models/tiny/generate", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_unknown_model_is_404_on_both_families(server) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v2/models/nope/generate", json={"text_input": "x"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(server.url + "/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=60)
    assert r.status_code == 404
    # docs/API.md: `model` may be absent (Databricks bodies have none); a wrong type is a 400 on all three
    for path, body in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                       ("/v1/embeddings", {"input": "x"})):  # fmt: skip
        r = httpx.post(server.url + path, json={**body, "model": 5, "max_tokens": 1}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", (path, r.text)


def test_full_text_enabled_and_aliases(server) -> None:  # type: ignore[no-untyped-def]
    config = ServerConfig(served_model_names=("main", "alias"), full_text_enabled=True)
    srv = uvicorn.Server(uvicorn.Config(build_app(server.engine, config), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        body = {"text_input": "once upon", "parameters": {"max_new_tokens": 6, "do_sample": False, "ignore_eos": True}}
        events = _events(f"http://127.0.0.1:{port}/v2/models/alias/generate_stream", body)
        texts = [e["text_output"] for e in events]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
        assert [m["id"] for m in models][:2] == ["main", "alias"]
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


MINDIE_SAMPLE = {  # reference/mindie-generate-stream.txt, the text-model request (timeout kept)
    "id": "a123", "text_input": "My name is Olivier and I",
    "parameters": {"details": True, "do_sample": True, "max_new_tokens": 20, "repetition_penalty": 1.1, "seed": 123,
                   "temperature": 1, "top_k": 10, "top_p": 0.99, "batch_size": 100, "typical_p": 0.5, "watermark": False,
                   "perf_stat": False, "priority": 5, "timeout": 10},
}  # fmt: skip


def test_mindie_sample_perf_stat_and_per_event_queue_wait(server) -> None:  # type: ignore[no-untyped-def]
    events = _events(server.url + "/v2/models/tiny/generate_stream", MINDIE_SAMPLE)
    assert all(set(e) == KEYS for e in events)  # perf_stat false: MindIE's exact keys
    waits = [e["details"]["queue_wait_time"] for e in events]
    body = {**MINDIE_SAMPLE, "id": "a124", "parameters": {**MINDIE_SAMPLE["parameters"], "perf_stat": True}}
    full = httpx.post(server.url + "/v2/models/tiny/generate", json=body, timeout=60).json()
    perf = full["perf_stat"]
    n = full["details"]["generated_tokens"]
    assert len(perf["batch_size"]) == len(perf["queue_wait_time"]) == n and len(perf["decode_time_arr"]) == n - 1
    assert all(w >= 0 for w in waits) and len(waits) == len(events)
    if len(events) > 1:  # one wait per token, not the first token's then zeros
        assert any(w > 0 for w in waits[1:])
    streamed = _events(server.url + "/v2/models/tiny/generate_stream", {**body, "id": "a125"})
    assert "perf_stat" in streamed[-1] and all("perf_stat" not in e for e in streamed[:-1])
    for bad in ({"batch_size": 0}, {"perf_stat": "yes"}):
        r = httpx.post(server.url + "/v2/models/tiny/generate", json={"text_input": "x", "parameters": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(bad))
    high = httpx.post(server.url + "/v2/models/tiny/generate", json={"text_input": "x", "parameters": {"repetition_penalty": 2.5, "max_new_tokens": 2}}, timeout=60)
    assert high.status_code == 200  # MindIE: above 2 is allowed, not recommended
    server.wait_idle()


def test_mindie_batch_size_caps_the_batch_while_the_request_runs(server) -> None:  # type: ignore[no-untyped-def]
    """batch_size N: every step of the request runs at most N rows (perf_stat's per-token batch
    sizes), here behind three busy requests: it waits until the running set drains to 1, then runs
    each of its steps beside the longest one. Deterministic under load: the engine thread is held
    (an `AsyncEngine.call` that waits) until all four requests are registered, in order, so they
    reach the scheduler in one inbox drain (it was flaky when the busy ones did not overlap, or the
    longest finished before the capped one arrived)."""
    url = server.url + "/v2/models/tiny/generate"
    results: dict[str, dict] = {}
    held, release = threading.Event(), threading.Event()

    def hold_engine() -> None:
        held.set()
        release.wait(60)

    def post(name: str, params: dict) -> None:
        base = {"do_sample": False, "ignore_eos": True, "perf_stat": True}
        results[name] = httpx.post(url, json={"text_input": f"{name} request", "parameters": base | params}, timeout=120).json()

    holder = threading.Thread(target=lambda: asyncio.run(server.engine.call(hold_engine)))
    holder.start()
    assert held.wait(30)
    jobs = [("busy40", {"max_new_tokens": 40}), ("busy60", {"max_new_tokens": 60}), ("busy120", {"max_new_tokens": 120}),
            ("capped", {"max_new_tokens": 6, "batch_size": 2})]  # fmt: skip
    threads = []
    try:
        for i, (name, params) in enumerate(jobs, 1):  # registered one by one: the scheduler sees them in this order
            threads.append(threading.Thread(target=post, args=(name, params)))
            threads[-1].start()
            deadline = time.time() + 60
            while server.engine.num_unfinished < i and time.time() < deadline:
                time.sleep(0.005)
            assert server.engine.num_unfinished == i
    finally:
        release.set()
        for t in [*threads, holder]:
            t.join()
    assert results["capped"]["perf_stat"]["batch_size"] == [2] * 6  # beside busy120, never more
    assert max(results["busy40"]["perf_stat"]["batch_size"]) == 3  # uncapped before it
    beams = httpx.post(url, json={"text_input": "x", "parameters": {"batch_size": 2}, "beam_width": 3}, timeout=60)
    assert beams.status_code == 400 and beams.json()["error"]["param"] == "batch_size"
    server.wait_idle()
