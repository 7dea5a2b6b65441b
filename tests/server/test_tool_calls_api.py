"""Tool calling over HTTP with the openai client: tool_choice none/auto/required/named, streaming
deltas, multi-turn round trips, malformed calls, and 400s.

The model is a tiny random-weight Qwen2 whose tokenizer has Qwen2.5's `<tool_call>` and
`</tool_call>` added tokens and a Hermes-style chat template that renders tools, so the format is
detected from the template (no --tool-call-parser). Its free output is noise: every valid call
below is the grammar's doing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
import uvicorn

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.server.app import build_app
from inflight.testing import make_tiny_checkpoint

HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions.\n<tools>"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools>\n"
    'Answer calls as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n{%- endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{% if m.content %}{{ m.content }}\n{% endif %}"
    "{%- for tc in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "options": {"type": "object", "properties": {"hourly": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}}, "required": ["hourly"], "additionalProperties": False},
    },
    "required": ["city", "unit", "options"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "Europe/Paris", "東京"]}}, "required": ["zone"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME, "strict": True}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What's the weather in Zürich?"}]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory) -> Iterator[tuple[str, AsyncEngine]]:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    path = make_tiny_checkpoint("qwen2", tmp_path_factory.mktemp("tool_model"), vocab_size=1024, max_position_embeddings=4096)
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # as Qwen2.5: added, not special
    tok.chat_template = HERMES_TEMPLATE
    tok.save_pretrained(path)
    engine = AsyncEngine(LLMEngine.from_args(str(path), dtype="float32", device="cpu", progress=False))
    srv = uvicorn.Server(uvicorn.Config(build_app(engine, "tiny"), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}", engine
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


@pytest.fixture(scope="module")
def client(tool_server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=tool_server[0] + "/v1", api_key="x", max_retries=0)


def _tool_call_token(engine: AsyncEngine) -> int:
    return engine.tokenizer.convert_tokens_to_ids("<tool_call>")


def _check_calls(message, names: set[str]) -> None:  # type: ignore[no-untyped-def]
    assert message.tool_calls, message
    assert message.content is None or "<tool_call>" not in message.content
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        assert call.function.arguments == json.dumps(args, ensure_ascii=False)  # response_format's separators: no free whitespace


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_gives_valid_calls(client, seed: int) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        temperature=1.0, seed=seed, max_tokens=300,
    )  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c, r.usage)
    _check_calls(c.message, {"get_weather", "get_time"})


def test_required_parallel_calls(client, tool_server) -> None:  # type: ignore[no-untyped-def]
    """Parallel calls: a random model keeps calling, so EOS (allowed after each complete call) gets
    a mild bias to end within the budget."""
    eos = tool_server[1].tokenizer.eos_token_id
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=1.0, seed=9,
        max_tokens=1500, logit_bias={str(eos): 2},
    )  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c, r.usage)
    assert len(c.message.tool_calls) >= 2
    _check_calls(c.message, {"get_weather", "get_time"})
    assert len({tc.id for tc in c.message.tool_calls}) == len(c.message.tool_calls)


def test_named_function_only_that_one(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=1.0, seed=4, max_tokens=300, n=3,
    )  # fmt: skip
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
        _check_calls(c.message, {"get_time"})


def test_auto_with_forced_start_gives_a_valid_call(client, tool_server) -> None:  # type: ignore[no-untyped-def]
    bias = {str(_tool_call_token(tool_server[1])): 100}
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False,
        logit_bias=bias, temperature=1.0, seed=5, max_tokens=300,
    )  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    _check_calls(c.message, {"get_weather", "get_time"})


def test_auto_without_a_call_is_plain_content_and_none_never_parses(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=12)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=12)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_deltas_concatenate_to_the_non_streamed_calls(client, tool_server, choice) -> None:  # type: ignore[no-untyped-def]
    eos = tool_server[1].tokenizer.eos_token_id
    kw = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=choice, temperature=1.0, seed=3, max_tokens=1500,
              logit_bias={str(eos): 2})  # fmt: skip
    whole = client.chat.completions.create(**kw).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        assert not (d.content and "<tool_call>" in d.content)
        for tc in d.tool_calls or []:
            if tc.index not in calls:  # the first delta of a call names it
                assert tc.id and tc.function.name and tc.type == "function"
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.id is None and tc.function.name is None
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" == whole.finish_reason
    assert [c["name"] for c in calls.values()] == [t.function.name for t in whole.message.tool_calls]
    assert [c["arguments"] for c in calls.values()] == [t.function.arguments for t in whole.message.tool_calls]


def test_multi_turn_round_trip(client, tool_server) -> None:  # type: ignore[no-untyped-def]
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=1.0, seed=1, max_tokens=300)
    msg = first.choices[0].message
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [tc.model_dump() for tc in msg.tool_calls]},
        *[{"role": "tool", "tool_call_id": tc.id, "content": '{"temperature": 21, "note": "sunny ☀"}'} for tc in msg.tool_calls],
    ]
    # a named enum-only function: a short call whatever the noise model prefers
    second = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
                                            temperature=1.0, seed=2, max_tokens=300)  # fmt: skip
    _check_calls(second.choices[0].message, {"get_time"})
    # the prompt really holds the earlier call (its arguments as JSON) and the tool's answer
    tok = tool_server[1].tokenizer
    from inflight.engine.tokenizer import apply_chat_template
    from inflight.server.openai.protocol import chat_messages

    text = apply_chat_template(tok, chat_messages({"messages": history}), add_generation_prompt=True, tools=TOOLS)
    args = json.loads(msg.tool_calls[0].function.arguments)
    assert json.dumps(args, ensure_ascii=False) in text and "<tool_response>" in text and "sunny ☀" in text


def test_call_cut_by_max_tokens_is_length_not_markup(client, tool_server) -> None:  # type: ignore[no-untyped-def]
    """A call cut off by max_tokens: finish_reason "length" (OpenAI's), no raw markup, no error."""
    bias = {str(_tool_call_token(tool_server[1])): 100}
    kw = dict(model="tiny", messages=MESSAGES, tools=TOOLS, logit_bias=bias, temperature=1.0, seed=5, max_tokens=12)
    c = client.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "length" and "error" not in (c.model_extra or {})
    assert not c.message.content or "<tool_" not in c.message.content
    for call in c.message.tool_calls or []:  # the call as far as it got
        assert call.function.name in SCHEMAS
    chunks = [ch for ch in client.chat.completions.create(**kw, stream=True) if ch.choices]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "<tool_" not in "".join(ch.choices[0].delta.content or "" for ch in chunks)


@pytest.mark.parametrize("max_tokens", [2, 40])
def test_named_call_cut_by_max_tokens_is_returned_partial(client, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
    """A named tool_choice cut off by max_tokens, before its name was written (2) or inside its
    arguments (40): the call comes back as OpenAI returns it, with finish_reason "length"."""
    kw = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
              temperature=1.0, seed=4, max_tokens=max_tokens)  # fmt: skip
    c = client.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "length" and not c.message.content
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert isinstance(call.function.arguments, str) and "<tool_" not in call.function.arguments
    if max_tokens == 2:
        assert call.function.arguments == ""
    chunks = [ch for ch in client.chat.completions.create(**kw, stream=True) if ch.choices]
    assert chunks[-1].choices[0].finish_reason == "length"
    calls = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function.name == "get_weather" and {tc.index for tc in calls} == {0}
    assert "".join(tc.function.arguments or "" for tc in calls) == call.function.arguments


# the Berkeley Function-Calling Leaderboard's schemas as clients send them: a `format` on a
# number, a keyword outside JSON Schema, a required name that is not a property
BFCL_TOOL = {"type": "function", "function": {"name": "calculate_tax", "description": "Tax on an amount", "parameters": {
    "type": "object", "properties": {"amount": {"type": "number", "format": "float", "description": "the amount"},
                                     "rate": {"type": "number", "optional": True}},
    "required": ["amount", "currency"]}}}  # fmt: skip


def test_non_strict_tool_schemas_are_relaxed_strict_ones_refused(client, tool_server) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[BFCL_TOOL], tool_choice="required", temperature=1.0, seed=6, max_tokens=300)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    args = json.loads(c.message.tool_calls[0].function.arguments)
    assert isinstance(args["amount"], (int, float)) and set(args) <= {"amount", "rate"}
    warnings = r.model_extra["warnings"]
    assert any("'float'" in w and "not enforced" in w for w in warnings) and any("optional" in w for w in warnings)
    assert any("currency" in w for w in warnings) and not any("string format" in w for w in warnings)
    strict = {"type": "function", "function": {**BFCL_TOOL["function"], "strict": True}}
    bad = httpx.post(tool_server[0] + "/v1/chat/completions", json={"messages": MESSAGES, "tools": [strict], "max_tokens": 4}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools" and "cannot be enforced" in bad.json()["error"]["message"]


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [TOOLS[0]] * 2}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(33)]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}]}, "tools"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_invalid_tool_requests_are_400(tool_server, extra, param) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(tool_server[0] + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_no_tool_format_is_400(server) -> None:  # type: ignore[no-untyped-def]
    """The plain ChatML tiny model has no tool-call markup in its template."""
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "tools": TOOLS}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_blocks_are_freed(tool_server) -> None:  # type: ignore[no-untyped-def]
    engine = tool_server[1].engine
    deadline = time.time() + 5
    while engine.has_unfinished_requests() and time.time() < deadline:
        time.sleep(0.01)
    engine.kv.pool.check_idle()
    assert Path(engine.config.model.path).exists()


DELIVERY_TOOL = {  # mindie-chat-completions.txt, the multi-turn samples' tool
    "type": "function",
    "function": {
        "name": "get_delivery_date", "strict": True,
        "description": "Get the delivery date for a customer's order. Call this whenever you need to know the delivery date, for example when a customer asks 'Where is my package'",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description": "The customer's order ID."}},
                       "required": ["order_id"], "additionalProperties": False},
    },
}  # fmt: skip


def test_mindie_multi_turn_samples(tool_server) -> None:  # type: ignore[no-untyped-def]
    """The reference's own request bodies: a tool offered under "auto", then the round trip with an
    assistant message that has tool_calls and no content, and the tool's answer."""
    url = tool_server[0] + "/v1/chat/completions"
    sample1 = {
        "model": "tiny", "messages": [{"role": "system", "content": "You are a student who is good at math."},
                                      {"role": "user", "content": "Hi, can you tell me the delivery date for my order? my order id is 12345."}],
        "stream": False, "presence_penalty": 1.03, "frequency_penalty": 1.0, "repetition_penalty": 1.0, "temperature": 0.5,
        "top_p": 0.95, "top_k": -1, "seed": None, "stop": ["stop1", "stop2"], "stop_token_ids": [2, 13], "ignore_eos": False,
        "max_tokens": 64, "tools": [DELIVERY_TOOL], "tool_choice": "auto",
    }  # fmt: skip
    r = httpx.post(url, json=sample1, timeout=60)
    assert r.status_code == 200, r.text
    sample2 = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "You are a helpful customer support assistant. Use the supplied tools to assist the user."},
            {"role": "user", "content": "Hi, can you tell me the delivery date for my order? my order id is 12345."},
            {"role": "assistant", "tool_calls": [{"function": {"arguments": '{"order_id": "12345"}', "name": "get_delivery_date"},
                                                  "id": "tool_call_8p2Nk", "type": "function"}]},
            {"role": "tool", "content": "the delivery date is 2024.09.10.", "tool_call_id": "tool_call_8p2Nk"},
        ],
        "stream": False, "repetition_penalty": 1.1, "temperature": 0.9, "top_p": 1, "max_tokens": 64, "tools": [DELIVERY_TOOL],
        "tool_choice": "auto",
    }  # fmt: skip
    r = httpx.post(url, json=sample2, timeout=60)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["role"] == "assistant" and "<tool_call>" not in (message["content"] or "")
    complete = r.json()["choices"][0]["finish_reason"] == "tool_calls"
    for call in message.get("tool_calls") or [] if complete else []:  # a call the noise model finished is valid
        assert call["function"]["name"] == "get_delivery_date" and set(json.loads(call["function"]["arguments"])) == {"order_id"}
