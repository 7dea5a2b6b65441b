"""Structured output over HTTP: response_format, structured_outputs, guided_*, with the openai client.

The tiny random-weight model's free output is noise, so every valid result below is the
grammar's doing. Bounded strings (maxLength) keep generations short.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "temperature": {"type": "number", "minimum": -50, "maximum": 60},
        "conditions": {"enum": ["sunny", "cloudy", "rain", "snow"]},
        "hourly": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 23},
            "maxItems": 3,
        },
        "alert": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]},
    },
    "required": ["city", "temperature", "conditions", "hourly"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def test_chat_json_schema_n_logprobs_and_stream(client, server) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT, n=4, temperature=1.0, seed=7,
        max_tokens=200, logprobs=True, top_logprobs=2,
    )  # fmt: skip
    assert len(r.choices) == 4
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
        assert (
            len(c.logprobs.content) >= len(r.choices[0].message.content) // 12
        )  # tokens were scored
    assert len({c.message.content for c in r.choices}) > 1  # n samples, each constrained on its own
    # streaming the same seeded request gives the same text
    seeded = dict(
        model="tiny",
        messages=MESSAGES,
        response_format=RESPONSE_FORMAT,
        temperature=1.0,
        seed=7,
        max_tokens=200,
    )
    chunks = client.chat.completions.create(**seeded, stream=True)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    single = client.chat.completions.create(**seeded)
    assert streamed == single.choices[0].message.content
    jsonschema.validate(json.loads(streamed), SCHEMA)
    server.wait_idle()


class Color(StrEnum):
    red = "red"
    green = "green"


class Pet(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=30)
    color: Color
    tags: list[Annotated[str, Field(max_length=6)]] = Field(max_length=2)


class Owner(BaseModel):
    pet: Pet
    nickname: str | None = Field(max_length=8)


def test_openai_parse_returns_pydantic_object(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.parse(
        model="tiny",
        messages=MESSAGES,
        response_format=Owner,
        temperature=0.8,
        seed=3,
        max_tokens=300,
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Owner) and isinstance(parsed.pet.color, Color)
    assert 0 <= parsed.pet.age <= 30


def test_json_object_mode(client, server) -> None:  # type: ignore[no-untyped-def]
    # bias towards closing characters so an unbounded object ends within max_tokens; the grammar
    # still decides what is valid
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, response_format={"type": "json_object"}, temperature=0.7, seed=1, max_tokens=400,
        logit_bias=_closing_bias(server.engine.tokenizer),
    )  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def _closing_bias(tok) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Token ids that close strings / objects."""
    ids = {
        i
        for text in ['"', "}", '"}', '",', "1"]
        for i in tok.encode(text, add_special_tokens=False)
    }
    return {str(i): 8 for i in ids}


@pytest.mark.parametrize(
    "extra,check",
    [
        (
            {"structured_outputs": {"regex": r"[A-Z]{3}-[0-9]{4}"}},
            lambda t: re.fullmatch(r"[A-Z]{3}-[0-9]{4}", t),
        ),
        (
            {"guided_regex": r"(cat|dog)s? [0-9]{2}"},
            lambda t: re.fullmatch(r"(cat|dog)s? [0-9]{2}", t),
        ),
        (
            {"structured_outputs": {"choice": ["yes", "yes please", "no", "Zürich 東京"]}},
            lambda t: t in ("yes", "yes please", "no", "Zürich 東京"),
        ),
        ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
        (
            {"structured_outputs": {"grammar": 'root ::= "(" [0-9]+ ("+" [0-9]+)* ")"'}},
            lambda t: re.fullmatch(r"\([0-9]+(\+[0-9]+)*\)", t),
        ),
        (
            {
                "guided_json": {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                }
            },
            lambda t: isinstance(json.loads(t)["ok"], bool),
        ),
    ],
)
def test_completions_constraints(server, extra, check) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "prompt": ["the cat", "hello world"], "n": 2, "temperature": 1.0, "seed": 11,
            "max_tokens": 60, "logit_bias": {}, **extra}  # fmt: skip
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 4
    for c in choices:
        assert c["finish_reason"] == "stop" and check(c["text"]), c


@pytest.mark.parametrize(
    "extra,param",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}},
                }
            },
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "string", "format": "credit-card"},
                    },
                }
            },
            "response_format",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
        ({"structured_outputs": {"regex": "([a-z"}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": "a+", "response_format": {"type": "json_object"}}, "guided_regex"),
        (
            {"response_format": {"type": "json_object"}, "use_beam_search": True, "n": 2},
            "structured_outputs",
        ),
    ],
)
def test_invalid_constraints_are_400(server, extra, param) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    server.wait_idle()


def test_compile_cache_and_mixed_batch(server) -> None:  # type: ignore[no-untyped-def]
    """Constrained and free requests share steps; the second use of a schema hits the cache."""
    import asyncio

    async def run() -> list[dict]:
        async with httpx.AsyncClient(timeout=60) as c:
            bodies = [
                {
                    "model": "tiny",
                    "messages": MESSAGES,
                    "max_tokens": 200,
                    "temperature": 1.0,
                    "seed": i,
                    **({"response_format": RESPONSE_FORMAT} if i % 2 else {}),
                }  # fmt: skip
                for i in range(8)
            ]
            rs = await asyncio.gather(
                *(c.post(server.url + "/v1/chat/completions", json=b) for b in bodies)
            )
            return [r.json() for r in rs]

    outs = asyncio.run(run())
    for i, o in enumerate(outs):
        if i % 2:
            jsonschema.validate(json.loads(o["choices"][0]["message"]["content"]), SCHEMA)
    backend = server.engine.engine.grammar_backend
    assert len(backend._cache) >= 1
    server.wait_idle()
