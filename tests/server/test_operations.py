"""Operations and guards: /metrics, API keys, body limits, queue limits, disconnects."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx

from inflight.server.app import build_app
from inflight.server.config import ServerConfig


def _metric(text: str, name: str, labels: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(name + (labels or "")) and not line.startswith("#"):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{labels} not in /metrics")


def test_metrics_content(server) -> None:  # type: ignore[no-untyped-def]
    httpx.post(server.url + "/v1/completions", json={"prompt": "metrics please", "max_tokens": 4, "temperature": 0}, timeout=60)
    httpx.post(server.url + "/v1/completions", json={"prompt": "x", "temperature": -1}, timeout=60)
    text = httpx.get(server.url + "/metrics").text
    assert _metric(text, "inflight_http_requests_total", '{endpoint="/v1/completions",status="200"}') >= 1
    assert _metric(text, "inflight_http_requests_total", '{endpoint="/v1/completions",status="400"}') >= 1
    assert _metric(text, "inflight_generation_tokens_total") >= 4
    assert _metric(text, "inflight_prompt_tokens_total") >= 1
    assert _metric(text, "inflight_time_to_first_token_seconds_count") >= 1
    assert _metric(text, "inflight_time_per_output_token_seconds_count") >= 3
    for gauge in ("inflight_requests_running", "inflight_requests_waiting", "inflight_kv_cache_usage_ratio",
                  "inflight_prefix_cache_hit_rate", "inflight_preemptions_total"):  # fmt: skip
        _metric(text, gauge)


def test_disconnect_mid_stream_frees_blocks(server) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": "a long story", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        for _ in zip(range(3), r.iter_lines()):
            pass  # read a few chunks, then hang up
    server.wait_idle(timeout=10)  # aborted within steps, every block free or cached
    text = httpx.get(server.url + "/metrics").text
    assert _metric(text, "inflight_requests_finished_total", '{finish_reason="abort"}') >= 1
    assert _metric(text, "inflight_requests_running") == 0


def test_api_keys_on_every_route_family(app_with) -> None:  # type: ignore[no-untyped-def]
    url = app_with(ServerConfig(served_model_names=("tiny",), api_keys=("k1", "k2")))
    calls = [
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
        ("POST", "/v2/models/tiny/generate", {"text_input": "x", "parameters": {"max_new_tokens": 1}}),
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
    ]
    for method, path, body in calls:
        r = httpx.request(method, url + path, json=body, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        r = httpx.request(method, url + path, json=body, headers={"Authorization": "Bearer wrong"}, timeout=60)
        assert r.status_code == 401, path
        r = httpx.request(method, url + path, json=body, headers={"Authorization": "Bearer k2"}, timeout=60)
        assert r.status_code == 200, path
    assert httpx.get(url + "/health").status_code == 200  # health is always open
    assert httpx.get(url + "/v2/health/ready").status_code == 200


def test_body_too_large_is_413(app_with) -> None:  # type: ignore[no-untyped-def]
    url = app_with(ServerConfig(served_model_names=("tiny",), max_body_bytes=1000))
    r = httpx.post(url + "/v1/completions", json={"prompt": "x" * 2000}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"

    def chunks() -> Iterator[bytes]:  # no content-length: checked after reading
        yield b'{"prompt": "'
        yield b"y" * 2000
        yield b'"}'

    r = httpx.post(url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413


def test_queue_full_is_429_with_retry_after(server, app_with) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from inflight import SamplingParams

    url = app_with(ServerConfig(served_model_names=("tiny",), max_queue=1))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    held = server.engine.generate([5, 6, 7], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    asyncio.run_coroutine_threadsafe(anext(held), loop).result(timeout=30)  # one request in, not yet read out
    try:
        refused = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=60)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
    finally:
        asyncio.run_coroutine_threadsafe(held.aclose(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
    ok = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=60)
    assert ok.status_code == 200
    server.wait_idle(timeout=10)


def test_mindie_perf_extras(server, app_with) -> None:  # type: ignore[no-untyped-def]
    url = app_with(ServerConfig(served_model_names=("tiny",), perf_extras=True))
    chat = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0, "ignore_eos": True}, timeout=60).json()
    assert chat["prefill_time"] > 0 and len(chat["decode_time_arr"]) == 4
    cmpl = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 5, "temperature": 0, "ignore_eos": True}, timeout=60).json()
    assert len(cmpl["usage"]["batch_size"]) == 5 and len(cmpl["usage"]["queue_wait_time"]) == 5
    assert cmpl["usage"]["queue_wait_time"][0] >= 0 and all(b >= 1 for b in cmpl["usage"]["batch_size"])
    plain = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60).json()
    assert "batch_size" not in plain["usage"]  # off unless configured ...
    with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": True, "temperature": 0, "ignore_eos": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][-1]
    assert "decode_time_arr" not in final and "usage" not in final  # ... in streams too (OpenAI's chunk shape)


def test_an_internal_bug_is_a_clean_500(server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from inflight.server.openai import routes as openai_routes

    async def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    monkeypatch.setattr(openai_routes, "completions", broken)
    client = TestClient(build_app(server.engine, "tiny"), raise_server_exceptions=False)
    r = client.post("/v1/completions", json={"prompt": "x"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert client.get("/health").status_code == 200  # and the app keeps serving
    text = client.get("/metrics").text  # the 500 is counted like any other answer
    assert _metric(text, "inflight_http_requests_total", '{endpoint="/v1/completions",status="500"}') == 1
