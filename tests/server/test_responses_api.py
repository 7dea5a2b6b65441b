"""OpenAI's Responses API with the official client (`responses.create` / `responses.stream`)
against the real server: reasoning items, text, function calls, structured output, the event
order, stored responses per API key, previous_response_id, and 400s for what is not honoured.

The model is scripted (inflight/testing/reasoning.py): greedy output is
`<think>The teacher wants a color</think>Blue today!`."""

from __future__ import annotations

import json

import openai
import pytest

from inflight.server.responses.store import ResponseStore
from inflight.testing.reasoning import ANSWER, THINKING

COLOR = {"type": "object", "properties": {"color": {"enum": ["blue", "red"]}}, "required": ["color"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(reasoning_server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=reasoning_server.url + "/v1", api_key="key-a", max_retries=0)


def test_create_splits_reasoning_and_text_and_is_stored(client) -> None:  # type: ignore[no-untyped-def]
    r = client.responses.create(model="tiny", input="Which color?", instructions="Be brief.", temperature=0, max_output_tokens=40)
    assert r.status == "completed" and r.output_text == ANSWER and r.id.startswith("resp_")
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THINKING
    assert message.type == "message" and message.status == "completed"
    assert r.usage.output_tokens == 13 and r.usage.output_tokens_details.reasoning_tokens == 8
    assert r.instructions == "Be brief." and r.max_output_tokens == 40
    got = client.responses.retrieve(r.id)
    assert got.output_text == ANSWER and got.id == r.id
    other = openai.OpenAI(base_url=str(client.base_url), api_key="key-b", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)  # stored per API key
    (item,) = client.responses.input_items.list(r.id).data
    assert item.type == "message" and item.role == "user" and item.content[0].text == "Which color?"
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_stream_events_in_order(client) -> None:  # type: ignore[no-untyped-def]
    with client.responses.stream(model="tiny", input="Which color?", temperature=0, max_output_tokens=40) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    firsts = [k for i, k in enumerate(kinds) if k not in kinds[:i]]
    assert firsts == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_text.delta", "response.output_text.done", "response.completed",
    ]  # fmt: skip
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == THINKING
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    assert final.output_text == ANSWER and final.usage.output_tokens_details.reasoning_tokens == 8


def test_function_call_streamed_and_followed_up(client) -> None:  # type: ignore[no-untyped-def]
    tools = [{"type": "function", "name": "pick", "parameters": COLOR, "strict": True}]
    with client.responses.stream(model="tiny", input="Pick one.", tools=tools, tool_choice="required",
                                 parallel_tool_calls=False, temperature=0, max_output_tokens=80) as s:
        events = list(s)
        final = s.get_final_response()
    call = final.output[-1]
    assert final.status == "completed" and [o.type for o in final.output] == ["reasoning", "function_call"]
    assert call.type == "function_call" and call.name == "pick" and json.loads(call.arguments)["color"] in ("blue", "red")
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == call.arguments
    # not streamed (the engine's one final output: the parser gets the whole text at once), the same call
    once = client.responses.create(model="tiny", input="Pick one.", tools=tools, tool_choice="required",
                                   parallel_tool_calls=False, temperature=0, max_output_tokens=80, store=False)  # fmt: skip
    assert [(o.type, getattr(o, "arguments", None)) for o in once.output] == [(o.type, getattr(o, "arguments", None)) for o in final.output]
    follow = client.responses.create(
        model="tiny", previous_response_id=final.id, temperature=0, max_output_tokens=40, tools=tools,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}],
    )  # fmt: skip
    assert follow.output_text == ANSWER and follow.previous_response_id == final.id
    assert follow.usage.input_tokens > final.usage.input_tokens  # the first turn is in the prompt
    items = client.responses.input_items.list(follow.id, order="asc", limit=1)
    assert [i.type for i in items.data] == ["function_call_output"] and not items.has_more


def test_json_schema_format_and_effort(client) -> None:  # type: ignore[no-untyped-def]
    r = client.responses.create(
        model="tiny", input="Which color?", temperature=0, max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "c", "schema": COLOR, "strict": True}},
    )  # fmt: skip
    assert json.loads(r.output_text)["color"] in ("blue", "red") and r.output[0].content[0].text == THINKING
    r = client.responses.create(model="tiny", input="Which color?", temperature=0, max_output_tokens=40, reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"] and r.output_text == ANSWER  # thinking budget 0
    assert r.usage.output_tokens_details.reasoning_tokens == 2 and r.reasoning.effort == "none"


def test_incomplete_at_max_output_tokens(client) -> None:  # type: ignore[no-untyped-def]
    r = client.responses.create(model="tiny", input="Which color?", temperature=0, max_output_tokens=4, store=False)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.output[0].content[0].text == "The teacher wants"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)  # store: false


@pytest.mark.parametrize(("extra", "param"), [
    ({"background": True}, "background"), ({"max_tokens": 5}, "max_tokens"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"), ({"previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"), ({"input": [{"type": "file_search_call"}]}, "input[0].type"),
])  # fmt: skip
def test_refused_fields_name_themselves(client, extra: dict, param: str) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 4} | extra
    with pytest.raises(openai.APIStatusError) as e:
        client.post("/responses", body=body, cast_to=dict)
    assert e.value.status_code in (400, 404) and e.value.body["param"] == param


def test_openais_refusals_through_its_client(client) -> None:  # type: ignore[no-untyped-def]
    """An unknown name is OpenAI's `unknown_parameter` 400; an int32 overflow and a temperature
    over 2 are 400s naming the field (1e308 was accepted and echoed back)."""
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input="hi", max_output_tokens=4, extra_body={"temprature": 0.5})
    assert e.value.body == {"message": "Unknown parameter: 'temprature'.", "type": "invalid_request_error",
                            "param": "temprature", "code": "unknown_parameter"}  # fmt: skip
    for kwargs, param in (({"max_output_tokens": 1e308}, "max_output_tokens"), ({"temperature": 2.5}, "temperature")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="tiny", input="hi", **{"max_output_tokens": 4, **kwargs})
        assert e.value.body["param"] == param
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=2, store=False, extra_body={"top_k": 1, "seed": 3})
    assert r.status == "incomplete"  # this server's chat extensions are still honoured


def test_store_bounds_entries_and_bytes() -> None:
    s = ResponseStore(max_entries=2, max_bytes=400)
    for i in range(3):
        assert s.put("k", {"id": f"r{i}", "text": "x" * 50}, [])
    assert s.get("k", "r0") is None and s.get("k", "r1") is not None and len(s) == 2
    s.get("k", "r1")  # most recently used now: r2 goes first
    assert s.put("k", {"id": "big", "text": "y" * 200}, [])
    assert s.get("k", "r2") is None and s.get("k", "r1") is not None and s.num_bytes <= 400
    assert not s.put("k", {"id": "huge", "text": "z" * 500}, [])  # larger than the whole store
    assert s.get("other", "r1") is None and not s.delete("other", "r1") and s.delete("k", "r1")


DEEP: dict = {}
for _ in range(300):
    DEEP = {"a": DEEP}
GARBAGE = [
    {"input": 5}, {"input": []}, {"input": [5]}, {"input": [{"role": ["user"], "content": "x"}]},
    {"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, {"input": "x", "reasoning": {"effort": ["high"]}},
    {"input": "x", "reasoning": "high"}, {"input": "x", "text": {"format": {"type": "json_schema", "schema": 3}}},
    {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 3}]}, {"input": "x", "tool_choice": [1]},
    {"input": "x", "metadata": {"k": 1}}, {"input": "x", "max_output_tokens": "9"}, {"input": "x", "store": "yes"},
    {"input": [{"type": "function_call", "call_id": 1}]}, {"input": "x", "instructions": ["a"]},
    {"input": "x", "priority": 9}, {"input": "x", "timeout": -1}, {"input": "x", "top_k": "x"},  # chat's controls reach the engine request
    {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "x": DEEP}}]},  # echoed: a 500 (pydantic)
]  # fmt: skip


@pytest.mark.parametrize("body", GARBAGE)
def test_bad_bodies_are_400s(reasoning_server, body: dict) -> None:  # type: ignore[no-untyped-def]
    import httpx

    r = httpx.post(reasoning_server.url + "/v1/responses", json={"model": "tiny"} | body, headers={"Authorization": "Bearer key-a"})
    assert r.status_code == 400 and r.json()["error"]["param"], r.text


@pytest.mark.parametrize("query", ["limit=%C2%B2", "limit=0", "limit=101", "limit=x", "order=up", "after=nope"])  # ²: was a 500
def test_bad_input_items_queries_are_400s(client, reasoning_server, query: str) -> None:  # type: ignore[no-untyped-def]
    import httpx

    r = client.responses.create(model="tiny", input="hi", max_output_tokens=1)
    got = httpx.get(f"{reasoning_server.url}/v1/responses/{r.id}/input_items?{query}", headers={"Authorization": "Bearer key-a"})
    assert got.status_code == 400 and got.json()["error"]["param"] in ("limit", "order", "after"), got.text


def test_openapi_lists_the_routes(reasoning_server) -> None:  # type: ignore[no-untyped-def]
    import httpx

    paths = httpx.get(reasoning_server.url + "/openapi.json", headers={"x-api-key": "key-a"}).json()["paths"]
    assert {"200", "400", "401", "404"} <= set(paths["/v1/responses"]["post"]["responses"])
    assert "text/event-stream" in paths["/v1/responses"]["post"]["responses"]["200"]["content"]
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"} and "/v1/messages" in paths
    for path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):  # an empty body is a 400: documented
        assert paths[path]["post"]["requestBody"]["required"] and "400" in paths[path]["post"]["responses"]
        assert "model" in paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]["required"] or path == "/v1/responses"
    assert paths["/v1/messages"]["post"]["responses"]["400"]["content"]["application/json"]["schema"]["properties"]["type"] == {"const": "error"}
    r = httpx.options(reasoning_server.url + "/v1/responses/resp_x", headers={"x-api-key": "key-a"})
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET"  # was GET alone


def test_truncation_auto_drops_the_beginning(client, reasoning_server) -> None:  # type: ignore[no-untyped-def]
    limit = reasoning_server.engine.model_info.max_prompt_len
    long = "Which color?" + " the" * (limit + 100)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input=long, temperature=0, max_output_tokens=20, store=False)
    r = client.responses.create(model="tiny", input=long, temperature=0, max_output_tokens=20, store=False, truncation="auto")
    assert r.truncation == "auto" and r.output_text == ANSWER and r.usage.input_tokens <= limit, (r.status, r.output, r.usage, limit)
