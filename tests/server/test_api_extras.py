"""vLLM / MindIE / Databricks extras of the OpenAI endpoints, through the real server (and the
official `openai` client where it applies): /tokenize, /detokenize, /invocations, streamed usage
rules, cached tokens, allowed_token_ids, chat template options, token ids and logprob shapes,
prompt truncation, 64-bit seeds, max_tokens 0 scoring, cumulative text offsets, MindIE's
configuration switches and the reference documents' own sample bodies."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from inflight.server.config import ServerConfig
from inflight.server.openai.prompts import fim_prompt
from inflight.server.openai.tool_fields import documented_limits, tool_request

MSGS = [{"role": "user", "content": "hello there"}]
VOCAB = 1000  # the tiny tokenizer's


def _post(url: str, path: str, body: dict, status: int = 200) -> dict:
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def _events(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x")


# ------------------------------------------------------------------ vLLM utility routes
def test_vllm_client_expectations(server) -> None:  # type: ignore[no-untyped-def]
    """What vLLM's own entrypoint tests read: GET /tokenizer_info, HEAD /metrics, `prompt_logprobs: null`
    in bodies that did not ask for it, and the base model's `parent: null`."""
    tok = server.engine.tokenizer
    info = httpx.get(server.url + "/tokenizer_info", timeout=10).json()
    assert info["tokenizer_class"] == type(tok).__name__ and "vocab_file" not in info
    assert all(isinstance(v, str | int | float | bool | list | dict | None) for v in info.values())
    if tok.chat_template:
        assert info["chat_template"] == tok.chat_template
    head = httpx.head(server.url + "/metrics", timeout=10)
    assert head.status_code == 200 and head.content == b""
    cmpl = _post(server.url, "/v1/completions", {"prompt": "hi", "max_tokens": 1})
    chat = _post(server.url, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 1})
    assert "prompt_logprobs" in cmpl["choices"][0] and cmpl["choices"][0]["prompt_logprobs"] is None
    assert "prompt_logprobs" in chat and chat["prompt_logprobs"] is None
    base = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    assert base["id"] == "tiny" and "parent" in base and base["parent"] is None
    server.wait_idle()


def test_per_request_metrics_when_enabled(server, app_with) -> None:  # type: ignore[no-untyped-def]
    """--enable-per-request-metrics: vLLM's `metrics` object in the body (streams: the usage chunk);
    its times are consistent with each other and absent without the flag."""
    keys = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"}
    url = app_with(ServerConfig(served_model_names=("tiny",), per_request_metrics=True))
    body = {"prompt": "hi", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    m = _post(url, "/v1/completions", body)["metrics"]
    assert set(m) == keys and all(v >= 0 for v in m.values()) and m["tokens_per_second"] > 0
    assert m["mean_itl_ms"] == pytest.approx(m["generation_time_ms"] / 3, abs=1e-2)
    chat = _post(url, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2})
    assert set(chat["metrics"]) == keys
    chunks = _events(url, "/v1/completions", body | {"stream_options": {"include_usage": True}})
    assert set(chunks[-1]["metrics"]) == keys and chunks[-1]["usage"]["completion_tokens"] == 4
    assert all("metrics" not in c for c in chunks[:-1])
    assert "metrics" not in _post(server.url, "/v1/completions", body)
    server.wait_idle()


def test_logprob_token_ids(server, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """vLLM's logprob_token_ids: the logprobs of exactly those ids (and the chosen token's) at each
    position, equal to HF's log-softmax there; chat returns them all in top_logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    asked, prompt = [5, 17, 300], [3, 9, 27, 81, 243]
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir("qwen2")), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 0, "logprob_token_ids": asked,
            "return_tokens_as_token_ids": True}  # fmt: skip
    top = _post(server.url, "/v1/completions", body)["choices"][0]["logprobs"]["top_logprobs"][0]
    chosen = int(ref.argmax())
    assert set(top) == {f"token_id:{t}" for t in [*asked, chosen]}
    for t in [*asked, chosen]:
        assert top[f"token_id:{t}"] == pytest.approx(float(ref[t]), abs=1e-4)
    chat = _post(server.url, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2, "temperature": 0, "logprobs": True,
                                                      "top_logprobs": 1, "logprob_token_ids": asked, "return_tokens_as_token_ids": True})  # fmt: skip
    for pos in chat["choices"][0]["logprobs"]["content"]:
        ids = {int(e["token"].removeprefix("token_id:")) for e in pos["top_logprobs"]}
        assert set(asked) <= ids and len(ids) <= len(asked) + 1
    for extra in ({"logprob_token_ids": []}, {"logprob_token_ids": [1], "logprobs": None}, {"logprob_token_ids": [10**6]},
                  {"logprob_token_ids": 5}):  # fmt: skip
        assert _post(server.url, "/v1/completions", body | extra, 400)["error"]["param"] == "logprob_token_ids"
    server.wait_idle()


def test_tokenize_detokenize_and_invocations(server) -> None:  # type: ignore[no-untyped-def]
    tok = server.engine.tokenizer
    r = _post(
        server.url,
        "/tokenize",
        {"model": "tiny", "prompt": "the cat sat", "return_token_strs": True},
    )
    assert r["tokens"] == tok.encode("the cat sat") and r["count"] == len(r["tokens"])
    assert (
        r["max_model_len"] == server.engine.model_info.max_model_len
        and len(r["token_strs"]) == r["count"]
    )
    chat = _post(
        server.url, "/tokenize", {"messages": MSGS + [{"role": "narrator", "content": "x"}]}
    )
    assert tok.decode(chat["tokens"]).endswith(
        "<|im_start|>narrator\nx<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _post(server.url, "/detokenize", {"tokens": r["tokens"]})["prompt"] == "the cat sat"
    assert _post(server.url, "/detokenize", {"tokens": [VOCAB]}, 400)["error"]["param"] == "tokens"
    assert (
        _post(server.url, "/tokenize", {"model": "other", "prompt": "x"}, 404)["error"]["param"]
        == "model"
    )
    # /invocations: the body's shape picks the endpoint
    inv = _post(server.url, "/invocations", {"messages": MSGS, "max_tokens": 2})
    assert inv["object"] == "chat.completion" and inv["usage"]["completion_tokens"] <= 2
    assert (
        _post(server.url, "/invocations", {"prompt": "hi", "max_tokens": 2})["object"]
        == "text_completion"
    )
    assert _post(server.url, "/invocations", {"text": "hi"}, 400)["error"]["param"] == "body"
    paths = httpx.get(server.url + "/openapi.json", timeout=30).json()["paths"]
    assert all(
        "requestBody" in paths[p]["post"] for p in ("/tokenize", "/detokenize", "/invocations")
    )
    server.wait_idle()


# ------------------------------------------------------------------ streamed usage
def test_stream_usage_follows_openai_and_vllm(server) -> None:  # type: ignore[no-untyped-def]
    base = {"prompt": "count with me", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    plain = _events(server.url, "/v1/completions", base)
    assert all(
        "usage" not in e and "prefill_time" not in e for e in plain
    )  # not asked: none anywhere
    cont_only = _events(
        server.url, "/v1/completions", base | {"stream_options": {"continuous_usage_stats": True}}
    )
    assert all("usage" not in e for e in cont_only)  # continuous_usage_stats needs include_usage
    asked = _events(
        server.url, "/v1/completions", base | {"stream_options": {"include_usage": True}}
    )
    assert [e for e in asked if "usage" in e] == asked[-1:] and asked[-1]["choices"] == []
    assert (
        asked[-1]["usage"]["completion_tokens"] == 4
        and "cached_tokens" in asked[-1]["usage"]["prompt_tokens_details"]
    )
    both = {"include_usage": True, "continuous_usage_stats": True}
    chat = _events(
        server.url,
        "/v1/chat/completions",
        {
            "messages": MSGS,
            "max_tokens": 3,
            "temperature": 0,
            "ignore_eos": True,
            "stream_options": both,
        },
    )
    assert all("usage" in e for e in chat)  # the role chunk included
    assert (
        chat[0]["choices"][0]["delta"]["role"] == "assistant"
        and chat[0]["usage"]["completion_tokens"] == 0
    )
    counts = [e["usage"]["completion_tokens"] for e in chat]
    assert (
        counts == sorted(counts)
        and counts[-1] == 3
        and chat[0]["usage"]["prompt_tokens"] == chat[-1]["usage"]["prompt_tokens"] > 0
    )
    server.wait_idle()


def test_cached_tokens_report_prefix_cache_hits(server) -> None:  # type: ignore[no-untyped-def]
    c = _client(server.url)
    prompt = "a long shared preamble about serving models " * 6
    first = c.completions.create(model="tiny", prompt=prompt + "one", max_tokens=1, temperature=0)
    again = c.completions.create(model="tiny", prompt=prompt + "two", max_tokens=1, temperature=0)
    hits = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens in (0, hits)
    assert (
        hits > 0 and hits % 16 == 0 and hits <= again.usage.prompt_tokens
    )  # whole blocks of the shared prefix
    salted = [c.completions.create(model="tiny", prompt=prompt + "three", max_tokens=1, extra_body={"cache_salt": salt})
              for salt in ("tenant-a", "tenant-a", "tenant-b")]  # fmt: skip
    first_a, again_a, other = (s.usage.prompt_tokens_details.cached_tokens for s in salted)
    assert (
        first_a == 0 and again_a >= hits and other == 0
    )  # vLLM cache_salt: hits only within one salt
    server.wait_idle()


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"store": True}, "store"),
        ({"modalities": ["audio"]}, "modalities"),
        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
        ({"cache_salt": ""}, "cache_salt"),
    ],
)
def test_known_fields_not_implemented_are_400(server, extra, param) -> None:  # type: ignore[no-untyped-def]
    assert (
        _post(server.url, "/v1/chat/completions", {"messages": MSGS, **extra}, 400)["error"][
            "param"
        ]
        == param
    )


def test_no_op_values_of_those_fields_are_accepted(server) -> None:  # type: ignore[no-untyped-def]
    body = {
        "messages": MSGS,
        "max_tokens": 1,
        "store": False,
        "modalities": ["text"],
        "service_tier": "auto",
        "user": "u1",
    }
    assert _post(server.url, "/v1/chat/completions", body)["object"] == "chat.completion"
    server.wait_idle()


# ------------------------------------------------------------------ sampling and template options
def test_allowed_token_ids_and_return_token_ids(server) -> None:  # type: ignore[no-untyped-def]
    allowed = [11, 12, 13]
    for temperature in (0, 1.0):
        r = _post(server.url, "/v1/completions", {"prompt": "x y z", "max_tokens": 6, "temperature": temperature, "seed": 1,
                                                  "allowed_token_ids": allowed, "return_token_ids": True, "ignore_eos": True})  # fmt: skip
        ch = r["choices"][0]
        assert len(ch["token_ids"]) == 6 and set(ch["token_ids"]) <= set(allowed)
        assert ch["prompt_token_ids"] == server.engine.tokenizer.encode("x y z")
    chat = _client(server.url).chat.completions.create(model="tiny", messages=MSGS, max_tokens=4, temperature=0,
                                                       extra_body={"return_token_ids": True})  # fmt: skip
    extra = chat.model_extra
    assert server.engine.tokenizer.decode(extra["prompt_token_ids"]).endswith(
        "<|im_start|>assistant\n"
    )
    assert len(chat.choices[0].model_extra["token_ids"]) == chat.usage.completion_tokens
    body = {"prompt": "x y z", "max_tokens": 5, "temperature": 0, "return_token_ids": True, "ignore_eos": True}
    events = _events(server.url, "/v1/completions", body)
    assert [("prompt_token_ids" in e["choices"][0]) for e in events] == [True] + [False] * (
        len(events) - 1
    )
    full = _post(server.url, "/v1/completions", body)
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == full["choices"][0][
        "token_ids"
    ]
    assert (
        _post(server.url, "/v1/completions", {"prompt": "x", "allowed_token_ids": []}, 400)[
            "error"
        ]["param"]
        == "allowed_token_ids"
    )
    assert (
        _post(server.url, "/v1/completions", {"prompt": "x", "allowed_token_ids": [VOCAB]}, 400)[
            "error"
        ]["param"]
        == "allowed_token_ids"
    )
    server.wait_idle()


def test_chat_template_options(server) -> None:  # type: ignore[no-untyped-def]
    template = "{% if enable_thinking %}<think>{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    body = {"messages": MSGS, "chat_template": template}
    tok = server.engine.tokenizer
    off = tok.decode(_post(server.url, "/tokenize", body)["tokens"])
    on = tok.decode(
        _post(server.url, "/tokenize", body | {"chat_template_kwargs": {"enable_thinking": True}})[
            "tokens"
        ]
    )
    assert on == "<think>" + off and off == "user: hello there\n"
    r = _post(
        server.url,
        "/v1/chat/completions",
        body
        | {
            "chat_template_kwargs": {"enable_thinking": True},
            "max_tokens": 1,
            "return_token_ids": True,
        },
    )
    assert tok.decode(r["prompt_token_ids"]) == on
    cont = [*MSGS, {"role": "assistant", "content": "Sure, the"}]
    text = tok.decode(
        _post(server.url, "/tokenize", {"messages": cont, "continue_final_message": True})["tokens"]
    )
    assert text.endswith("<|im_start|>assistant\nSure, the")  # the reply continues the last message
    server.wait_idle()


@pytest.mark.parametrize(
    "messages,fragment",
    [
        ([{"role": "tool", "content": "42"}], "tool_call_id"),
        (
            [
                {"role": "user", "content": "a"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
            ],
            "chat template",
        ),
        ([{"content": "no role"}], "role"),
    ],
)
def test_chat_message_rules_are_400(server, messages, fragment) -> None:  # type: ignore[no-untyped-def]
    err = _post(server.url, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}, 400)[
        "error"
    ]
    assert err["param"] == "messages" and fragment in err["message"]


def test_later_system_message_goes_to_the_template(server) -> None:  # type: ignore[no-untyped-def]
    """OpenAI and vLLM accept a system message anywhere: the template renders it, or its own
    error is a 400 naming `messages` (a template that raises, as Llama 2 / Mistral ones do)."""
    late = [
        *MSGS,
        {"role": "assistant", "content": "hi"},
        {"role": "system", "content": "be brief"},
    ]
    tok = server.engine.tokenizer
    text = tok.decode(_post(server.url, "/tokenize", {"messages": late})["tokens"])
    assert text.endswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>assistant\n")
    r = _post(
        server.url,
        "/v1/chat/completions",
        {"messages": late, "max_tokens": 2, "return_token_ids": True},
    )
    assert tok.decode(r["prompt_token_ids"]) == text and r["usage"]["completion_tokens"] <= 2
    strict = (
        "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('System role only first') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    err = _post(
        server.url,
        "/v1/chat/completions",
        {"messages": late, "max_tokens": 1, "chat_template": strict},
        400,
    )
    assert (
        err["error"]["param"] == "messages" and "System role only first" in err["error"]["message"]
    )
    server.wait_idle()


def test_logprob_extras(server, app_with) -> None:  # type: ignore[no-untyped-def]
    # -1 (the whole vocabulary) is over vLLM's default --max-logprobs 20: a 400 naming the field
    for path, body, name in (("/v1/completions", {"prompt": "x", "prompt_logprobs": -1}, "prompt_logprobs"),
                             ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs"),
                             ("/v1/chat/completions", {"messages": MSGS, "logprobs": True, "top_logprobs": -1}, "top_logprobs")):
        assert _post(server.url, path, body, 400)["error"]["param"] == name
    url = app_with(ServerConfig(served_model_names=("tiny",), max_logprobs=-1))  # --max-logprobs -1: no cap
    c = _client(url)
    r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, temperature=0, logprobs=True, top_logprobs=-1,
                                  extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True})  # fmt: skip
    content = r.choices[0].logprobs.content
    assert [t.token for t in content] == [
        f"token_id:{t}" for t in r.choices[0].model_extra["token_ids"]
    ]
    assert all(len(t.top_logprobs) == VOCAB for t in content)  # -1: the whole vocabulary
    assert abs(sum(2.718281828**x.logprob for x in content[0].top_logprobs) - 1) < 1e-3
    p = _post(url, "/v1/completions", {"prompt": "one two", "max_tokens": 1, "prompt_logprobs": -1})
    entries = p["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and all(len(e) == VOCAB for e in entries[1:])
    server.wait_idle()


def test_truncate_prompt_tokens(server) -> None:  # type: ignore[no-untyped-def]
    tok = server.engine.tokenizer
    prompt = "one two three four five six seven eight nine ten"
    ids = tok.encode(prompt)
    base = {"prompt": prompt, "max_tokens": 1, "return_token_ids": True}
    left = _post(server.url, "/v1/completions", base | {"truncate_prompt_tokens": 4})
    assert (
        left["choices"][0]["prompt_token_ids"] == ids[-4:] and left["usage"]["prompt_tokens"] == 4
    )
    right = _post(
        server.url,
        "/v1/completions",
        base | {"truncate_prompt_tokens": 4, "truncation_side": "right"},
    )
    assert right["choices"][0]["prompt_token_ids"] == ids[:4]
    chat = _post(
        server.url,
        "/v1/chat/completions",
        {"messages": MSGS, "max_tokens": 1, "truncate_prompt_tokens": 3},
    )
    assert chat["usage"]["prompt_tokens"] == 3
    limit = server.engine.model_info.max_prompt_len
    long = "word " * (limit + 50)
    assert (
        _post(server.url, "/v1/completions", {"prompt": long, "max_tokens": 1}, 400)["error"][
            "param"
        ]
        == "prompt"
    )
    fit = _post(
        server.url,
        "/v1/completions",
        {"prompt": long, "max_tokens": 1, "truncate_prompt_tokens": -1},
    )
    assert fit["usage"]["prompt_tokens"] == limit and "warnings" not in fit
    databricks = _post(
        server.url,
        "/v1/completions",
        {"prompt": long, "max_tokens": 1, "error_behavior": "truncate"},
    )
    assert databricks["usage"]["prompt_tokens"] == limit and "dropped" in databricks["warnings"][0]
    for bad in (
        {"truncate_prompt_tokens": 0},
        {"truncation_side": "middle"},
        {"error_behavior": "ignore"},
    ):
        assert _post(server.url, "/v1/completions", {"prompt": "x"} | bad, 400)["error"][
            "param"
        ] == next(iter(bad))
    server.wait_idle()


def test_seeds_span_signed_and_unsigned_64_bit(server) -> None:  # type: ignore[no-untyped-def]
    base = {"prompt": "seed test", "max_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    neg = _post(server.url, "/v1/completions", base | {"seed": -1})["choices"][0]["text"]
    top = _post(server.url, "/v1/completions", base | {"seed": 2**64 - 1})["choices"][0]["text"]
    assert neg == top  # -1 is 2**64 - 1 modulo 2**64, as torch reads it
    low = _post(server.url, "/v1/completions", base | {"seed": -(2**63)})["choices"][0]["text"]
    assert low == _post(server.url, "/v1/completions", base | {"seed": 2**63})["choices"][0]["text"]
    err = _post(server.url, "/v1/completions", base | {"seed": 2**64}, 400)["error"]
    assert (
        err["message"]
        == "seed: must be in [-9223372036854775808, 18446744073709551615], got 18446744073709551616"
    )
    assert (
        _post(server.url, "/v1/completions", base | {"top_p": 0}, 400)["error"]["message"]
        == "top_p: must be in (0, 1], got 0"
    )
    assert (
        _post(server.url, "/v1/completions", base | {"temperature": -1}, 400)["error"]["message"]
        == "temperature: must be >= 0, got -1"
    )
    server.wait_idle()


# ------------------------------------------------------------------ completions correctness
def _offsets_ok(lp: dict, start: int = 0) -> None:
    expect = start
    for tok, off in zip(lp["tokens"], lp["text_offset"]):
        assert off == expect
        expect += len(tok)


def test_text_offsets_are_cumulative(server) -> None:  # type: ignore[no-untyped-def]
    body = {
        "prompt": "the quick brown fox",
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": 1,
        "ignore_eos": True,
    }
    echo = _post(server.url, "/v1/completions", body | {"echo": True})["choices"][0]
    lp = echo["logprobs"]
    assert (
        lp["tokens"][0]
        and echo["text"].startswith(lp["tokens"][0])
        and lp["token_logprobs"][0] is None
    )  # named, unscored
    _offsets_ok(lp)
    assert "".join(lp["tokens"]) == echo["text"]
    plain = _post(server.url, "/v1/completions", body)["choices"][0]
    _offsets_ok(plain["logprobs"])
    streamed = [
        e["choices"][0]["logprobs"]
        for e in _events(server.url, "/v1/completions", body | {"echo": True})
    ]
    merged = {k: [v for s in streamed for v in s[k]] for k in lp}
    assert merged == lp  # the same offsets, chunk by chunk
    server.wait_idle()


def test_max_tokens_zero_scores_the_prompt(server) -> None:  # type: ignore[no-untyped-def]
    """lm-evaluation-harness's loglikelihood call: echo + logprobs + max_tokens 0."""
    c = _client(server.url)
    r = c.completions.create(
        model="tiny",
        prompt="the cat sat on the mat",
        max_tokens=0,
        echo=True,
        logprobs=1,
        temperature=0,
    )
    ch = r.choices[0]
    assert (
        ch.text == "the cat sat on the mat"
        and r.usage.completion_tokens == 0
        and ch.finish_reason == "length"
    )
    assert (
        len(ch.logprobs.tokens) == r.usage.prompt_tokens and ch.logprobs.token_logprobs[0] is None
    )
    scored = _post(
        server.url,
        "/v1/completions",
        {
            "prompt": "the cat sat on the mat",
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        },
    )
    ids, entries = scored["choices"][0]["prompt_token_ids"], scored["choices"][0]["prompt_logprobs"]
    assert ch.logprobs.token_logprobs[1:] == pytest.approx(
        [e[str(t)]["logprob"] for t, e in zip(ids[1:], entries[1:])], abs=1e-5
    )
    streamed = _events(
        server.url,
        "/v1/completions",
        {"prompt": "the cat sat on the mat", "max_tokens": 0, "echo": True, "logprobs": 1},
    )
    assert len(streamed) == 1 and streamed[0]["choices"][0]["text"] == ch.text
    assert (
        _post(server.url, "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400)["error"][
            "param"
        ]
        == "max_tokens"
    )
    server.wait_idle()


def test_stop_reason_suffix_best_of_and_ranges(server) -> None:  # type: ignore[no-untyped-def]
    base = {"prompt": [5, 6, 7, 8], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    text = _post(server.url, "/v1/completions", base)["choices"][0]
    assert text["stop_reason"] is None
    if len(text["text"]) > 4:
        stop = text["text"][2:4]
        hit = _post(server.url, "/v1/completions", base | {"stop": [stop]})["choices"][0]
        assert hit["stop_reason"] == stop and hit["finish_reason"] == "stop"
    err = _post(server.url, "/v1/completions", {"prompt": "x", "suffix": "y"}, 400)["error"]
    assert err["param"] == "suffix" and "fill-in-the-middle" in err["message"]
    stream = {"prompt": "x", "n": 1, "best_of": 2, "temperature": 1, "stream": True}
    assert _post(server.url, "/v1/completions", stream, 400)["error"]["param"] == "best_of"
    # MindIE ranges: temperature above 2 allowed; out-of-vocabulary stop_token_ids ignored
    assert _post(
        server.url,
        "/v1/completions",
        {"prompt": "x", "max_tokens": 1, "temperature": 3.5, "stop_token_ids": [2, 13, 10**6]},
    )
    assert (
        _post(
            server.url, "/v1/chat/completions", {"messages": MSGS, "repetition_penalty": 2.5}, 400
        )["error"]["param"]
        == "repetition_penalty"
    )
    server.wait_idle()


def test_fim_prompt_uses_the_model_fim_tokens() -> None:
    class Tok:
        def get_vocab(self) -> dict[str, int]:
            return {"<|fim_prefix|>": 1, "<|fim_suffix|>": 2, "<|fim_middle|>": 3}

    assert (
        fim_prompt(Tok(), "def f(", "    return x")
        == "<|fim_prefix|>def f(<|fim_suffix|>    return x<|fim_middle|>"
    )


# ------------------------------------------------------------------ MindIE
MINDIE_CHAT = {  # mindie-chat-completions.txt, single-turn text sample (max_tokens kept small)
    "model": "tiny", "messages": [{"role": "user", "content": "You are a helpful assistant."}], "stream": False,
    "presence_penalty": 1.03, "frequency_penalty": 1.0, "repetition_penalty": 1.0, "temperature": 0.5, "top_p": 0.95,
    "top_k": -1, "seed": None, "stop": ["stop1", "stop2"], "stop_token_ids": [2, 13], "include_stop_str_in_output": False,
    "skip_special_tokens": True, "ignore_eos": False, "max_tokens": 20,
}  # fmt: skip
MINDIE_COMPLETIONS = {  # mindie-completions.txt, text inference sample
    "model": "tiny", "prompt": "who are you", "temperature": 1, "max_tokens": 5, "ignore_eos": True, "n": 2, "best_of": 2,
    "stream": False, "logprobs": 2,
}  # fmt: skip


def test_mindie_sample_bodies(server) -> None:  # type: ignore[no-untyped-def]
    chat = _post(server.url, "/v1/chat/completions", MINDIE_CHAT)
    assert (
        chat["choices"][0]["message"]["role"] == "assistant"
        and chat["usage"]["completion_tokens"] <= 20
    )
    multi = {**MINDIE_CHAT, "messages": [{"role": "system", "content": "You are a student who is good at math."},
                                         {"role": "user", "content": "Hi, can you tell me the delivery date for my order? my order id is 12345."}]}  # fmt: skip
    assert _post(server.url, "/v1/chat/completions", multi)["object"] == "chat.completion"
    cmpl = _post(server.url, "/v1/completions", MINDIE_COMPLETIONS)
    assert [c["index"] for c in cmpl["choices"]] == [0, 1] and cmpl["usage"][
        "completion_tokens"
    ] == 10
    for c in cmpl["choices"]:
        assert c["stop_reason"] is None and c["finish_reason"] == "length"
        _offsets_ok(c["logprobs"])
        assert all(len(t) >= 2 for t in c["logprobs"]["top_logprobs"])
    # the streamed sample: sampled beam search with logprobs, all beams in one chunk
    beams = {"model": "tiny", "prompt": "who are you", "temperature": 1, "max_tokens": 5, "use_beam_search": True,
             "ignore_eos": True, "n": 2, "best_of": 2, "stream": True, "logprobs": 2, "seed": 7}  # fmt: skip
    (chunk,) = _events(server.url, "/v1/completions", beams)
    assert [c["index"] for c in chunk["choices"]] == [0, 1]
    for c in chunk["choices"]:
        assert len(c["logprobs"]["tokens"]) == 5 and c["finish_reason"] == "length"
        _offsets_ok(c["logprobs"])
    again = _post(server.url, "/v1/completions", beams | {"stream": False})
    assert [c["text"] for c in again["choices"]] == [
        c["text"] for c in chunk["choices"]
    ]  # seeded beam sampling
    server.wait_idle()


def test_databricks_and_mindie_limits_under_mindie_defaults(server, app_with) -> None:  # type: ignore[no-untyped-def]
    """mindie_defaults applies the documented limits: a function of 16 properties (Databricks: 15)
    and an empty message content (MindIE: non-empty) are 400s; the default server takes both."""
    strict = app_with(ServerConfig(served_model_names=("tiny",), mindie_defaults=True))
    fn = {"name": "f", "parameters": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(16)}}}
    base = {"messages": MSGS, "max_tokens": 1, "temperature": 0}
    wide = base | {"tools": [{"type": "function", "function": fn}], "tool_choice": "none"}
    empty = base | {"messages": [{"role": "system", "content": ""}, *MSGS]}
    for body, param in ((wide, "tools"), (empty, "messages")):
        assert _post(strict, "/v1/chat/completions", body, 400)["error"]["param"] == param
        _post(server.url, "/v1/chat/completions", body)
    fn["parameters"]["properties"].pop("p15")
    _post(strict, "/v1/chat/completions", wide)  # 15 is the limit
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    turn = [*MSGS, {"role": "assistant", "content": None, "tool_calls": calls}, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    documented_limits({"messages": turn}, tool_request({}))  # an assistant call needs no content (the tiny template can't render it)
    server.wait_idle()


def test_mindie_configuration(server, app_with) -> None:  # type: ignore[no-untyped-def]
    url = app_with(
        ServerConfig(
            served_model_names=("tiny",),
            mindie_defaults=True,
            full_text_enabled=True,
            perf_extras=True,
        )
    )
    body = {"messages": MSGS, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    chunks = _events(url, "/v1/chat/completions", body)
    texts = [e["choices"][0]["delta"]["content"] for e in chunks[1:]]
    assert all(
        b.startswith(a) for a, b in zip(texts, texts[1:])
    )  # fullTextEnabled: cumulative content
    last = chunks[-1]
    full = _post(url, "/v1/chat/completions", body)
    assert last["full_text"] == texts[-1] == full["choices"][0]["message"]["content"]
    assert (
        last["usage"]["completion_tokens"] == 5 and last["choices"][0]["finish_reason"] == "length"
    )  # MindIE: always
    assert len(last["decode_time_arr"]) == 4 and last["prefill_time"] > 0
    cmpl = _events(
        url,
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 3, "temperature": 0, "ignore_eos": True},
    )
    usage = cmpl[-1]["usage"]
    assert (
        len(usage["batch_size"]) == 3 and len(usage["queue_wait_time"]) == 3
    )  # MindIE perf arrays in usage
    # the default max_tokens is the room left (or max_iter_times), not 16: read 20 chunks, then hang up
    with httpx.stream(
        "POST",
        url + "/v1/completions",
        json={"prompt": "hi", "temperature": 0, "ignore_eos": True, "stream": True},
        timeout=60,
    ) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen > 20:
                break
    assert seen > 20
    server.wait_idle(timeout=10)
