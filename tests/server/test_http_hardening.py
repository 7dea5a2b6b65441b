"""The HTTP side under hostile clients: body and header limits, slow clients, connection limits,
keep-alive after errors, framework errors in our error body, duplicate ids, model routes, /openapi.json."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest

from inflight.server.config import ServerConfig
from inflight.server.connection import ConnectionLimits


def _connect(url: str) -> socket.socket:
    u = urlparse(url)
    return socket.create_connection((u.hostname, u.port), timeout=10)


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a content-length body, read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True if the server closes `sock` within `seconds` (whatever it wrote first is read away)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_chunked_body_over_the_limit_is_refused_at_the_limit(app_with) -> None:  # type: ignore[no-untyped-def]
    url = app_with(ServerConfig(served_model_names=("tiny",), max_body_bytes=1000))
    with _connect(url) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        s.sendall(b"800\r\n" + b"x" * 0x800 + b"\r\n")  # 2 KiB, and the upload is not finished
        status, headers, body = _response(s)  # answered without waiting for the rest
        assert status == 413 and json.loads(body)["error"]["param"] == "body"
        for _ in range(64):  # the client keeps uploading (4 MiB): discarded unread, never buffered
            s.sendall(b"10000\r\n" + b"y" * 0x10000 + b"\r\n")
        s.sendall(b"0\r\n\r\n")
        s.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")  # and the connection is still usable
        status, _, body = _response(s)
        assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny"

    def upload() -> Iterator[bytes]:
        for _ in range(128):
            yield b"z" * 65536

    r = httpx.post(url + "/v1/completions", content=upload(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413
    metrics = httpx.get(url + "/metrics").text
    assert 'inflight_http_requests_total{endpoint="/v1/completions",status="413"}' in metrics  # not "unmatched"


def test_slow_and_silent_clients_are_cut_off(app_with) -> None:  # type: ignore[no-untyped-def]
    limits = ConnectionLimits(keep_alive_s=0.5, header_s=0.6, body_s=0.6, max_header_bytes=4096)
    url = app_with(ServerConfig(served_model_names=("tiny",), limits=limits))
    with _connect(url) as silent:  # connects and sends nothing
        assert _closed_within(silent, 3.0)
    with _connect(url) as trickle:  # headers a few bytes at a time
        trickle.sendall(b"GET /v1/models HTTP/1.1\r\n")
        for _ in range(8):  # past the header timeout: the server answers and closes meanwhile
            time.sleep(0.1)
            try:
                trickle.sendall(b"x-a: b\r\n")
            except OSError:
                break
        status, headers, body = _response(trickle)
        assert status == 408 and headers["connection"] == "close" and json.loads(body)["error"]["code"] == "header_timeout"
    with _connect(url) as slow_body:  # a body that never ends
        slow_body.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"prompt\"")
        status, _, body = _response(slow_body)
        assert status == 408 and json.loads(body)["error"]["code"] == "body_timeout"
    for head in (b"x-big: " + b"a" * 8192, b"x-big: " + b"a" * 6000 + b"\r\n\r\n"):  # unfinished; whole in one read
        with _connect(url) as big:
            big.sendall(b"GET /v1/models HTTP/1.1\r\n" + head)
            status, _, body = _response(big)
            assert status == 431 and json.loads(body)["error"]["code"] == "headers_too_large"
    with _connect(url) as fine:  # a prompt client on the same server is served
        fine.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _response(fine)[0] == 200


def test_connection_limit(app_with) -> None:  # type: ignore[no-untyped-def]
    url = app_with(ServerConfig(served_model_names=("tiny",), limits=ConnectionLimits(max_connections=2)))
    held = [_connect(url), _connect(url)]
    try:
        with _connect(url) as third:
            status, headers, body = _response(third)
            assert status == 503 and headers["retry-after"] == "1" and json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for s in held:
            s.close()
    deadline = time.time() + 5
    while True:  # the held connections are gone: served again
        try:
            assert httpx.get(url + "/v1/models", timeout=5).status_code == 200
            break
        except (httpx.HTTPError, AssertionError):
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def test_pooled_connection_survives_every_error(server, app_with, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from inflight.server.openai import routes as openai_routes

    keyed = app_with(ServerConfig(served_model_names=("tiny",), api_keys=("k",), max_body_bytes=2000))

    def chunked() -> Iterator[bytes]:
        yield b"x" * 5000

    async def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    errors = [
        (404, "GET", server.url + "/v1/nope", {}),
        (405, "GET", server.url + "/v1/completions", {}),
        (404, "POST", server.url + "/v1/completions/", {"json": {"prompt": "x"}}),  # no 307 redirect
        (400, "POST", server.url + "/v1/completions", {"content": b"{not json"}),
        (404, "POST", server.url + "/v1/completions", {"json": {"model": "other", "prompt": "x"}}),
        (401, "POST", keyed + "/v1/completions", {"json": {"prompt": "x"}}),
        (413, "POST", keyed + "/v1/completions", {"json": {"prompt": "x" * 3000}, "headers": {"authorization": "Bearer k"}}),
        (413, "POST", keyed + "/v1/completions", {"content": chunked(), "headers": {"authorization": "Bearer k"}}),
    ]
    with httpx.Client(timeout=60) as client:  # one pooled connection per server, reused throughout
        for status, method, url, kw in errors:
            r = client.request(method, url, **kw)
            assert r.status_code == status, (url, r.text)
            err = r.json()["error"]  # our error body, never {"detail": ...}
            assert err["message"] and err["type"] == "invalid_request_error", r.text
            ok = client.get(url.split("/v1")[0] + "/v1/models", headers={"authorization": "Bearer k"})
            assert ok.status_code == 200, (url, ok.text)
        monkeypatch.setattr(openai_routes, "completions", broken)
        r = client.post(server.url + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert r.headers["connection"] == "close"  # the pool opens a new connection for the next one
        assert client.get(server.url + "/v1/models").status_code == 200
    metrics = httpx.get(server.url + "/metrics").text
    assert 'endpoint="/v1/completions",status="405"' in metrics and 'endpoint="unmatched",status="404"' in metrics


def test_duplicate_streamed_id_is_400_before_the_stream(server) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    import threading

    from inflight import SamplingParams

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    held = server.engine.generate([5, 6, 7], SamplingParams(max_tokens=20, temperature=0.0), request_id="dup-1")
    asyncio.run_coroutine_threadsafe(anext(held), loop).result(timeout=30)  # "dup-1" is running (not yet read out)
    body = {"id": "dup-1", "text_input": "hello", "parameters": {"max_new_tokens": 5}}
    try:
        for path in ("/generate_stream", "/generate"):
            r = httpx.post(server.url + "/v2/models/tiny" + path, json=body, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == "id", r.text  # not a 200 and a broken stream
    finally:
        asyncio.run_coroutine_threadsafe(held.aclose(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
    assert httpx.post(server.url + "/v2/models/tiny/generate_stream", json=body, timeout=60).status_code == 200  # free again
    server.wait_idle(timeout=10)


def test_model_routes(server) -> None:  # type: ignore[no-untyped-def]
    card = httpx.get(server.url + "/v1/models/tiny").json()
    assert card["id"] == "tiny" and card["object"] == "model"
    missing = httpx.get(server.url + "/v1/models/no-such")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    meta = httpx.get(server.url + "/v2/models/tiny").json()
    assert meta["name"] == "tiny" and meta["inputs"][0]["name"] == "text_input"
    assert httpx.get(server.url + "/v2/models/tiny/ready").json()["ready"] is True
    assert httpx.get(server.url + "/v2/models/no-such/ready").status_code == 404
    assert httpx.get(server.url + "/health/ready").json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openai_finish_reason_stays_in_openai_values(server, path) -> None:  # type: ignore[no-untyped-def]
    # 0.02 s: the tiny model's 512 tokens (its length) take longer; a non-streamed request makes no
    # output before it ends, and at 0.2 s it could finish by length first
    body = {"max_tokens": 5000, "ignore_eos": True, "temperature": 0, "timeout": 0.02}
    body |= {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    choice = httpx.post(server.url + path, json=body, timeout=60).json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["finish_detail"] == "timeout"
    if "message" in choice:
        assert choice["message"]["refusal"] is None
    server.wait_idle(timeout=10)


def test_openapi_describes_the_real_bodies(server) -> None:  # type: ignore[no-untyped-def]
    doc = httpx.get(server.url + "/openapi.json").json()
    ops = {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v2/models/{model}/generate", "/v2/models/{model}/generate_stream"):
        op = ops[("post", path)]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].startswith("#/components/schemas/"), path
        assert {"200", "400", "404", "413", "429"} <= set(op["responses"]), path
        assert "401" not in op["responses"]  # no API keys on this server
    assert "text/event-stream" in ops[("post", "/v1/chat/completions")]["responses"]["200"]["content"]
    assert "text/plain" in ops[("get", "/metrics")]["responses"]["200"]["content"]
    assert not any("422" in op["responses"] for op in ops.values())
    # without --enable-lora the LoRA routes do not exist (vLLM's rule), so the document lists none
    assert not any("lora_adapter" in p for _, p in ops)
    r = httpx.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"})
    assert r.status_code == 404 and "error" in r.json()
    schemas = doc["components"]["schemas"]
    message = schemas["ChatCompletionResponse"]["properties"]["choices"]["items"]["properties"]["message"]
    assert "refusal" in message["required"]
    assert set(schemas["Error"]["properties"]["error"]["required"]) == {"message", "type", "param", "code"}
