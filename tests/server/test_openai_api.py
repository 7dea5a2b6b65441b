"""OpenAI API shapes through the official `openai` client (sync and async) and raw HTTP."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest


def _client(server) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def test_completions_n_logprobs_and_usage(server) -> None:  # type: ignore[no-untyped-def]
    c = _client(server)
    r = c.completions.create(model="tiny", prompt=["the cat", "a dog"], n=2, max_tokens=5, temperature=0.9, seed=3, logprobs=2)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    for ch in r.choices:
        lp = ch.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
        assert all(len(t) >= 2 for t in lp.top_logprobs)  # chosen + top-2 (chosen may be among them)
    assert r.usage.completion_tokens == sum(len(ch.logprobs.tokens) for ch in r.choices)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = c.completions.create(model="tiny", prompt=["the cat", "a dog"], n=2, max_tokens=5, temperature=0.9, seed=3, logprobs=2)
    assert [ch.text for ch in again.choices] == [ch.text for ch in r.choices]  # seed reproducibility
    server.wait_idle()


def test_echo_with_logprobs_scores_the_prompt(server) -> None:  # type: ignore[no-untyped-def]
    c = _client(server)
    r = c.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=1, temperature=0, echo=True, logprobs=1)
    ch = r.choices[0]
    assert ch.text.startswith("the quick brown fox")
    assert ch.logprobs.token_logprobs[0] is None  # the first prompt token has no context
    n_prompt = r.usage.prompt_tokens
    assert len(ch.logprobs.tokens) == n_prompt + 1
    assert all(isinstance(x, float) for x in ch.logprobs.token_logprobs[1:])


def test_token_id_prompts_and_stop(server) -> None:  # type: ignore[no-untyped-def]
    c = _client(server)
    r = c.completions.create(model="tiny", prompt=[[5, 6, 7, 8], [9, 10, 11]], max_tokens=6, temperature=0)
    assert len(r.choices) == 2 and r.usage.prompt_tokens == 7
    text = r.choices[0].text
    if len(text) > 4:
        stop = text[2:4]
        s = c.completions.create(model="tiny", prompt=[[5, 6, 7, 8]], max_tokens=6, temperature=0, stop=stop)
        assert s.choices[0].text == text[: text.index(stop)] and s.choices[0].finish_reason == "stop"


def test_chat_logprobs_and_stream_usage(server) -> None:  # type: ignore[no-untyped-def]
    c = _client(server)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in content)
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]) == full.choices[0].message.content


def test_async_client_concurrent_streams(server) -> None:  # type: ignore[no-untyped-def]
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str]:
        kw = {"model": "tiny", "prompt": f"story {i}", "max_tokens": 8, "temperature": 0}
        full = await client.completions.create(**kw)
        stream = await client.completions.create(stream=True, **kw)
        return full.choices[0].text, "".join([ch.choices[0].text async for ch in stream])

    async def main() -> list[tuple[str, str]]:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x") as client:
            return await asyncio.gather(*(one(client, i) for i in range(6)))

    for full, streamed in asyncio.run(main()):
        assert full == streamed
    server.wait_idle()


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "x", "temperature": -0.1}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "top_p": 1.5}, "top_p"),
        ({"prompt": "x", "top_k": -2}, "top_k"),
        ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
        ({"prompt": "x", "frequency_penalty": -2.5}, "frequency_penalty"),
        ({"prompt": "x", "seed": -(2**63) - 1}, "seed"),
        ({"prompt": "x", "seed": 2**64}, "seed"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": 129, "temperature": 1}, "n"),
        ({"prompt": "x", "n": 2, "temperature": 0}, "n"),
        ({"prompt": "x", "best_of": 2, "temperature": 0}, "best_of"),
        ({"prompt": "x", "n": 3, "best_of": 2, "temperature": 1}, "best_of"),
        ({"prompt": "x", "logprobs": 6}, "logprobs"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": "x", "stop": "y" * 40000}, "stop"),
        ({"prompt": "x", "stream": 0}, "stream"),
        ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
        ({"prompt": "x", "n": True}, "n"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": "x" * (4 * 1024 * 1024 + 1)}, "prompt"),
        ({"prompt": [10**7]}, "prompt"),
        ({}, "prompt"),
        ({"prompt": "x", "priority": 0}, "priority"),
        ({"prompt": "x", "timeout": 0}, "timeout"),
        ({"prompt": "x", "timeout": 4000}, "timeout"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
        ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
        ({"prompt": "x", "user": 7}, "user"),
    ],
)
def test_completions_limits_are_400_naming_the_field(server, body, param) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": 5, "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": [{"role": "user", "content": "x", "name": {}}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x", "tool_call_id": 5}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2, "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]}, "messages"),  # was a 500 (schemathesis)
    ],
)
def test_chat_limits_are_400_naming_the_field(server, body, param) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_json_and_unknown_fields(server) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "some_future_field": {"a": 1}}, timeout=30)
    assert ok.status_code == 200
    # an integral float is an integer (JSON Schema's reading, and pydantic's in vLLM)
    three = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3.0, "temperature": 0, "ignore_eos": True, "user": "u1"}, timeout=30)
    assert three.status_code == 200 and three.json()["usage"]["completion_tokens"] == 3, three.text
    # ... in token-id arrays too: the same tokens as the integers
    ids = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
    as_ints = httpx.post(server.url + "/v1/completions", json=ids, timeout=30).json()
    as_floats = httpx.post(server.url + "/v1/completions", json={**ids, "prompt": [[5.0, 6.0, 7.0]]}, timeout=30).json()
    assert as_floats["choices"][0]["text"] == as_ints["choices"][0]["text"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": [5.0, 6]}, timeout=30).json() == httpx.post(
        server.url + "/detokenize", json={"tokens": [5, 6]}, timeout=30).json()  # fmt: skip
    for bad in ([5.5], [True]):
        assert httpx.post(server.url + "/detokenize", json={"tokens": bad}, timeout=30).status_code == 400
    # `user` is type-checked on embeddings as on chat and completions
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "x", "user": {}}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "user"
    server.wait_idle()


def test_prompt_logprobs_are_returned(server) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "one two three", "max_tokens": 1, "prompt_logprobs": 2}, timeout=60).json()
    pl = r["choices"][0]["prompt_logprobs"]
    assert pl[0] is None and len(pl) == r["usage"]["prompt_tokens"]
    assert all(isinstance(v["logprob"], float) and v["rank"] >= 1 for e in pl[1:] for v in e.values())
    chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 0}, timeout=60).json()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
