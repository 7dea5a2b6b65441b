"""Reasoning over chat with the openai client: thinking apart from the answer, streamed in order
with no tag leaking, `enable_thinking` false, `include_reasoning` false, reasoning token counts.

The model is scripted (inflight/testing/reasoning.py): greedy decoding writes
`<think>The teacher wants a color</think>Blue today!`, so every split below is exact."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from inflight.testing.reasoning import ANSWER, THINKING

MESSAGES = [{"role": "user", "content": "Which color?"}]


@pytest.fixture(scope="module")
def client(reasoning_server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=reasoning_server.url + "/v1", api_key="key-a", max_retries=0)


def test_chat_splits_thinking_from_the_answer(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=40)
    m = r.choices[0].message
    assert m.content == ANSWER and r.choices[0].finish_reason == "stop"
    extra = m.model_extra or {}
    assert extra["reasoning_content"] == THINKING == extra["reasoning"]
    # <think> + 6 thinking tokens + </think>; the answer's 4 and the stop token are not reasoning
    assert r.usage.completion_tokens_details.reasoning_tokens == 8
    assert r.usage.completion_tokens == 8 + 4 + 1  # the stop token counts as generated


def test_streaming_sends_reasoning_then_content(client) -> None:  # type: ignore[no-untyped-def]
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=40, stream=True, stream_options={"include_usage": True},
    ))  # fmt: skip
    kinds, reasoning, content = [], "", ""
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        r = (d.model_extra or {}).get("reasoning_content")
        if r:
            kinds.append("r")
            reasoning += r
        if d.content:
            kinds.append("c")
            content += d.content
    assert reasoning == THINKING and content == ANSWER
    assert "<" not in reasoning + content  # no piece of a tag in either
    assert kinds == sorted(kinds, reverse=True) and kinds.count("r") >= 5  # all thinking first, token by token
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 8


def test_enable_thinking_false_gives_the_answer_only(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=40,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    m = r.choices[0].message
    assert m.content == ANSWER and "reasoning_content" not in (m.model_extra or {})
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_thinking_cut_by_max_tokens_has_no_content(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=4)
    m = r.choices[0].message
    assert m.content is None and (m.model_extra or {})["reasoning_content"] == "The teacher wants"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens_details.reasoning_tokens == 4


def test_include_reasoning_false_drops_the_thinking(reasoning_server) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 40, "include_reasoning": False}
    r = httpx.post(reasoning_server.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer key-a"})
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] == ANSWER and "reasoning_content" not in msg


COLOR = {"type": "object", "properties": {"color": {"enum": ["blue", "red"]}}, "required": ["color"], "additionalProperties": False}


def test_thinking_budget_forces_the_end_of_thinking(client, reasoning_server) -> None:  # type: ignore[no-untyped-def]
    """Past 2 thinking tokens </think> is forced; the script then answers as ever."""
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=40, extra_body={"thinking_token_budget": 2},
    )  # fmt: skip
    m = r.choices[0].message
    assert (m.model_extra or {})["reasoning_content"] == "The teacher" and m.content == ANSWER
    assert r.usage.completion_tokens_details.reasoning_tokens == 4  # <think>, 2 tokens, </think>
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=40, extra_body={"thinking_token_budget": 0},
    )  # fmt: skip
    assert (r.choices[0].message.model_extra or {})["reasoning_content"] == "" and r.choices[0].message.content == ANSWER
    end = reasoning_server.engine.tokenizer.convert_tokens_to_ids("</think>")  # a bias against it does not stop the budget
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=40, extra_body={"thinking_token_budget": 3}, logit_bias={str(end): -100},
    )  # fmt: skip
    assert (r.choices[0].message.model_extra or {})["reasoning_content"] == "The teacher wants"
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=40, reasoning_effort="none")
    assert (r.choices[0].message.model_extra or {})["reasoning_content"] == "" and r.usage.completion_tokens_details.reasoning_tokens == 2


def test_structured_output_starts_after_the_thinking(client) -> None:  # type: ignore[no-untyped-def]
    """The grammar leaves the thinking free (the script's own) and constrains the answer only."""
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": COLOR, "strict": True}}
    for stream in (False, True):
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=60, response_format=fmt, stream=stream)
        if stream:
            parts = [ch.choices[0].delta for ch in r if ch.choices]
            reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in parts)
            content = "".join(d.content or "" for d in parts)
        else:
            reasoning, content = (r.choices[0].message.model_extra or {})["reasoning_content"], r.choices[0].message.content
        assert reasoning == THINKING
        assert json.loads(content)["color"] in ("blue", "red")


def test_tool_call_after_the_thinking(client) -> None:  # type: ignore[no-untyped-def]
    tools = [{"type": "function", "function": {"name": "pick", "parameters": COLOR}}]
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=80, tools=tools, tool_choice="required")
    c = r.choices[0]
    assert (c.message.model_extra or {})["reasoning_content"] == THINKING
    assert c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.name == "pick"
    assert json.loads(c.message.tool_calls[0].function.arguments)["color"] in ("blue", "red")


def test_budget_needs_a_reasoning_parser(reasoning_server) -> None:  # type: ignore[no-untyped-def]
    from inflight.server.app import build_app
    from inflight.server.config import ServerConfig

    app = build_app(reasoning_server.engine, ServerConfig(served_model_names=("tiny",), reasoning_parser="none"))
    with TestClient(app) as tc:
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "thinking_token_budget": 3}
        r = tc.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget"
        r = tc.post("/v1/chat/completions", json=body | {"thinking_token_budget": -1})
        assert r.status_code == 400
        body.pop("thinking_token_budget")
        assert "<think>" in tc.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"messages": MESSAGES}), ("/v1/messages/count_tokens", {"messages": MESSAGES}),
])  # fmt: skip
@pytest.mark.parametrize("key", ["messages", "tok"])  # both were a 500 (TypeError)
def test_template_kwargs_cannot_replace_the_messages(reasoning_server, path: str, body: dict, key: str) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "max_tokens": 2, "chat_template_kwargs": {key: 5}} | body
    if path == "/v1/responses":
        body["max_output_tokens"] = body.pop("max_tokens")
    r = httpx.post(reasoning_server.url + path, json=body, headers={"x-api-key": "key-a"})
    assert r.status_code == 400 and f"chat_template_kwargs.{key}" in r.json()["error"]["message"], r.text


def test_deepseek_r1_parser_begins_inside_the_thinking(reasoning_server) -> None:  # type: ignore[no-untyped-def]
    """deepseek_r1 starts in thinking; the script's own <think> is the repeated tag (dropped, and
    not counted against the budget)."""
    from inflight.server.app import build_app
    from inflight.server.config import ServerConfig

    app = build_app(reasoning_server.engine, ServerConfig(served_model_names=("tiny",), reasoning_parser="deepseek_r1"))
    with TestClient(app) as tc:
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 40, "temperature": 0, "thinking_token_budget": 2}
        msg = tc.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert msg["reasoning_content"] == "The teacher" and msg["content"] == ANSWER


def test_serve_options_for_the_reasoning_parser() -> None:
    import argparse

    from inflight.server import options

    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    opts = options.load(parser.parse_args(["--model", "m", "--reasoning-parser", "tags", "--reasoning-start-token", "<s:t>",
                                           "--reasoning-end-token", "</s:t>", "--responses-store-size", "3"]))  # fmt: skip
    cfg = options.server_config(opts, ("m",))
    assert cfg.reasoning_tags == ("<s:t>", "</s:t>") and cfg.responses_store_size == 3
    for bad in (["--reasoning-parser", "tags"], ["--reasoning-start-token", "<a>", "--reasoning-end-token", "</a>"],
                ["--responses-store-size", "-1"]):  # fmt: skip
        with pytest.raises(options.ConfigError):
            options.load(parser.parse_args(["--model", "m", *bad]))
