"""Every top-level field of /v1/responses and /v1/messages sent a wrong type, an out-of-range value
and null against the real server: a wrong or out-of-range value is a 400 naming the field (never a
500, never accepted and ignored); null is the field left out, or a 400 where it is required. Fast:
every accepted body generates at most 2 tokens of the scripted model."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

ASK = [{"role": "user", "content": "Which color?"}]
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
OK, BAD = 200, 400

# (field, value, expected status); None values are the null rows
RESPONSES: list[tuple[str, Any, int]] = [
    ("model", 5, BAD), ("model", None, OK),  # optional there: the served model
    ("input", 5, BAD), ("input", [], BAD), ("input", [{"role": "user", "content": 5}], BAD), ("input", None, BAD),
    ("instructions", 5, BAD), ("instructions", None, OK),
    ("max_output_tokens", "2", BAD), ("max_output_tokens", 0, BAD), ("max_output_tokens", 1e308, BAD),
    ("max_output_tokens", 2.5, BAD), ("max_output_tokens", None, OK),
    ("temperature", "0", BAD), ("temperature", -0.1, BAD), ("temperature", 2.5, BAD), ("temperature", None, OK),
    ("top_p", "1", BAD), ("top_p", 1.5, BAD), ("top_p", None, OK),
    ("text", 5, BAD), ("text", {"format": {"type": "xml"}}, BAD), ("text", {"format": 5}, BAD), ("text", None, OK),
    ("tools", 5, BAD), ("tools", [{"type": "web_search"}], BAD), ("tools", [{"type": "function", "name": 5}], BAD), ("tools", None, OK),
    ("tool_choice", 5, BAD), ("tool_choice", "sometimes", BAD), ("tool_choice", None, OK),
    ("parallel_tool_calls", "yes", BAD), ("parallel_tool_calls", None, OK),
    ("reasoning", 5, BAD), ("reasoning", {"effort": "huge"}, BAD), ("reasoning", {"effort": 5}, BAD), ("reasoning", None, OK),
    ("store", "yes", BAD), ("store", None, OK),
    ("previous_response_id", 5, BAD), ("previous_response_id", None, OK),
    ("metadata", 5, BAD), ("metadata", {"k": 5}, BAD), ("metadata", None, OK),
    ("stream", "yes", BAD), ("stream", None, OK),
    ("user", 5, BAD), ("user", None, OK),
    ("truncation", 5, BAD), ("truncation", "middle", BAD), ("truncation", None, OK),
    ("background", "no", BAD), ("background", True, BAD), ("background", None, OK),
    ("include", 5, BAD), ("include", ["reasoning.encrypted_content"], BAD), ("include", None, OK),
    ("top_logprobs", "x", BAD), ("top_logprobs", 30, BAD), ("top_logprobs", None, OK),
    ("service_tier", 5, BAD), ("service_tier", "flex", BAD), ("service_tier", None, OK),
    ("max_tool_calls", 3, BAD), ("max_tool_calls", None, OK),
    ("prompt_cache_key", 5, BAD), ("prompt_cache_key", None, OK),
    ("safety_identifier", 5, BAD), ("safety_identifier", None, OK),
    ("stream_options", 5, BAD), ("stream_options", None, OK),
    ("conversation", "conv_1", BAD), ("prompt", {"id": "p"}, BAD), ("context_management", [{}], BAD),
    ("seed", "x", BAD), ("seed", 2**70, BAD), ("seed", None, OK),  # this server's chat extensions
    ("top_k", "x", BAD), ("top_k", -2, BAD), ("min_p", 2, BAD), ("priority", 0, BAD), ("timeout", -1, BAD),
    ("timeout", 1e308, BAD), ("stop", 5, BAD), ("min_tokens", 1e308, BAD),
    ("no_such_field", 1, BAD), ("temprature", 0.5, BAD), ("messages", ASK, BAD), ("max_tokens", 2, BAD),
]  # fmt: skip

MESSAGES: list[tuple[str, Any, int]] = [
    ("model", 5, BAD), ("model", None, BAD),
    ("max_tokens", "2", BAD), ("max_tokens", 0, BAD), ("max_tokens", 1e308, BAD), ("max_tokens", 2.5, BAD), ("max_tokens", None, BAD),
    ("messages", 5, BAD), ("messages", [], BAD), ("messages", None, BAD),
    ("messages", [{"role": "user", "content": ""}], BAD), ("messages", [{"role": "user", "content": []}], BAD),
    ("messages", [{"role": "user", "content": [{"type": "text", "text": ""}]}], BAD),
    ("messages", [{"role": "user", "content": 5}], BAD), ("messages", [{"role": "user"}], BAD),
    ("messages", [*ASK, {"role": "assistant", "content": ""}], OK),  # only the final assistant turn may be empty
    ("system", 5, BAD), ("system", [{"type": "text", "text": 5}], BAD), ("system", None, OK),
    ("stop_sequences", "x", BAD), ("stop_sequences", [3], BAD), ("stop_sequences", None, OK),
    ("temperature", "0", BAD), ("temperature", -0.1, BAD), ("temperature", 5, BAD), ("temperature", 1.5, BAD), ("temperature", None, OK),
    ("top_p", "1", BAD), ("top_p", 1.5, BAD), ("top_p", -0.5, BAD), ("top_p", None, OK),
    ("top_k", "1", BAD), ("top_k", -1, BAD), ("top_k", 1.5, BAD), ("top_k", None, OK),
    ("tools", 5, BAD), ("tools", [{"name": 5}], BAD), ("tools", None, OK),
    ("tool_choice", "auto", BAD), ("tool_choice", {"type": "sometimes"}, BAD), ("tool_choice", None, OK),
    ("thinking", 5, BAD), ("thinking", {"type": "enabled", "budget_tokens": 1023}, BAD),
    ("thinking", {"type": "enabled", "budget_tokens": "2000"}, BAD), ("thinking", None, OK),
    ("output_config", 5, BAD), ("output_config", {"effort": "huge"}, BAD), ("output_config", None, OK),
    ("metadata", 5, BAD), ("metadata", {"user_id": 5}, BAD), ("metadata", None, OK),
    ("stream", "yes", BAD), ("stream", None, OK),
    ("service_tier", 5, BAD), ("service_tier", "priority", BAD), ("service_tier", None, OK),
    ("container", "c", BAD), ("mcp_servers", [{}], BAD), ("context_management", {}, BAD), ("inference_geo", "us", BAD),
    ("speed", "fast", BAD), ("cache_control", {"type": "ephemeral"}, BAD), ("diagnostics", {"x": 1}, BAD),
    ("seed", "x", BAD), ("seed", 2**70, BAD), ("seed", None, OK),  # this server's chat extensions
    ("min_p", 2, BAD), ("priority", 0, BAD), ("timeout", -1, BAD), ("timeout", 1e308, BAD), ("min_tokens", 1e308, BAD),
    ("no_such_field", 1, BAD), ("temprature", 0.5, BAD), ("max_completion_tokens", 2, BAD), ("stop", ["x"], BAD),
]  # fmt: skip


def test_every_field_of_both_apis_has_rows() -> None:
    """A field added to either API gets its rows here (the table would not fail otherwise)."""
    from inflight.server.anthropic import protocol as messages
    from inflight.server.responses import protocol as responses

    assert set(responses.OWN) - {f for f, _, _ in RESPONSES} == set()
    assert set(messages.OWN) - {f for f, _, _ in MESSAGES} == set()


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, headers={"Authorization": "Bearer key-a"}, timeout=60)


def _names_the_field(r: httpx.Response, field: str) -> bool:
    err = r.json()["error"]
    return field in err["message"] or err.get("param", "").startswith(field) if isinstance(err.get("param"), str) else field in err["message"]


@pytest.mark.parametrize(("field", "value", "status"), RESPONSES, ids=[f"{f}={v!r}"[:40] for f, v, _ in RESPONSES])
def test_responses_fields(reasoning_server, field: str, value: Any, status: int) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "input": "Which color?", "max_output_tokens": 2, "store": False, field: value}
    r = _post(reasoning_server.url + "/v1/responses", body)
    assert r.status_code == status, r.text
    if status == BAD:
        assert r.json()["error"]["type"] == "invalid_request_error" and _names_the_field(r, field), r.text


@pytest.mark.parametrize(("field", "value", "status"), MESSAGES, ids=[f"{f}={v!r}"[:40] for f, v, _ in MESSAGES])
def test_messages_fields(reasoning_server, field: str, value: Any, status: int) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "max_tokens": 2, "messages": ASK, field: value}
    r = _post(reasoning_server.url + "/v1/messages", body)
    assert r.status_code == status, r.text
    if status == BAD:
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert field in r.json()["error"]["message"], r.text


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
# (body changes, what the error names): keys an object of these APIs does not define are refused
# too, as OpenAI ("Unknown parameter: 'reasoning.foo'.") and Anthropic ("Extra inputs are not permitted") do
RESPONSES_NESTED: list[tuple[dict[str, Any], str]] = [
    ({"reasoning": {"effort": "low", "foo": 1}}, "reasoning.foo"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA, "foo": 1}}}, "text.format.foo"),
    ({"text": {"format": {"type": "text", "foo": 1}}}, "text.format.foo"),
    ({"tools": [{**TOOL, "foo": 1}]}, "tools[0].foo"),
    ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "f", "foo": 1}}, "tool_choice.foo"),
    ({"input": [{"role": "user", "content": "x", "foo": 1}]}, "input[0].foo"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "foo": 1}]}]}, "input[0].content[0].foo"),
    ({"stream_options": {"foo": 1}}, "stream_options"),
]  # fmt: skip

MESSAGES_NESTED: list[tuple[dict[str, Any], str]] = [
    ({"thinking": {"type": "disabled", "budget_tokens": 5}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "adaptive", "foo": 1}}, "thinking.foo"),
    ({"max_tokens": 3000, "thinking": {"type": "enabled", "budget_tokens": 2000, "foo": 1}}, "thinking.foo"),
    ({"tool_choice": {"type": "auto", "name": "f"}}, "tool_choice.name"),
    ({"tools": [{"name": "f", "input_schema": SCHEMA, "foo": 1}]}, "tools[0].foo"),
    ({"output_config": {"format": {"type": "json_schema", "schema": SCHEMA, "foo": 1}}}, "output_config.format.foo"),
    ({"messages": [{"role": "user", "content": "x", "foo": 1}]}, "messages[0].foo"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "foo": 1}]}]}, "messages[0].content[0].foo"),
    ({"system": [{"type": "text", "text": "x", "foo": 1}]}, "system[0].foo"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "named"), RESPONSES_NESTED, ids=[n for _, n in RESPONSES_NESTED])
def test_responses_nested_keys(reasoning_server, change: dict[str, Any], named: str) -> None:  # type: ignore[no-untyped-def]
    r = _post(reasoning_server.url + "/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 2, "store": False, **change})
    assert r.status_code == BAD and named in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(("change", "named"), MESSAGES_NESTED, ids=[n for _, n in MESSAGES_NESTED])
def test_messages_nested_keys(reasoning_server, change: dict[str, Any], named: str) -> None:  # type: ignore[no-untyped-def]
    r = _post(reasoning_server.url + "/v1/messages", {"model": "tiny", "max_tokens": 2, "messages": ASK, **change})
    assert r.status_code == BAD and named in r.json()["error"]["message"], r.text
