"""A server whose engine speculates (n-gram): per-request draft counts in the perf data of the
OpenAI and /v2 APIs (whole and streamed), and the spec-decode counters and histograms in /metrics."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.server.app import build_app
from inflight.server.config import ServerConfig
from inflight.server.serve import uvicorn_config

LOOP = [5, 9, 11, 13] * 4  # the tiny model continues it in runs the n-gram proposer predicts


@pytest.fixture(scope="module")
def url(tiny_model_dir) -> Iterator[str]:  # type: ignore[no-untyped-def]
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    engine = AsyncEngine(LLMEngine.from_args(str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False, speculative_config=spec))
    config = ServerConfig(served_model_names=("tiny",), perf_extras=True)
    srv = uvicorn.Server(uvicorn_config(build_app(engine, config), config, port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_perf_data_and_metrics(url: str) -> None:
    body = {"prompt": LOOP, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    usage = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["num_draft_tokens"] >= usage["num_accepted_draft_tokens"] > 0
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    assert "num_draft_tokens" in httpx.post(url + "/v1/chat/completions", json=chat, timeout=60).json()["usage"]
    v2 = {"input_ids": LOOP, "parameters": {"max_new_tokens": 24, "perf_stat": True, "ignore_eos": True}}
    perf = httpx.post(url + "/v2/models/tiny/generate", json=v2, timeout=60).json()["perf_stat"]
    assert perf["num_draft_tokens"] == usage["num_draft_tokens"]  # greedy: the same run
    assert perf["num_accepted_draft_tokens"] == usage["num_accepted_draft_tokens"]
    text = httpx.get(url + "/metrics").text
    drafts, accepted = _metric(text, "inflight_spec_decode_num_draft_tokens_total"), _metric(text, "inflight_spec_decode_num_accepted_tokens_total")
    assert drafts >= 2 * usage["num_draft_tokens"] and accepted >= 2 * usage["num_accepted_draft_tokens"]
    assert _metric(text, "inflight_spec_decode_num_drafts_total") >= 2
    assert _metric(text, "inflight_spec_decode_acceptance_rate_count") >= 2
    assert _metric(text, 'inflight_spec_decode_mean_accepted_length_bucket{le="1.0"}') == 0  # something was accepted


def test_streams_carry_the_counts_and_metrics_observe_each_request(url: str) -> None:
    """The official client's stream (include_usage) and /v2 generate_stream's last event carry the
    counts of the same greedy request unstreamed; /metrics' histograms grow by one observation of
    its acceptance rate (accepted / verified) and accepted length (1 + accepted / verifying steps,
    a step verifying 1..K = 4 drafts)."""
    body = {"prompt": LOOP, "max_tokens": 20, "temperature": 0, "ignore_eos": True}
    before = httpx.get(url + "/metrics").text
    whole = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["usage"]
    after = httpx.get(url + "/metrics").text
    drafted, accepted = whole["num_draft_tokens"], whole["num_accepted_draft_tokens"]
    assert drafted >= accepted > 0

    def grew(name: str) -> float:
        return _metric(after, name) - _metric(before, name)

    assert grew("inflight_spec_decode_acceptance_rate_count") == 1
    assert abs(grew("inflight_spec_decode_acceptance_rate_sum") - accepted / drafted) < 1e-9
    assert grew("inflight_spec_decode_mean_accepted_length_count") == 1
    assert 1 + accepted / drafted <= grew("inflight_spec_decode_mean_accepted_length_sum") <= 1 + 4 * accepted / drafted
    assert grew("inflight_spec_decode_num_draft_tokens_total") == drafted
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    stream = client.completions.create(model="tiny", prompt=LOOP, max_tokens=20, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})  # fmt: skip
    last = list(stream)[-1].usage
    assert last is not None and last.completion_tokens == 20
    assert (last.model_extra or {}).get("num_draft_tokens") == drafted
    assert (last.model_extra or {}).get("num_accepted_draft_tokens") == accepted
    v2 = {"input_ids": LOOP, "parameters": {"max_new_tokens": 20, "perf_stat": True, "ignore_eos": True}}
    with httpx.stream("POST", url + "/v2/models/tiny/generate_stream", json=v2, timeout=60) as r:
        events = [json.loads(line.partition(":")[2]) for line in r.iter_lines() if line.startswith("data:")]
    assert "perf_stat" not in events[0] or len(events) == 1
    perf = events[-1]["perf_stat"]
    assert (perf["num_draft_tokens"], perf["num_accepted_draft_tokens"]) == (drafted, accepted)


def test_v2_client_drafts_on_a_speculating_server(url: str) -> None:
    """/v2's draft_input_ids on a server that proposes its own: the client's are verified (the
    agreeing 5 kept), the text is the greedy text either way."""
    prompt = list(range(100, 130))  # no repeated n-gram: the server's own drafts come later, if at all
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    ref = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    ids = ref["token_ids"]
    drafts = ids[:5] + [(ids[5] + 1) % 1000]
    v2 = {"input_ids": prompt, "parameters": {"max_new_tokens": 12, "perf_stat": True, "ignore_eos": True, "draft_input_ids": drafts}}
    out = httpx.post(url + "/v2/models/tiny/generate", json=v2, timeout=60).json()
    assert out["text_output"] == ref["text"]
    assert out["perf_stat"]["num_accepted_draft_tokens"] >= 5 and out["perf_stat"]["num_draft_tokens"] >= 6
