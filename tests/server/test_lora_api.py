"""LoRA over HTTP: adapters as OpenAI models (the official client), vLLM's load / unload
endpoints behind the API key, /v1/models, TensorRT-LLM's lora_task_id / lora_weights /
lora_config on /v2, the metrics. Outputs are anchored to PEFT on the same adapter."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from transformers import AutoModelForCausalLM

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.lora.adapter import TRT_MODULES
from inflight.server.app import build_app
from inflight.server.config import ServerConfig
from inflight.testing import make_peft_lora

peft = pytest.importorskip("peft")
openai = pytest.importorskip("openai")

PROMPT = [17, 250, 31, 77, 402, 9, 660, 12]
MAX_TOKENS = 6
KEY = "sekret"


@pytest.fixture(scope="module")
def lora_server(tiny_model_dir, tmp_path_factory) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    base = tiny_model_dir("qwen2")
    root = tmp_path_factory.mktemp("lora_api")
    paths = {
        "a": make_peft_lora(
            base,
            root / "a",
            seed=1,
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "v_proj", "down_proj"],
        ),
        "b": make_peft_lora(
            base,
            root / "b",
            seed=2,
            r=4,
            lora_alpha=8,
            target_modules=["o_proj", "gate_proj", "up_proj"],
        ),
    }
    llm = LLMEngine.from_args(
        str(base),
        dtype="float32",
        device="cpu",
        enable_lora=True,
        max_loras=2,
        num_kv_blocks=32,
        progress=False,
    )
    llm.adapters.load("a", str(paths["a"]))
    engine = AsyncEngine(llm)
    srv = uvicorn.Server(
        uvicorn.Config(
            build_app(engine, ServerConfig(served_model_names=("tiny",), api_keys=(KEY,), lora_root=str(root))),
            host="127.0.0.1",
            port=0,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
    yield {"url": url, "base": base, "paths": paths, "engine": engine}
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


@torch.no_grad()
def _peft_tokens(base: Path, adapter: Path | None, prompt: list[int] = PROMPT) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, str(adapter))
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                         do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def _post(
    s: dict[str, Any], path: str, body: dict[str, Any], key: str | None = KEY
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(s["url"] + path, json=body, headers=headers, timeout=60)


def test_adapter_is_a_model_for_the_openai_client(lora_server: dict[str, Any]) -> None:
    s = lora_server
    client = openai.OpenAI(base_url=s["url"] + "/v1", api_key=KEY)
    listed = client.models.list().data
    cards = {m.id: m for m in listed}
    assert cards["a"].parent == "tiny" and cards["a"].root == str(s["paths"]["a"])
    # vLLM's order: the base models (parent null; the encoder is one) before the adapters
    bases = [m.id for m in listed if m.parent is None]
    assert "tiny" in bases and [m.id for m in listed][: len(bases)] == bases and "a" not in bases
    tok = s["engine"].tokenizer
    with_a = client.completions.create(
        model="a",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    base = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert with_a.model == "a"
    assert with_a.choices[0].text == tok.decode(_peft_tokens(s["base"], s["paths"]["a"]))
    assert base.choices[0].text == tok.decode(_peft_tokens(s["base"], None))
    assert with_a.choices[0].text != base.choices[0].text
    stream = client.completions.create(
        model="a",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert (
        all(c.model == "a" for c in chunks)
        and "".join(c.choices[0].text for c in chunks if c.choices) == with_a.choices[0].text
    )
    chat = client.chat.completions.create(
        model="a", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
    )
    assert chat.model == "a" and chat.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def test_load_and_unload_endpoints(lora_server: dict[str, Any]) -> None:
    s = lora_server
    body = {"lora_name": "b", "lora_path": str(s["paths"]["b"])}
    assert _post(s, "/v1/load_lora_adapter", body, key=None).status_code == 401
    r = _post(s, "/v1/load_lora_adapter", body)
    assert r.status_code == 200, r.text
    again = _post(s, "/v1/load_lora_adapter", body)
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    for bad, param in (
        ({"lora_name": "x"}, "lora_path"),
        ({"lora_path": "/tmp"}, "lora_name"),
        ({"lora_name": "x", "lora_path": "/nonexistent"}, "lora_path"),
        ({"lora_name": "x", "lora_path": str(s["base"])}, "lora_path"),  # readable, outside --lora-root
        ({"lora_name": "tiny", "lora_path": str(s["paths"]["b"])}, "lora_name"),  # the base model's name
    ):
        r = _post(s, "/v1/load_lora_adapter", bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    gen = _post(
        s,
        "/v1/completions",
        {
            "model": "b",
            "prompt": PROMPT,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    assert gen.json()["choices"][0]["text"] == s["engine"].tokenizer.decode(
        _peft_tokens(s["base"], s["paths"]["b"])
    )
    assert _post(s, "/v1/unload_lora_adapter", {"lora_name": "b"}, key=None).status_code == 401
    assert _post(s, "/v1/unload_lora_adapter", {"lora_name": "b"}).status_code == 200
    assert "b" not in [
        m["id"]
        for m in httpx.get(
            s["url"] + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}
        ).json()["data"]
    ]
    assert (
        _post(s, "/v1/completions", {"model": "b", "prompt": "x", "max_tokens": 1}).status_code
        == 404
    )
    r = _post(s, "/v1/unload_lora_adapter", {"lora_name": "b"})  # vLLM: an unknown adapter is a 404
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name"


def _trt(path: Path, scale: float) -> tuple[list[Any], list[Any]]:
    from safetensors.torch import load_file

    tensors = load_file(str(path / "adapter_model.safetensors"))
    ids = {mods[0]: i for i, mods in TRT_MODULES.items() if len(mods) == 1}
    rows, config = [], []
    for key in sorted(k for k in tensors if ".lora_A." in k):
        a, b = tensors[key], tensors[key.replace("lora_A", "lora_B")]
        rows.append(torch.cat([a.flatten(), (b * scale).flatten()]))
        config.append(
            [
                ids[key.split(".lora_A")[0].rsplit(".", 1)[1]],
                int(key.split(".layers.")[1].split(".")[0]),
                a.shape[0],
            ]
        )
    width = max(r.numel() for r in rows)
    return torch.stack(
        [torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows]
    ).tolist(), config


def test_v2_trt_fields_and_adapter_urls(lora_server: dict[str, Any]) -> None:
    s = lora_server
    tok = s["engine"].tokenizer
    text = tok.decode(PROMPT)
    want = tok.decode(_peft_tokens(s["base"], s["paths"]["a"], tok.encode(text)))
    params = {"max_new_tokens": MAX_TOKENS, "ignore_eos": True}
    by_url = _post(s, "/v2/models/a/generate", {"text_input": text, "parameters": params})
    assert by_url.status_code == 200 and by_url.json()["text_output"] == want
    weights, config = _trt(s["paths"]["a"], scale=16 / 8)
    first = _post(
        s,
        "/v2/models/tiny/generate",
        {
            "text_input": text,
            "parameters": params
            | {"lora_task_id": 5, "lora_weights": weights, "lora_config": config},
        },
    )
    assert first.status_code == 200 and first.json()["text_output"] == want, first.text
    cached = _post(
        s,
        "/v2/models/tiny/generate",
        {"text_input": text, "parameters": params | {"lora_task_id": 5}},
    )
    assert cached.json()["text_output"] == want
    for extra, param in (
        ({"lora_task_id": 6}, "lora_task_id"),
        ({"lora_task_id": "6"}, "lora_task_id"),
        ({"lora_task_id": 6, "lora_weights": weights}, "lora_config"),
        (
            {
                "lora_task_id": 6,
                "lora_weights": [row[:10] for row in weights],
                "lora_config": config,
            },
            "lora_weights",
        ),
        (
            {
                "lora_task_id": 6,
                "lora_weights": weights,
                "lora_config": [[c[0], c[1], 65] for c in config],
            },
            "lora_config",
        ),
    ):
        r = _post(s, "/v2/models/tiny/generate", {"text_input": text, "parameters": params | extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra.keys(), r.text)
    metrics = httpx.get(s["url"] + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'inflight_lora_adapters_loaded{level="device"}' in metrics
    assert 'inflight_lora_loads_total{level="host"}' in metrics


def test_runtime_loads_stay_under_the_root(lora_server: dict[str, Any], tmp_path: Path) -> None:
    """Symlinks are resolved before the check (a link under the root to a directory or a file
    outside is refused), relative paths are taken under the root, and a malformed adapter under
    the root is a 400 naming what is wrong, never a 500."""
    s = lora_server
    root = s["paths"]["a"].parent
    outside = make_peft_lora(s["base"], tmp_path / "outside", seed=5, r=4, lora_alpha=8, target_modules=["q_proj"])
    link = root / "link"
    link.symlink_to(outside, target_is_directory=True)
    r = _post(s, "/v1/load_lora_adapter", {"lora_name": "l", "lora_path": str(link)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path" and "--lora-root" in r.text, r.text
    sneaky = root / "sneaky"
    sneaky.mkdir()
    (sneaky / "adapter_config.json").write_text((outside / "adapter_config.json").read_text())
    (sneaky / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")
    r = _post(s, "/v1/load_lora_adapter", {"lora_name": "l", "lora_path": str(sneaky)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", r.text
    bad = root / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("[]")
    (bad / "adapter_model.safetensors").write_bytes(b"\x00" * 3)
    r = _post(s, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": "bad"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path" and "JSON object" in r.text, r.text
    r = _post(s, "/v1/load_lora_adapter", {"lora_name": "rel", "lora_path": "b"})  # relative: under the root
    assert r.status_code == 200, r.text
    assert _post(s, "/v1/unload_lora_adapter", {"lora_name": "rel"}).status_code == 200


def test_without_a_root_only_startup_directories_load(tmp_path: Path) -> None:
    from inflight.errors import ParamError
    from inflight.server.lora_paths import runtime_adapter_path, startup_paths

    for d in ("start", "other"):
        (tmp_path / d).mkdir()
    startup = startup_paths([("s", str(tmp_path / "start"))])
    assert runtime_adapter_path("s", str(tmp_path / "start"), ("m",), None, startup) == str((tmp_path / "start").resolve())
    for path in (str(tmp_path / "other"), "start", str(tmp_path / "start" / ".." / "other")):
        with pytest.raises(ParamError) as e:
            runtime_adapter_path("s", path, ("m",), None, startup)
        assert e.value.param == "lora_path"


def test_adapter_by_name_on_responses_and_messages(lora_server: dict[str, Any]) -> None:
    """The Responses and Messages APIs run the same engine request as chat: `model` picks the adapter."""
    s, ask = lora_server, [{"role": "user", "content": "Hi there"}]
    greedy = {"temperature": 0, "ignore_eos": True}

    def chat(model: str) -> str:
        r = _post(s, "/v1/chat/completions", {"model": model, "messages": ask, "max_tokens": 6} | greedy)
        return str(r.json()["choices"][0]["message"]["content"])

    with_a, base = chat("a"), chat("tiny")
    assert with_a != base
    r = _post(s, "/v1/responses", {"model": "a", "input": "Hi there", "max_output_tokens": 6} | greedy).json()
    assert r["model"] == "a" and r["output"][0]["content"][0]["text"] == with_a
    m = _post(s, "/v1/messages", {"model": "a", "messages": ask, "max_tokens": 6} | greedy).json()
    assert m["content"][0]["text"] == with_a and m["usage"]["output_tokens"] == 6
