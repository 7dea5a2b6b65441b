"""The real server on a loopback port, driven by the official openai client."""

from __future__ import annotations

import openai
import pytest


def _client(server) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def test_completion_and_stream_agree(server) -> None:  # type: ignore[no-untyped-def]
    client = _client(server)
    full = client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=12, temperature=0)
    assert full.choices[0].finish_reason in ("length", "stop")
    assert full.usage.completion_tokens >= 1
    pieces = client.completions.create(
        model="tiny", prompt="the quick brown fox", max_tokens=12, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in pieces)
    assert text == full.choices[0].text


def test_chat_stream_role_first_and_finish_last(server) -> None:  # type: ignore[no-untyped-def]
    client = _client(server)
    messages = [{"role": "user", "content": "hello there"}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content


def test_bad_field_is_400_naming_it(server) -> None:  # type: ignore[no-untyped-def]
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=4, temperature=-1)
    assert e.value.body["param"] == "temperature"
    # the engine still serves afterwards, and nothing leaked
    ok = client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens >= 1
    server.wait_idle()
