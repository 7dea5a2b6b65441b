"""Multi-LoRA against Hugging Face + PEFT, on tiny random checkpoints with random adapters made
by `peft` here (several ranks, target sets, alphas, rsLoRA, an alpha_pattern).

One engine run per arch serves a mixed batch (adapters a, b, c, none, a again, ...) through a
small pool with chunked prefill and preemption and only 2 adapter slots for 3 adapters (the
scheduler holds a request back until a slot frees, slots are evicted and reloaded); every
request must give exactly what `PeftModel.generate` gives for it alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from inflight.errors import ParamError
from inflight.lora.adapter import TRT_MODULES
from inflight.testing import make_peft_lora

peft = pytest.importorskip("peft")

MAX_TOKENS = 12
LOGPROB_ATOL = 1e-4
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS: dict[str, dict[str, Any]] = {
    "a": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]},
    "b": {"r": 4, "lora_alpha": 8, "target_modules": ALL, "use_rslora": True},
    "c": {
        "r": 16,
        "lora_alpha": 8,
        "target_modules": ["k_proj", "o_proj", "gate_proj", "up_proj"],
        "alpha_pattern": {"o_proj": 40},
    },
}
# (adapter, prompt index): the same prompt under a, none and b must differ (the adapter acts)
BATCH = [("a", 0), ("b", 1), (None, 2), ("a", 3), ("c", 4), (None, 0), ("b", 0), ("c", 1), ("a", 5)]
PROMPT_LENS = [9, 30, 17, 3, 40, 21]


@pytest.fixture(scope="module")
def adapters(
    tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], dict[str, Path]]:
    made: dict[str, dict[str, Path]] = {}

    def get(arch: str) -> dict[str, Path]:
        if arch not in made:
            root = tmp_path_factory.mktemp(f"lora_{arch}")
            base = tiny_model_dir(arch)
            made[arch] = {
                name: make_peft_lora(base, root / name, seed=i + 1, **cfg)
                for i, (name, cfg) in enumerate(ADAPTERS.items())
            }
        return made[arch]

    return get


def _prompts(vocab: int = 1000) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _llm(path: Path, **kwargs: Any) -> LLM:
    args: dict[str, Any] = dict(dtype="float32", device="cpu", enable_lora=True, max_num_seqs=8,
                                max_num_batched_tokens=64, num_kv_blocks=8, block_size=16, progress=False)  # fmt: skip
    return LLM(model=str(path), **(args | kwargs))


def _params(n: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=2)


@functools.cache
def _reference(base: Path, adapter: Path | None) -> Any:
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    return model if adapter is None else peft.PeftModel.from_pretrained(model, str(adapter))


@torch.no_grad()
def _peft_run(
    base: Path, adapter: Path | None, prompt: list[int]
) -> tuple[list[int], torch.Tensor]:
    model = _reference(base, adapter)
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
        do_sample=False, output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = torch.log_softmax(torch.stack(out.logits)[:, 0].float(), dim=-1)
    return tokens, logprobs[torch.arange(MAX_TOKENS), torch.tensor(tokens)]


def _tokens_logprobs(out: Any) -> tuple[list[int], torch.Tensor]:
    o = out.outputs[0]
    return o.token_ids, torch.tensor([o.logprobs[s][t].logprob for s, t in enumerate(o.token_ids)])


@pytest.fixture(scope="module")
def mixed_run(
    tiny_model_dir: Callable[..., Path], adapters: Callable
) -> Callable[[str], tuple[LLM, list[Any], list[Any]]]:
    runs: dict[str, Any] = {}

    def get(arch: str) -> tuple[LLM, list[Any], list[Any]]:
        if arch not in runs:
            paths = adapters(arch)
            llm = _llm(tiny_model_dir(arch), max_loras=2)
            for name, path in paths.items():
                llm.load_lora_adapter(name, str(path))
            prompts = _prompts()
            reqs = [
                {"prompt_token_ids": prompts[i]} | ({"lora_name": a} if a else {}) for a, i in BATCH
            ]
            spy: list[Any] = []
            schedule = llm.engine.scheduler.schedule
            llm.engine.scheduler.schedule = lambda *a, **k: (
                spy.append(out := schedule(*a, **k)) or out
            )  # type: ignore[method-assign]
            outs = llm.generate(reqs, _params(), use_tqdm=False)
            llm.engine.kv.pool.check_idle()
            assert not llm.engine.runner.batch.requests
            runs[arch] = (llm, outs, spy)
        return runs[arch]

    return get


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mixed_adapters_match_peft(
    arch: str, tiny_model_dir: Callable[..., Path], adapters: Callable, mixed_run: Callable
) -> None:
    llm, outs, steps = mixed_run(arch)
    base, paths, prompts = tiny_model_dir(arch), adapters(arch), _prompts()
    for (name, i), out in zip(BATCH, outs, strict=True):
        tokens, lps = _tokens_logprobs(out)
        ref_tokens, ref_lps = _peft_run(base, paths[name] if name else None, prompts[i])
        assert tokens == ref_tokens, f"{arch}: adapter {name} prompt {i} diverged from PEFT"
        torch.testing.assert_close(lps, ref_lps, atol=LOGPROB_ATOL, rtol=0)
    same_prompt = {name: out.outputs[0].token_ids for (name, i), out in zip(BATCH, outs) if i == 0}
    assert len({tuple(t) for t in same_prompt.values()}) == 3, (
        "an adapter did not change the output"
    )
    # the hard paths ran: 3 adapters through 2 slots, mixed steps, preemption
    assert max(len({s.lora_slot for s in o.scheduled if s.lora_slot >= 0}) for o in steps) == 2
    assert any(
        -1 in {s.lora_slot for s in o.scheduled} and len({s.lora_slot for s in o.scheduled}) > 1
        for o in steps
    )
    stats = llm.engine.stats().lora
    assert stats.loads >= 3 and stats.evictions >= 1 and stats.hits > 0
    assert llm.engine.scheduler.num_preemptions >= 1


def test_trt_layout_equals_peft_directory(
    tiny_model_dir: Callable[..., Path], adapters: Callable, mixed_run: Callable
) -> None:
    """Adapter b sent as TensorRT-LLM lora_weights / lora_config (built as its hf_lora_convert.py
    does: A rows then B scaled, padded) gives what the PEFT directory gives; later requests send
    the task id alone."""
    _, outs, _ = mixed_run("llama")
    path = adapters("llama")["b"]
    weights, config = _trt_tensors(
        path, scale=ADAPTERS["b"]["lora_alpha"] / ADAPTERS["b"]["r"] ** 0.5
    )
    llm = _llm(tiny_model_dir("llama"), max_loras=1, max_cpu_loras=1)
    prompts = _prompts()
    first = llm.generate(
        [
            {
                "prompt_token_ids": prompts[1],
                "lora_task_id": 77,
                "lora_weights": weights.tolist(),
                "lora_config": config.tolist(),
            }
        ],
        _params(),
        use_tqdm=False,
    )
    again = llm.generate(
        [{"prompt_token_ids": prompts[0], "lora_task_id": 77}], _params(), use_tqdm=False
    )
    want = {i: _tokens_logprobs(out) for (name, i), out in zip(BATCH, outs) if name == "b"}
    for out, i in ((first[0], 1), (again[0], 0)):
        tokens, lps = _tokens_logprobs(out)
        assert tokens == want[i][0]
        torch.testing.assert_close(lps, want[i][1], atol=1e-5, rtol=0)
    # a second task pushes 77 out of the one-adapter host cache: 77 alone is now unknown
    other, other_cfg = _trt_tensors(adapters("llama")["a"], scale=2.0)
    llm.generate(
        [
            {
                "prompt_token_ids": prompts[2],
                "lora_task_id": 78,
                "lora_weights": other,
                "lora_config": other_cfg,
            }
        ],
        _params(2),
        use_tqdm=False,
    )
    with pytest.raises(ParamError) as e:
        llm.engine.make_request({"prompt_token_ids": prompts[0], "lora_task_id": 77}, _params())
    assert e.value.param == "lora_task_id" and "not cached" in str(e.value)
    assert llm.engine.stats().lora.host.evictions == 1
    # the same id with different weights is refused (task ids are globally unique)
    with pytest.raises(ParamError) as e:
        llm.generate(
            [
                {
                    "prompt_token_ids": prompts[0],
                    "lora_task_id": 78,
                    "lora_weights": weights,
                    "lora_config": config,
                }
            ],
            _params(2),
            use_tqdm=False,
        )
    assert e.value.param == "lora_weights"
    assert not llm.engine.has_unfinished_requests()


def _trt_tensors(path: Path, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors.torch import load_file

    ids = {mods[0]: i for i, mods in TRT_MODULES.items() if len(mods) == 1}
    rows, config = [], []
    for key, a in sorted(load_file(str(path / "adapter_model.safetensors")).items()):
        if ".lora_A." not in key:
            continue
        b = load_file(str(path / "adapter_model.safetensors"))[key.replace("lora_A", "lora_B")]
        layer, module = (
            int(key.split(".layers.")[1].split(".")[0]),
            key.split(".lora_A")[0].rsplit(".", 1)[1],
        )
        rows.append(torch.cat([a.flatten(), (b * scale).flatten()]))
        config.append([ids[module], layer, a.shape[0]])
    width = max(r.numel() for r in rows) + 5  # padded rows, as TensorRT-LLM sends them
    return torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows])[
        None
    ], torch.tensor([config])


def test_prefix_cache_never_shared_between_adapters(
    tiny_model_dir: Callable[..., Path], adapters: Callable, mixed_run: Callable
) -> None:
    llm = _llm(tiny_model_dir("llama"), max_loras=2)
    for name in ("a", "b"):
        llm.load_lora_adapter(name, str(adapters("llama")[name]))
    prompt = _prompts()[4]  # 40 tokens: 2 full blocks
    cached = []
    for name in ("a", "b", "a", None, None):
        out = llm.generate(
            [{"prompt_token_ids": prompt} | ({"lora_name": name} if name else {})],
            _params(2),
            use_tqdm=False,
        )[0]
        cached.append(out.num_cached_tokens)
    assert cached == [0, 0, 32, 0, 32]


def test_errors_name_the_field(
    tiny_model_dir: Callable[..., Path], adapters: Callable, tmp_path: Path
) -> None:
    path = tiny_model_dir("llama")
    llm = _llm(path, max_lora_rank=8)
    with pytest.raises(ParamError) as e:  # adapter c has rank 16
        llm.load_lora_adapter("c", str(adapters("llama")["c"]))
    assert e.value.param == "lora_path" and "r is 16" in str(e.value)
    with pytest.raises(ParamError) as e:
        llm.load_lora_adapter("x", str(tmp_path))
    assert e.value.param == "lora_path"
    with pytest.raises(ParamError) as e:  # an adapter of a model with other shapes
        _load_mismatched(llm, tiny_model_dir, tmp_path)
    assert e.value.param == "lora_path" and "do not fit" in str(e.value)
    llm.load_lora_adapter("a", str(adapters("llama")["a"]))
    with pytest.raises(ParamError) as e:
        llm.load_lora_adapter("a", str(adapters("llama")["a"]))
    assert e.value.param == "lora_name"
    bad = [
        ({"lora_name": "nope"}, "lora_name"),
        ({"lora_task_id": 5}, "lora_task_id"),
        ({"lora_task_id": -1}, "lora_task_id"),
        ({"lora_task_id": 5, "lora_weights": [[0.0] * 8]}, "lora_config"),
        (
            {"lora_task_id": 5, "lora_weights": [[0.0] * 8], "lora_config": [[1, 0, 4]]},
            "lora_weights",
        ),  # too short
        (
            {"lora_task_id": 5, "lora_weights": [[0.0] * 4096], "lora_config": [[1, 0, 16]]},
            "lora_config",
        ),  # rank > 8
        (
            {"lora_task_id": 5, "lora_weights": [[0.0] * 4096], "lora_config": [[9, 0, 4]]},
            "lora_config",
        ),  # module id
        (
            {"lora_task_id": 5, "lora_weights": [[0.0] * 4096], "lora_config": [[1, 7, 4]]},
            "lora_config",
        ),  # layer
    ]
    for fields, param in bad:
        with pytest.raises(ParamError) as e:
            llm.engine.make_request({"prompt_token_ids": [5, 6, 7]} | fields, _params())
        assert e.value.param == param, (fields, str(e.value))
    llm.engine.adapters.unload("a")
    with pytest.raises(ParamError) as e:
        llm.engine.make_request({"prompt_token_ids": [5, 6, 7], "lora_name": "a"}, _params())
    assert e.value.param == "lora_name"
    off = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=4, progress=False)
    with pytest.raises(ParamError) as e:
        off.engine.make_request({"prompt_token_ids": [5, 6, 7], "lora_task_id": 1}, _params())
    assert e.value.param == "lora_task_id" and "not enabled" in str(e.value)


def _load_mismatched(llm: LLM, tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    other = tiny_model_dir("llama", intermediate_size=96)
    llm.load_lora_adapter(
        "m",
        str(
            make_peft_lora(
                other, tmp_path / "m", seed=9, r=4, lora_alpha=8, target_modules=["down_proj"]
            )
        ),
    )


def test_mp_executor_gives_the_same_tokens(
    tiny_model_dir: Callable[..., Path], adapters: Callable, mixed_run: Callable
) -> None:
    """The adapters cross to the worker process in SchedulerOutput.lora_loads."""
    _, outs, _ = mixed_run("llama")
    llm = _llm(tiny_model_dir("llama"), max_loras=2, distributed_executor_backend="mp")
    for name, path in adapters("llama").items():
        llm.load_lora_adapter(name, str(path))
    prompts = _prompts()
    picks = [0, 2, 4]
    got = llm.generate(
        [
            {"prompt_token_ids": prompts[BATCH[k][1]]}
            | ({"lora_name": BATCH[k][0]} if BATCH[k][0] else {})
            for k in picks
        ],
        _params(),
        use_tqdm=False,
    )
    llm.engine.shutdown()
    assert [o.outputs[0].token_ids for o in got] == [outs[k].outputs[0].token_ids for k in picks]


@torch.no_grad()
def test_beam_search_and_embeddings_with_an_adapter(
    tiny_model_dir: Callable[..., Path], adapters: Callable
) -> None:
    base, path = tiny_model_dir("llama"), adapters("llama")["b"]
    llm = _llm(base, max_loras=1)
    llm.load_lora_adapter("b", str(path))
    prompt = _prompts()[0]
    beam = llm.generate(
        [{"prompt_token_ids": prompt, "lora_name": "b"}],
        SamplingParams(beam_width=3, max_tokens=6, temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )[0]
    emb = llm.embed(
        [{"prompt_token_ids": prompt, "lora_name": "b"}, {"prompt_token_ids": prompt}],
        use_tqdm=False,
    )
    model = _reference(base, path)
    ids = torch.tensor([prompt])
    ref = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=6,
        min_new_tokens=6,
        num_beams=3,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert beam.outputs[0].token_ids == ref[0, len(prompt) :].tolist()
    hidden = (
        model.get_base_model().model(ids).last_hidden_state[0, -1]
    )  # LlamaModel, LoRA layers in place
    torch.testing.assert_close(
        torch.tensor(emb[0].outputs.embedding),
        torch.nn.functional.normalize(hidden, dim=-1),
        atol=1e-5,
        rtol=0,
    )
    assert not torch.allclose(
        torch.tensor(emb[0].outputs.embedding), torch.tensor(emb[1].outputs.embedding), atol=1e-3
    )


def test_siblings_and_grammars_keep_the_adapter(
    tiny_model_dir: Callable[..., Path], adapters: Callable
) -> None:
    """n = 2 siblings (forked from the first one's prompt blocks) run with the adapter: each
    equals a lone request with its seed; a grammar-constrained request with an adapter obeys it."""
    llm = _llm(tiny_model_dir("llama"), max_loras=2)
    llm.load_lora_adapter("a", str(adapters("llama")["a"]))
    prompt = {"prompt_token_ids": _prompts()[1], "lora_name": "a"}
    sampled = SamplingParams(n=2, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
    both = llm.generate([prompt], sampled, use_tqdm=False)[0].outputs
    alone = [
        llm.generate(
            [prompt],
            SamplingParams(temperature=1.0, seed=11 + i, max_tokens=8, ignore_eos=True),
            use_tqdm=False,
        )[0]
        for i in range(2)
    ]
    assert [o.token_ids for o in both] == [a.outputs[0].token_ids for a in alone]
    base = llm.generate(
        [{"prompt_token_ids": _prompts()[1]}],
        SamplingParams(temperature=1.0, seed=11, max_tokens=8, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert base.outputs[0].token_ids != both[0].token_ids
    choice = SamplingParams(
        temperature=0.0, max_tokens=8, structured_outputs={"choice": ["alpha beta", "gamma"]}
    )
    got = llm.generate([{"prompt": "pick one:", "lora_name": "a"}], choice, use_tqdm=False)[
        0
    ].outputs[0]
    assert got.text in ("alpha beta", "gamma") and got.finish_reason == "stop"


def test_pissa_refused_until_converted_then_matches_peft(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """A PiSSA adapter needs PEFT's residual base model: refused by name. PEFT's conversion
    (save_pretrained(path_initial_model_for_weight_conversion=...)) makes it a plain rank-2r
    LoRA of the original base, which must give what PEFT gives with it."""
    base = tiny_model_dir("llama")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    cfg = peft.LoraConfig(r=4, lora_alpha=4, init_lora_weights="pissa", target_modules=["q_proj", "down_proj"])
    pissa = peft.get_peft_model(model, cfg)
    pissa.peft_config["default"].init_lora_weights = True  # PEFT's recipe: save the initial adapter as plain
    pissa.save_pretrained(str(tmp_path / "init"))
    pissa.peft_config["default"].init_lora_weights = "pissa"
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # "training"
        for name, p in pissa.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    pissa.save_pretrained(str(tmp_path / "raw"))
    pissa.save_pretrained(str(tmp_path / "converted"), path_initial_model_for_weight_conversion=str(tmp_path / "init"))
    llm = _llm(base)
    with pytest.raises(ParamError, match="init_lora_weights"):
        llm.load_lora_adapter("raw", str(tmp_path / "raw"))
    llm.load_lora_adapter("pissa", str(tmp_path / "converted"))
    prompt = _prompts()[0]
    out = llm.generate([{"prompt_token_ids": prompt, "lora_name": "pissa"}], _params(), use_tqdm=False)[0]
    tokens, logprobs = _tokens_logprobs(out)
    ref_tokens, ref_logprobs = _peft_run(base, tmp_path / "converted", prompt)
    assert tokens == ref_tokens
    torch.testing.assert_close(logprobs, ref_logprobs, atol=LOGPROB_ATOL, rtol=0)
    base_tokens = _tokens_logprobs(llm.generate([{"prompt_token_ids": prompt}], _params(), use_tqdm=False)[0])[0]
    assert base_tokens != tokens  # the adapter acts


def test_host_cache_back_to_max_cpu_loras_when_idle(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """Four adapters in use at once may sit in host memory together; once their requests end the
    cache holds max_cpu_loras again."""
    from inflight.testing import make_lora_adapter, read_config

    base = tiny_model_dir("llama")
    llm = _llm(base, max_loras=1, max_cpu_loras=2)
    for i in range(4):
        llm.load_lora_adapter(f"l{i}", str(make_lora_adapter(tmp_path / f"l{i}", read_config(base), rank=4, seed=i)))
    assert llm.engine.adapters.registry.stats().num_cached == 2
    reqs = [{"prompt_token_ids": [5, 6, 7 + i], "lora_name": f"l{i}"} for i in range(4)]
    llm.generate(reqs, _params(2), use_tqdm=False)
    stats = llm.engine.adapters.registry.stats()
    assert stats.loads >= 6 and stats.num_cached == 2, stats
