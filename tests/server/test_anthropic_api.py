"""Anthropic's Messages API with the official `anthropic` client against the real server:
thinking / text / tool_use blocks, the stream's event sequence, tool results in a follow-up,
stop sequences, count_tokens, x-api-key, and Anthropic's error shape.

The model is scripted (inflight/testing/reasoning.py): greedy output is
`<think>The teacher wants a color</think>Blue today!`."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from inflight.testing.reasoning import ANSWER, THINKING

COLOR = {"type": "object", "properties": {"color": {"enum": ["blue", "red"]}}, "required": ["color"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Which color?"}]
GREEDY = {"temperature": 0}  # Anthropic's fields; this client version has no keyword for them any more


@pytest.fixture(scope="module")
def client(reasoning_server):  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(base_url=reasoning_server.url, api_key="key-a", max_retries=0)


def test_message_with_thinking_and_text(client) -> None:  # type: ignore[no-untyped-def]
    m = client.messages.create(model="tiny", max_tokens=40, messages=ASK, extra_body=GREEDY, system="Be brief.")
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == THINKING and m.content[1].text == ANSWER
    assert m.stop_reason == "end_turn" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.usage.output_tokens == 13 and m.usage.input_tokens + m.usage.cache_read_input_tokens > 0


def test_stream_event_sequence(client) -> None:  # type: ignore[no-untyped-def]
    with client.messages.stream(model="tiny", max_tokens=40, messages=ASK, extra_body=GREEDY) as s:
        events = list(s)
        final = s.get_final_message()
    raw = [e.type for e in events if e.type in ("message_start", "content_block_start", "content_block_delta",
                                                  "content_block_stop", "message_delta", "message_stop")]  # fmt: skip
    collapsed = [k for i, k in enumerate(raw) if i == 0 or raw[i - 1] != k]
    assert collapsed == [
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THINKING
    assert "".join(d.text for d in deltas if d.type == "text_delta") == ANSWER
    assert final.content[0].thinking == THINKING and final.content[1].text == ANSWER and final.stop_reason == "end_turn"


def test_tool_use_streamed_then_tool_result(client) -> None:  # type: ignore[no-untyped-def]
    tools = [{"name": "pick", "description": "Pick a color", "input_schema": COLOR}]
    choice = {"type": "any", "disable_parallel_tool_use": True}
    with client.messages.stream(model="tiny", max_tokens=80, messages=ASK, tools=tools, tool_choice=choice, extra_body=GREEDY) as s:
        events = list(s)
        final = s.get_final_message()
    use = final.content[-1]
    assert final.stop_reason == "tool_use" and use.type == "tool_use" and use.name == "pick" and use.id.startswith("toolu_")
    assert use.input["color"] in ("blue", "red")
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == use.input
    # not streamed (the engine's one final output: the parser gets the whole text at once), the same call
    once = client.messages.create(model="tiny", max_tokens=80, messages=ASK, tools=tools, tool_choice=choice, extra_body=GREEDY)
    assert [b.type for b in once.content] == [b.type for b in final.content] and once.content[-1].input == use.input
    assert once.stop_reason == "tool_use" and once.usage.output_tokens == final.usage.output_tokens
    follow = client.messages.create(
        model="tiny", max_tokens=40, extra_body=GREEDY, tools=tools,
        messages=[*ASK, {"role": "assistant", "content": final.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "blue it is"}]}],
    )  # fmt: skip
    assert follow.content[-1].text == ANSWER and follow.stop_reason == "end_turn"


def test_thinking_budget_stop_sequences_and_output_format(client) -> None:  # type: ignore[no-untyped-def]
    # Anthropic's floor of 1024: the scripted thinking (5 tokens) ends on its own, as it would there
    m = client.messages.create(model="tiny", max_tokens=1025, messages=ASK, extra_body=GREEDY, thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.content[0].thinking == THINKING and m.content[1].text == ANSWER
    m = client.messages.create(model="tiny", max_tokens=40, messages=ASK, extra_body=GREEDY, thinking={"type": "disabled"})
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == ANSWER  # enable_thinking false
    m = client.messages.create(model="tiny", max_tokens=40, messages=ASK, extra_body=GREEDY, stop_sequences=[" today"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == " today" and m.content[-1].text == "Blue"
    m = client.messages.create(model="tiny", max_tokens=4, messages=ASK, extra_body=GREEDY)
    assert m.stop_reason == "max_tokens" and m.content[0].thinking == "The teacher wants"
    m = client.messages.create(model="tiny", max_tokens=4, messages=ASK, extra_body={"temperature": 1.0, "top_k": 1, "top_p": 0.5})
    assert m.stop_reason == "max_tokens" and m.content[0].thinking == "The teacher wants"
    m = client.messages.create(model="tiny", max_tokens=60, messages=ASK,
                               extra_body=GREEDY | {"output_config": {"format": {"type": "json_schema", "schema": COLOR}}})  # fmt: skip
    assert json.loads(m.content[-1].text)["color"] in ("blue", "red")


def test_count_tokens(client) -> None:  # type: ignore[no-untyped-def]
    n = client.messages.count_tokens(model="tiny", messages=ASK).input_tokens
    m = client.messages.create(model="tiny", max_tokens=1, messages=ASK, extra_body=GREEDY)
    assert n == m.usage.input_tokens + m.usage.cache_read_input_tokens > 0
    with_system = client.messages.count_tokens(model="tiny", messages=ASK, system="A much longer system prompt here.").input_tokens
    assert with_system > n


def test_errors_in_anthropics_shape(client, reasoning_server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=10, messages=ASK, tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "tools[0]" in e.value.body["error"]["message"]
    r = httpx.post(reasoning_server.url + "/v1/messages", json={"model": "tiny", "messages": ASK}, headers={"x-api-key": "key-a"})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(reasoning_server.url + "/v1/messages", json={"model": "tiny", "messages": ASK, "max_tokens": 4, "top_k": "x"}, headers={"x-api-key": "key-a"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error" and "top_k" in r.json()["error"]["message"]
    bad = anthropic.Anthropic(base_url=reasoning_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model="tiny", max_tokens=10, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=10, messages=ASK)


def test_anthropics_ranges_through_its_client(client) -> None:  # type: ignore[no-untyped-def]
    """What Anthropic refuses is refused here too, naming the field, as the official client sends it."""
    refusals = [
        ({"extra_body": {"temperature": 5}}, "temperature"),  # Anthropic's range is [0, 1]
        ({"messages": [{"role": "user", "content": ""}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, "messages[0].content[0].text"),
        ({"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 2000}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1000}}, "thinking.budget_tokens"),
        ({"extra_body": {"no_such_field": 1}}, "no_such_field: Extra inputs are not permitted"),
    ]
    for change, named in refusals:
        kwargs = {"model": "tiny", "max_tokens": 4, "messages": ASK, **change}
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(**kwargs)
        assert e.value.body["error"]["type"] == "invalid_request_error" and named in e.value.body["error"]["message"], change
    prefill = client.messages.create(model="tiny", max_tokens=2, messages=[*ASK, {"role": "assistant", "content": ""}])
    assert prefill.stop_reason == "max_tokens"  # a final assistant turn may be empty


GARBAGE = [
    {"messages": 5}, {"messages": []}, {"messages": [{"role": "system", "content": "x"}]},
    {"messages": [{"role": "user", "content": [{"type": "document"}]}]}, {"messages": [{"role": "user", "content": [5]}]},
    {"messages": ASK, "system": [{"type": "image"}]}, {"messages": ASK, "thinking": {"type": "on"}},
    {"messages": ASK, "thinking": {"type": "enabled"}}, {"messages": ASK, "tool_choice": {"type": "tool"}},
    {"messages": ASK, "thinking": {"type": "enabled", "budget_tokens": -1}},
    {"messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 2}},  # Anthropic: at least 1024
    {"messages": ASK, "output_config": {"effort": ["max"]}}, {"messages": ASK, "output_config": {"format": {"type": "json_schema"}}},
    {"messages": ASK, "tools": [{"name": "f", "input_schema": 3}]}, {"messages": ASK, "stop_sequences": [3]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, {"messages": ASK, "max_tokens": 0},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
    {"messages": ASK, "priority": 0}, {"messages": ASK, "min_p": 2}, {"messages": ASK, "echo": True},
    {"messages": ASK, "thinking_token_budget": 3}, {"messages": ASK, "best_of": 2},  # chat's controls reach the engine request
    {"messages": ASK, "thinking": {"type": "disabled"}, "chat_template_kwargs": "x"},  # was a 500 (TypeError)
    {"messages": ASK, "metadata": {"user_id": 5}}, {"messages": ASK, "metadata": {"tags": ["x"]}},  # were accepted, unread
    {"messages": ASK, "tools": [{"name": "f", "input_schema": json.loads('{"a": ' * 600 + "{}" + "}" * 600)}]},  # a 500 (RecursionError)
    {"messages": ASK, "tools": [{"name": "f"}], "tool_choice": {"type": "auto", "disable_parallel_tool_use": "x"}},
]  # fmt: skip


@pytest.mark.parametrize("body", GARBAGE)
def test_bad_bodies_are_400s(reasoning_server, body: dict) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(reasoning_server.url + "/v1/messages", json={"model": "tiny", "max_tokens": 4} | body, headers={"x-api-key": "key-a"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    if "thinking" in body and "budget_tokens" in body["thinking"]:
        assert "thinking.budget_tokens" in r.json()["error"]["message"]


@pytest.mark.parametrize("body", [
    {"messages": 5}, {"messages": [{"role": "user", "content": [{"type": "document"}]}]}, {"messages": ASK, "system": 5},
    {"messages": ASK, "thinking": {"type": "disabled"}, "chat_template_kwargs": [1]},  # was a 500 (TypeError)
])  # fmt: skip
def test_bad_bodies_are_400s_when_counting(reasoning_server, body: dict) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(reasoning_server.url + "/v1/messages/count_tokens", json={"model": "tiny"} | body, headers={"x-api-key": "key-a"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
