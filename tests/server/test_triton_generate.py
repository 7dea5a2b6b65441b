"""/v2 generate with Triton / TensorRT-LLM input and output names, through the real HTTP server.

Bodies are the ones Triton clients send: the tensorrtllm_backend README's curl sample, tensors as
one-element lists, TensorRT-LLM's [1, 2, N] word lists; outputs are Triton's tensor names.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import torch
from safetensors.torch import load_file

GEN, STREAM = "/v2/models/tiny/generate", "/v2/models/tiny/generate_stream"
PROMPT = "once upon a time there was"  # its greedy tokens on the tiny model differ from each other


def _post(server, body: dict, path: str = GEN) -> dict:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _events(server, body: dict) -> list[dict]:  # type: ignore[no-untyped-def]
    with httpx.stream("POST", server.url + STREAM, json=body, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[len("data:") :]) for line in r.iter_lines() if line]


def _greedy(server, n: int = 8, **extra) -> dict:  # type: ignore[no-untyped-def]
    return _post(server, {"text_input": PROMPT, "max_tokens": n, "ignore_eos": True, **extra})


def test_tensorrtllm_backend_curl_sample(server) -> None:  # type: ignore[no-untyped-def]
    """The README's body (empty bad/stop words) and the `parameters` form guides copy."""
    out = _post(
        server,
        {
            "text_input": "What is machine learning?",
            "max_tokens": 20,
            "bad_words": "",
            "stop_words": "",
        },
    )
    assert (
        isinstance(out["text_output"], str)
        and out["sequence_length"] == len(out["output_ids"]) <= 20
    )
    assert out["details"]["generated_tokens"] == out["sequence_length"]
    assert "cum_log_probs" not in out and "context_logits" not in out  # only when asked
    again = _post(
        server,
        {
            "text_input": "What is machine learning?",
            "parameters": {"max_tokens": 20, "bad_words": [""], "stop_words": [""]},
        },
    )
    assert again["output_ids"] == out["output_ids"] and again["text_output"] == out["text_output"]
    # fw-ai llm_bench's triton-generate provider: stream to generate_stream, temperature given
    bench = {
        "text_input": "What is machine learning?",
        "max_tokens": 20,
        "stream": True,
        "temperature": 1.0,
        "bad_words": "",
        "stop_words": "",
    }
    events = _events(server, bench)
    assert events[-1]["details"]["finish_reason"] in ("length", "eos_token") and all(
        isinstance(e["text_output"], str) for e in events
    )
    meta = httpx.get(server.url + "/v2/models/tiny", timeout=60).json()
    assert {"input_ids", "max_tokens", "bad_words_list", "draft_logits"} <= {
        i["name"] for i in meta["inputs"]
    }
    assert {"output_ids", "cum_log_probs", "generation_logits"} <= {
        o["name"] for o in meta["outputs"]
    }
    server.wait_idle()


def test_top_level_and_parameters_merge_or_conflict(server) -> None:  # type: ignore[no-untyped-def]
    out = _post(server, {"text_input": PROMPT, "max_tokens": 4, "parameters": {"ignore_eos": True}})
    assert out["sequence_length"] == 4  # the top-level max_tokens is not dropped
    same = _post(
        server,
        {
            "text_input": PROMPT,
            "max_tokens": [4],
            "parameters": {"max_tokens": 4, "ignore_eos": True},
        },
    )
    assert same["output_ids"] == out["output_ids"]
    # a name no API defines is ignored, in both places at once too
    extra = {"text_input": PROMPT, "max_tokens": 4, "ignore_eos": True, "foo": 1, "parameters": {"foo": 2}}
    assert _post(server, extra)["output_ids"] == out["output_ids"]
    for body, param in [
        ({"text_input": PROMPT, "max_tokens": 4, "parameters": {"max_tokens": 5}}, "max_tokens"),
        ({"text_input": PROMPT, "max_tokens": 4, "request_output_len": 6}, "request_output_len"),
        (
            {"text_input": PROMPT, "parameters": {"max_new_tokens": 4}, "max_tokens": 3},
            "max_tokens",
        ),
    ]:
        r = httpx.post(server.url + GEN, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_tensor_scalars_seed_and_runtime_top_k(server) -> None:  # type: ignore[no-untyped-def]
    greedy = _greedy(server, 8)
    eos = greedy["output_ids"][2]
    ended = _post(server, {"text_input": [PROMPT], "max_tokens": [12], "end_id": [eos]})
    assert (
        ended["output_ids"] == greedy["output_ids"][:3]
        and ended["details"]["finish_reason"] == "eos_token"
    )
    top1 = _greedy(server, 8, runtime_top_k=[1], temperature=[1.5], random_seed=[7])
    assert top1["output_ids"] == greedy["output_ids"]  # top-1 sampling is greedy
    seeded = [_greedy(server, 12, temperature=1.5, random_seed=s)["output_ids"] for s in (5, 5, 6)]
    assert (
        seeded[0] == seeded[1]
        and seeded[0] != seeded[2]
        and seeded[0] != _greedy(server, 12)["output_ids"]
    )
    server.wait_idle()


def test_input_ids_stream_and_log_probs(server) -> None:  # type: ignore[no-untyped-def]
    base = _greedy(server, 6, return_log_probs=True)
    assert base["cum_log_probs"] == pytest.approx(sum(base["output_log_probs"]), abs=1e-4)
    assert len(base["output_log_probs"]) == 6 and all(lp <= 0 for lp in base["output_log_probs"])
    ids = server.engine.tokenizer.encode(PROMPT)
    by_ids = _post(
        server,
        {
            "input_ids": [ids],
            "input_lengths": [len(ids)],
            "request_output_len": [[6]],
            "ignore_eos": True,
        },
    )
    assert (
        by_ids["output_ids"] == base["output_ids"] and by_ids["text_output"] == base["text_output"]
    )
    events = _events(
        server,
        {
            "input_ids": ids,
            "max_tokens": 6,
            "ignore_eos": True,
            "return_log_probs": True,
            "stream": True,
        },
    )
    assert [t for e in events for t in e["output_ids"]] == base["output_ids"]
    assert all(e["sequence_length"] == len(e["output_ids"]) for e in events)
    assert [lp for e in events for lp in e["output_log_probs"]] == pytest.approx(
        base["output_log_probs"], abs=1e-5
    )
    assert events[-1]["cum_log_probs"] == pytest.approx(base["cum_log_probs"], abs=1e-4)
    r = httpx.post(
        server.url + GEN, json={"input_ids": ids, "input_lengths": len(ids) + 1}, timeout=60
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_lengths"
    server.wait_idle()


def test_context_and_generation_logits(server) -> None:  # type: ignore[no-untyped-def]
    vocab = server.engine.model_info.vocab_size
    out = _greedy(server, 3, return_context_logits=True, return_generation_logits=[True])
    n_prompt = len(server.engine.tokenizer.encode(PROMPT))
    ctx, gen = torch.tensor(out["context_logits"]), torch.tensor(out["generation_logits"])
    assert ctx.shape == (n_prompt, vocab) and gen.shape == (3, vocab)
    assert int(ctx[-1].argmax()) == out["output_ids"][0]  # the last prompt position picks token 0
    assert (
        gen.argmax(dim=-1).tolist() == out["output_ids"]
    )  # greedy: each row's argmax is the token
    assert torch.allclose(ctx[-1], gen[0], atol=1e-4)
    events = _events(
        server,
        {
            "text_input": PROMPT,
            "max_tokens": 3,
            "ignore_eos": True,
            "return_generation_logits": True,
            "stream": True,
        },
    )
    assert all("generation_logits" not in e for e in events[:-1]) and torch.allclose(
        torch.tensor(events[-1]["generation_logits"]), gen, atol=1e-5
    )


def test_beam_width_returns_every_beam(server) -> None:  # type: ignore[no-untyped-def]
    body = {
        "text_input": PROMPT,
        "max_tokens": 5,
        "beam_width": 3,
        "ignore_eos": True,
        "return_log_probs": True,
        "pad_id": 0,
    }
    out = _post(server, {**body, "return_context_logits": True})
    assert len(out["text_output"]) == len(out["output_ids"]) == len(out["sequence_length"]) == 3
    assert len({tuple(b) for b in out["output_ids"]}) == 3 and out["sequence_length"] == [5, 5, 5]
    for lps, cum in zip(out["output_log_probs"], out["cum_log_probs"]):
        assert len(lps) == 5 and sum(lps) == pytest.approx(cum, abs=1e-3)
    assert out["cum_log_probs"] == sorted(
        out["cum_log_probs"], reverse=True
    )  # best first (equal lengths)
    # each beam's first logprob is the log-softmax of the last prompt position at its first token
    greedy_ctx = torch.tensor(_greedy(server, 1, return_context_logits=True)["context_logits"])
    assert torch.allclose(torch.tensor(out["context_logits"]), greedy_ctx, atol=1e-4)  # the prompt's
    ctx = greedy_ctx[-1].log_softmax(-1)
    assert [lps[0] for lps in out["output_log_probs"]] == pytest.approx(
        [float(ctx[b[0]]) for b in out["output_ids"]], abs=1e-4
    )
    assert [server.engine.tokenizer.decode(b) for b in out["output_ids"]] == out["text_output"]
    events = _events(server, {**body, "stream": True})
    assert (
        events[-1]["output_ids"] == out["output_ids"]
        and events[-1]["text_output"] == out["text_output"]
    )
    server.wait_idle()


def test_beam_width_with_controls_matches_hf(server, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """beam_width with repetition_penalty, TensorRT-LLM's bad_words_list / stop_words_list layouts and
    min_length: HF `generate(num_beams=3)` with the same processors and a stop-sequence criterion."""
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir("qwen2")), dtype=torch.float32).eval()
    prompt = server.engine.tokenizer.encode(PROMPT, add_special_tokens=False)

    def hf_beams(**kw) -> list[list[int]]:  # type: ignore[no-untyped-def]
        with torch.no_grad():
            rows = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), num_beams=3,
                               num_return_sequences=3, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=-1, **kw)  # fmt: skip
        return [[t for t in row[len(prompt) :].tolist() if t != -1] for row in rows]

    class EndsWith(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):  # type: ignore[no-untyped-def]
            return torch.tensor([row[-2:] == stop for row in input_ids[:, len(prompt) :].tolist()])

    base = hf_beams()
    bad, stop = base[0][1], base[1][2:4]
    ref = hf_beams(repetition_penalty=1.3, bad_words_ids=[[bad]], stopping_criteria=StoppingCriteriaList([EndsWith()]))
    assert ref != base
    body = {"input_ids": prompt, "request_output_len": 8, "beam_width": 3, "ignore_eos": True, "repetition_penalty": 1.3,
            "bad_words_list": [[[bad], [1]]], "stop_words_list": [[stop, [2, -1]]], "min_length": 1}  # fmt: skip
    out = _post(server, body)
    assert out["output_ids"] == ref
    assert _events(server, {**body, "stream": True})[-1]["output_ids"] == ref
    server.wait_idle()


def test_use_beam_search_with_controls_on_completions(server, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """/v1/completions use_beam_search takes penalties and stop strings: the same beams as the
    Python API with the same SamplingParams, and different from the search without them."""
    from inflight import LLM, SamplingParams

    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "use_beam_search": True, "n": 2, "best_of": 3,
            "temperature": 0, "ignore_eos": True, "frequency_penalty": 1.5, "presence_penalty": 0.5, "no_repeat_ngram_size": 2}  # fmt: skip
    texts = [c["text"] for c in _post(server, body, "/v1/completions")["choices"]]
    plain = {k: v for k, v in body.items() if "penalty" not in k and "ngram" not in k}
    assert texts != [c["text"] for c in _post(server, plain, "/v1/completions")["choices"]]
    params = SamplingParams(use_beam_search=True, n=2, best_of=3, temperature=0.0, max_tokens=8, ignore_eos=True,
                            frequency_penalty=1.5, presence_penalty=0.5, no_repeat_ngram_size=2)  # fmt: skip
    llm = LLM(model=str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False)
    assert texts == [c.text for c in llm.generate([PROMPT], params, use_tqdm=False)[0].outputs]
    stop = texts[0][2:4]
    stopped = _post(server, body | {"stop": [stop]}, "/v1/completions")["choices"]
    assert any(c["finish_reason"] == "stop" for c in stopped) and all(stop not in c["text"] for c in stopped)
    server.wait_idle()


def test_trt_word_lists_and_string_words(server) -> None:  # type: ignore[no-untyped-def]
    ref = _greedy(server, 8)["output_ids"]
    t0, t1, t2 = ref[:3]
    # [1, 2, N]: tokens, then inclusive end offsets padded with -1: the word [t0] and the word [t1, t2]
    banned = _greedy(server, 8, bad_words_list=[[[t0, t1, t2], [1, 3, -1]]])["output_ids"]
    assert banned[0] != t0
    stopped = _greedy(server, 8, stop_words_list=[[t1, t2], [2, -1]])
    assert (
        stopped["output_ids"] == ref[:3] and stopped["details"]["finish_reason"] == "stop_sequence"
    )
    word = server.engine.tokenizer.decode([t0]).strip()
    if word:  # a bare string is one word
        assert (
            server.engine.tokenizer.decode(
                _greedy(server, 8, bad_words=word)["output_ids"][:1]
            ).strip()
            != word
        )
    r = httpx.post(
        server.url + GEN,
        json={"text_input": PROMPT, "stop_words_list": [[1, 2], [3, -1]]},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_words_list"


def test_embedding_bias_forms(server) -> None:  # type: ignore[no-untyped-def]
    vocab = server.engine.model_info.vocab_size
    ref = _greedy(server, 4)["output_ids"]
    target = (ref[0] + 7) % vocab
    bias = [0.0] * vocab
    bias[target] = 1e4
    assert _greedy(server, 4, embedding_bias=[bias])["output_ids"] == [target] * 4  # [1, vocab]
    word_ids = server.engine.tokenizer.encode(" cat", add_special_tokens=False)
    out = _greedy(server, 4, embedding_bias_words=[" cat"], embedding_bias_weights=[1e4])[
        "output_ids"
    ]
    assert set(out) <= set(word_ids)
    r = httpx.post(
        server.url + GEN,
        json={
            "text_input": PROMPT,
            "embedding_bias_words": ["a", "b"],
            "embedding_bias_weights": [1.0],
        },
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "embedding_bias_weights"


def test_prompt_embedding_table_over_http(server, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """Virtual ids >= vocab read the table; rows copied from two real tokens' embeddings give
    exactly the output of those real tokens."""
    vocab = server.engine.model_info.vocab_size
    emb = load_file(str(tiny_model_dir("qwen2") / "model.safetensors"))["model.embed_tokens.weight"]
    ids = server.engine.tokenizer.encode(PROMPT)
    table = emb[ids[:2]].float()
    plain = _post(server, {"input_ids": ids, "max_tokens": 5, "ignore_eos": True})
    virtual = _post(server, {"input_ids": [vocab, vocab + 1, *ids[2:]], "max_tokens": 5, "ignore_eos": True,
                             "prompt_embedding_table": [table.tolist()], "prompt_vocab_size": [2]})  # fmt: skip
    assert virtual["output_ids"] == plain["output_ids"]
    other = [17, 29]  # rows of two other tokens read as those tokens
    virtual = _post(server, {"input_ids": [vocab, vocab + 1, *ids[2:]], "max_tokens": 5, "ignore_eos": True,
                             "prompt_embedding_table": emb[other].float().tolist()})  # fmt: skip
    assert (
        virtual["output_ids"]
        == _post(server, {"input_ids": other + ids[2:], "max_tokens": 5, "ignore_eos": True})[
            "output_ids"
        ]
    )
    r = httpx.post(
        server.url + GEN,
        json={
            "input_ids": [vocab],
            "prompt_embedding_table": table.tolist(),
            "prompt_vocab_size": 3,
        },
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_vocab_size"
    server.wait_idle()


def test_drafts_over_http(server) -> None:  # type: ignore[no-untyped-def]
    ref = _greedy(server, 8)["output_ids"]
    vocab = server.engine.model_info.vocab_size
    out = _greedy(server, 8, draft_input_ids=ref[:3], draft_logits=[[0.0] * vocab] * 3)
    assert out["output_ids"] == ref
    seeded = [
        _greedy(
            server,
            8,
            temperature=1.0,
            random_seed=3,
            draft_input_ids=ref[:3],
            draft_logits=[[0.0] * vocab] * 3,
        )["output_ids"]
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    server.wait_idle()


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"early_stopping": 5}, "early_stopping"),
        ({"draft_logits": [[0.0]]}, "draft_logits"),
        ({"input_ids": [1, 2]}, "input_ids"),  # with text_input
        ({"embedding_bias": [0.0, 1.0]}, "embedding_bias"),
        ({"bad_words_list": [[1, 2, 3], [1, 5, -1]]}, "bad_words_list"),
        ({"prompt_embedding_table": [[0.0]]}, "prompt_embedding_table"),  # needs input_ids
        ({"runtime_top_k": "x"}, "runtime_top_k"),
        ({"random_seed": -1}, "random_seed"),
        ({"stop_words": 5}, "stop_words"),
        # ids past the vocabulary: never matched / banned, so refused by the name they came in
        ({"stop_words": [[5, 10**6]]}, "stop_words"),
        ({"bad_words": [[10**6]]}, "bad_words"),
        ({"stop_words_list": [[5, 10**6], [2, -1]]}, "stop_words_list"),
        ({"bad_words_list": [[[10**6], [1]]]}, "bad_words_list"),
        # SamplingParams' own checks name the field as the body sent it
        ({"beam_width": 2, "watermark": True}, "watermark"),
        ({"len_penalty": 20.0}, "len_penalty"),
        ({"request_output_len": 5, "min_tokens": 30}, "min_tokens"),
        ({"beam_width": 3, "batch_size": 2}, "batch_size"),
    ],
)
def test_bad_fields_are_400_naming_them(server, extra, param) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + GEN, json={"text_input": PROMPT, **extra}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_bad_words_on_openai_endpoints(server) -> None:  # type: ignore[no-untyped-def]
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    ref = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    first = _greedy(server, 1)["output_ids"][0]
    banned = httpx.post(
        server.url + "/v1/completions", json={**body, "bad_words": [[first]]}, timeout=60
    ).json()
    assert banned["choices"][0]["text"] != ref["choices"][0]["text"]
    assert (
        banned["choices"][0]["logprobs"]["tokens"][0] != ref["choices"][0]["logprobs"]["tokens"][0]
    )
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "bad_words": [[-1]],
        },
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "bad_words"


def test_reference_word_list_sample(server) -> None:  # type: ignore[no-untyped-def]
    """reference/tensorrt-llm-inference-request.txt's bad_words_list example: words [5, 7, 3] and [9, 2]."""
    from inflight.server.generate.tensors import trt_word_list

    sample = [[[5, 7, 3, 9, 2], [3, 5, -1, -1, -1]]]
    assert trt_word_list(sample, "bad_words_list") == [[5, 7, 3], [9, 2]]
    ids = [9, 9, 9, 9]  # a prompt ending in 9: the word [9, 2] bans 2 as the next token
    bias = [0.0] * server.engine.model_info.vocab_size
    bias[2] = 1e4  # ... which the bias makes the only candidate without the ban
    out = _post(
        server, {"input_ids": ids, "max_tokens": 1, "ignore_eos": True, "embedding_bias": bias}
    )
    banned = _post(
        server,
        {
            "input_ids": ids,
            "max_tokens": 1,
            "ignore_eos": True,
            "embedding_bias": bias,
            "bad_words_list": sample,
        },
    )
    assert out["output_ids"] == [2] and banned["output_ids"] != [2]


def test_beam_generation_logits(server) -> None:  # type: ignore[no-untyped-def]
    """return_generation_logits with beams: one [new_tokens][vocab] list per beam, whose
    log-softmax scores that beam's tokens (their sum is its cumulative logprob)."""
    out = _post(server, {"text_input": PROMPT, "max_tokens": 4, "beam_width": 2, "ignore_eos": True,
                         "return_log_probs": True, "return_generation_logits": True})  # fmt: skip
    assert len(out["generation_logits"]) == 2
    for rows, ids, cum in zip(out["generation_logits"], out["output_ids"], out["cum_log_probs"]):
        lp = torch.tensor(rows).log_softmax(-1)[torch.arange(4), torch.tensor(ids)]
        assert lp.shape == (4,) and lp.sum().item() == pytest.approx(cum, abs=1e-3)
    server.wait_idle()


def _json_schema(node):  # type: ignore[no-untyped-def]
    """An /openapi.json schema as JSON Schema: `nullable` -> null allowed, refs into $defs."""
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items()}
    if "$ref" in out:
        out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/$defs/")
    if out.pop("nullable", False):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def test_openapi_describes_triton_names(server) -> None:  # type: ignore[no-untyped-def]
    """/openapi.json's /v2 schemas accept the reference bodies (Triton's curl sample, MindIE's
    sample, TensorRT-LLM names), refuse two names of one field, and every response the server
    sends for them (Triton outputs, beams, logits, perf_stat) matches GenerateResponse."""
    schemas = httpx.get(server.url + "/openapi.json", timeout=30).json()["components"]["schemas"]
    defs = _json_schema(schemas)
    request = jsonschema.Draft202012Validator({"$ref": "#/$defs/GenerateRequest", "$defs": defs})
    response = jsonschema.Draft202012Validator({"$ref": "#/$defs/GenerateResponse", "$defs": defs})
    mindie = {"id": "a123", "text_input": "My name is Olivier and I", "parameters": {
        "details": True, "do_sample": True, "max_new_tokens": 4, "repetition_penalty": 1.1, "seed": 123,
        "temperature": 1, "top_k": 10, "top_p": 0.99, "batch_size": 100, "typical_p": 0.5, "watermark": False,
        "perf_stat": True, "priority": 5, "timeout": 10}}  # fmt: skip
    bodies = [
        {"text_input": "What is machine learning?", "max_tokens": 4, "bad_words": "", "stop_words": ""},
        mindie,
        {"input_ids": [5, 6, 7], "request_output_len": 3, "runtime_top_k": 1, "random_seed": 5,
         "return_log_probs": True, "return_context_logits": True, "return_generation_logits": True,
         "stop_words": ["zz", [7, 8]]},
        {"text_input": PROMPT, "max_tokens": 3, "beam_width": 2, "len_penalty": 1.0, "return_log_probs": True,
         "return_generation_logits": True, "pad_id": 0},
    ]  # fmt: skip
    for body in bodies:
        request.validate(body)
        response.validate(_post(server, body))
    for bad in (
        {"text_input": "x", "max_tokens": 2, "request_output_len": 3},
        {"text_input": "x", "max_tokens": 2, "parameters": {"max_new_tokens": 3}},
        {"text_input": "x", "input_ids": [5]},
        {"max_tokens": 2},
        {"text_input": "x", "beam_width": 2, "parameters": {"watermark": True}},  # not with beam search
    ):
        assert not request.is_valid(bad), bad
    triton = schemas["GenerateRequest"]["properties"]
    assert {"runtime_top_p", "request_output_len", "len_penalty", "stop_words"} <= set(triton)
    assert {"output_ids", "cum_log_probs", "output_log_probs"} <= set(schemas["GenerateResponse"]["properties"])
    server.wait_idle()
