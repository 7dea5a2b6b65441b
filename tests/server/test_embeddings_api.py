"""/v1/embeddings through the official client, anchored to sentence-transformers."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest


@pytest.fixture(scope="module")
def reference():  # type: ignore[no-untyped-def]
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from inflight.embeddings import default_model_path

    return SentenceTransformer(str(default_model_path()), device="cpu")


TEXTS = ["The cat sat on the mat.", "你好，世界 🌍", "A much longer sentence about inference servers " * 20]


def test_embeddings_match_sentence_transformers(server, reference) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)
    ours = np.array([d.embedding for d in r.data])
    ref = reference.encode(TEXTS, normalize_embeddings=True)
    cos = (ours * ref).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(ref, axis=-1))
    assert cos.min() >= 0.99999
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens == r.usage.total_tokens > 0
    b64 = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS[0], encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(b64.data[0].embedding), dtype=np.float32)  # asked for base64: a string
    assert np.allclose(decoded, ours[0], atol=1e-6)
    raw = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"}, timeout=60).json()
    assert np.allclose(np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype=np.float32), ours[0], atol=1e-6)
    small = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS[0], dimensions=64)
    v = np.array(small.data[0].embedding)
    assert v.shape == (64,) and abs(np.linalg.norm(v) - 1) < 1e-5


@pytest.mark.parametrize(
    "body,param",
    [({"input": []}, "input"), ({"input": [[]]}, "input"), ({"input": 5}, "input"), ({"input": "x", "dimensions": 1000}, "dimensions"),
     ({"input": "x", "encoding_format": "hex"}, "encoding_format"), ({"input": "x", "model": "tiny"}, "model")],
)
def test_embedding_limits(server, body, param) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_unknown_embedding_model_is_404(server) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "x", "model": "nope"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_decoder_model_embeddings(server, app_with, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """--embedding-pooling mean: the served chat model answers /v1/embeddings (HF hidden states anchor it)."""
    import torch
    from transformers import AutoModel

    from inflight.server.config import ServerConfig

    url = app_with(ServerConfig(served_model_names=("tiny", "tiny-alias"), embedding_pooling="mean"))
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    texts = ["hello there", "the quick brown fox jumps over the lazy dog " * 6]
    r = client.embeddings.create(model="tiny-alias", input=texts)
    assert r.model == "tiny" and [d.index for d in r.data] == [0, 1]
    tok = server.engine.tokenizer
    ids = [tok.encode(t) for t in texts]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(i) for i in ids)
    hf = AutoModel.from_pretrained(tiny_model_dir("qwen2"), torch_dtype=torch.float32).eval()
    for d, row in zip(r.data, ids):
        with torch.no_grad():
            ref = torch.nn.functional.normalize(hf(torch.tensor([row])).last_hidden_state[0].mean(0), dim=0)
        assert torch.nn.functional.cosine_similarity(torch.tensor(d.embedding), ref, dim=0) > 1 - 1e-5
    # token-id input, dimensions (truncate + renormalize), base64
    small = client.embeddings.create(model="tiny", input=[ids[0]], dimensions=8, encoding_format="base64")
    vec = np.frombuffer(base64.b64decode(small.data[0].embedding), dtype=np.float32)
    full = np.array(r.data[0].embedding)
    assert vec.shape == (8,) and np.allclose(vec, full[:8] / np.linalg.norm(full[:8]), atol=1e-5)
    bad = httpx.post(url + "/v1/embeddings", json={"model": "tiny", "input": "x", "dimensions": 100000}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "dimensions"
    huge = httpx.post(url + "/v1/embeddings", json={"model": "tiny", "input": [[5] * 100000]}, timeout=60)
    assert huge.status_code == 400
    # the default model (no "model" field) is still the sentence encoder
    default = httpx.post(url + "/v1/embeddings", json={"input": "x"}, timeout=60).json()
    assert default["model"] == "all-MiniLM-L6-v2"
    server.wait_idle()


def test_databricks_instruction_id_and_invocations(server, reference) -> None:  # type: ignore[no-untyped-def]
    """Databricks' `instruction` is prepended to each input (BGE style); the response has an `id`;
    SageMaker's /invocations with `input` is an embeddings call."""
    instruction = "Represent this sentence for searching relevant passages:"
    body = {"input": TEXTS[:2], "instruction": instruction}
    r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60).json()
    ours = np.array([d["embedding"] for d in r["data"]])
    ref = reference.encode([f"{instruction} {t}" for t in TEXTS[:2]], normalize_embeddings=True)
    assert (ours * ref).sum(-1).min() >= 0.99999 and r["id"].startswith("embd-")
    plain = reference.encode(TEXTS[:2], normalize_embeddings=True)
    assert (ours * plain).sum(-1).max() < 0.999  # the instruction changed the vectors
    inv = httpx.post(server.url + "/invocations", json=body, timeout=60).json()
    assert np.allclose(np.array([d["embedding"] for d in inv["data"]]), ours, atol=1e-6)
    for bad in ({"input": [[5, 6]], "instruction": "q:"}, {"input": "x", "instruction": 5}):
        err = httpx.post(server.url + "/v1/embeddings", json=bad, timeout=60)
        assert err.status_code == 400 and err.json()["error"]["param"] == "instruction"


LONG = "inference servers batch requests continuously " * 80  # ~400 tokens: past the 256 the encoder reads


def test_inputs_past_the_model_length_are_400_unless_truncation_is_asked(server, reference) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/embeddings", json={"input": ["short", LONG]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input" and "item 1" in r.text, r.text
    ref = reference.encode([LONG], normalize_embeddings=True)[0]  # sentence-transformers truncates to 256
    for extra in ({"truncate_prompt_tokens": -1}, {"truncate": True}, {"error_behavior": "truncate"}):
        got = httpx.post(server.url + "/v1/embeddings", json={"input": LONG, **extra}, timeout=60).json()
        v = np.array(got["data"][0]["embedding"])
        assert float(v @ ref) >= 0.99999 and got["usage"]["prompt_tokens"] == 256, extra
    short = httpx.post(server.url + "/v1/embeddings", json={"input": LONG, "truncate_prompt_tokens": 10}, timeout=60).json()
    assert short["usage"]["prompt_tokens"] == 10
    for extra, param in (({"truncate_prompt_tokens": 257}, "truncate_prompt_tokens"), ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                         ({"error_behavior": "skip"}, "error_behavior"),
                         ({"truncate_prompt_tokens": 10, "truncate": "x"}, "truncate")):  # fmt: skip  # truncate: was unread
        r = httpx.post(server.url + "/v1/embeddings", json={"input": LONG, **extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_request_over_the_token_limit_is_400(server) -> None:  # type: ignore[no-untyped-def]
    body = {"input": ["word " * 250] * 1300}  # 1,300 x 252 tokens > 300,000 (OpenAI's per-request limit)
    r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input" and "300000" in r.text, r.text


def test_a_large_embeddings_request_does_not_stall_a_stream(server) -> None:  # type: ignore[no-untyped-def]
    """The encoder runs between decode steps, a layer of a batch at a time: while 16 max-length
    inputs are encoded the running stream keeps getting tokens. (Before: the whole request ran
    as one call on the engine thread and the stream stopped until it ended.)"""
    import asyncio
    import time

    async def run() -> tuple[float, float, float]:
        async with httpx.AsyncClient(timeout=300) as client:
            body = {"prompt": [5, 6, 7], "max_tokens": 100_000, "ignore_eos": True, "stream": True, "model": "tiny"}
            arrivals: list[float] = []
            async with client.stream("POST", server.url + "/v1/completions", json=body) as resp:
                lines = resp.aiter_lines()
                while len(arrivals) < 5:  # streaming
                    if (await anext(lines)).startswith("data:"):
                        arrivals.append(time.monotonic())

                async def read() -> None:
                    async for line in lines:
                        if line.startswith("data:"):
                            arrivals.append(time.monotonic())

                reader = asyncio.create_task(read())
                start = time.monotonic()
                r = await client.post(server.url + "/v1/embeddings", json={"input": ["word " * 250] * 16})
                end = time.monotonic()
                assert r.status_code == 200, r.text
                await asyncio.sleep(0.5)
                reader.cancel()
            assert arrivals[-1] > end, "the stream ended first (the tiny model's 512 positions): inconclusive"
            during = [t for t in arrivals if start <= t <= end]
            gaps = [b - a for a, b in zip([start, *during], [*during, end])]
            return end - start, max(gaps), len(during)

    took, worst_gap, tokens = asyncio.run(run())
    assert tokens >= 10, (took, tokens)
    assert worst_gap < took / 4, (worst_gap, took)  # before: one gap as long as the whole request
    server.wait_idle(timeout=30)
