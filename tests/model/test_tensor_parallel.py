"""Tensor parallelism on CPU: real rank processes in a real gloo group on loopback.

TP=2 against Hugging Face on the same weights (the parity scenario of test_hf_parity.py: a
12-block pool, 64 tokens per step, so chunked prefill and preemption run under TP too), with
the KV heads split (llama), replicated (qwen2 with one KV head: both ranks hold it; tied
embeddings, qkv bias), Mistral (sliding window) and Qwen3 (q/k norms over each rank's heads,
explicit head_dim). Loading reads
only each rank's part of a sharded tensor; indivisible head counts fail at start.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_hf_parity import LOGPROB_ATOL, MAX_TOKENS, _engine_run, _hf_run, _random_prompts, _vocab

from inflight.config import ModelConfig
from inflight.engine.args import EngineArgs
from inflight.models import loader
from inflight.models.parallel import TensorParallel

CASES = {
    "llama": ("llama", {}),  # 4 heads, 2 KV heads: two heads and one KV head per rank
    "qwen2-1kv": ("qwen2", {"num_key_value_heads": 1}),  # the KV head replicated on both ranks
    "mistral": ("mistral", {}),  # sliding window over each rank's heads
    "qwen3": ("qwen3", {}),  # per-head q/k RMSNorm, head_dim 32 != hidden / heads
}


@pytest.mark.parametrize("case", list(CASES))
def test_tp2_greedy_tokens_and_logprobs_equal_hf(
    case: str, tiny_model_dir: Callable[..., Path]
) -> None:
    arch, overrides = CASES[case]
    path = tiny_model_dir(arch, **overrides)
    prompts = _random_prompts(_vocab(path))[:6]
    run = _engine_run(path, prompts, tensor_parallel_size=2)
    hf = _hf_run(path, prompts)
    assert run.num_preemptions >= 1  # the scenario preempted and recomputed under TP
    for i, out in enumerate(run.outputs):
        o = out.outputs[0]
        assert o.token_ids == hf.tokens[i], f"{case} prompt {i} diverged from HF at TP=2"
        ours = torch.tensor(
            [o.logprobs[s][t].logprob for s, t in enumerate(o.token_ids)], dtype=torch.float64
        )
        ref = hf.logprobs[i][torch.arange(MAX_TOKENS), torch.tensor(hf.tokens[i])].double()
        torch.testing.assert_close(ours, ref, atol=LOGPROB_ATOL, rtol=0)


def test_each_rank_reads_only_its_shard(
    tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 of 2 built in this process (loading needs no collective): its weights are its part
    of the checkpoint's, and the loader read no more than that part of any sharded tensor."""
    from safetensors.torch import load_file

    from inflight.models.safetensors_io import SafetensorsSlice

    path = tiny_model_dir("qwen2", num_key_value_heads=1)
    full = load_file(str(path / "model.safetensors"))
    reads: dict[str, int] = {}
    read = SafetensorsSlice.read

    def spy(self: SafetensorsSlice, dim: int, start: int, size: int) -> torch.Tensor:
        out = read(self, dim, start, size)
        reads[self.name] = reads.get(self.name, 0) + out.numel()
        return out

    monkeypatch.setattr(SafetensorsSlice, "read", spy)
    cfg = ModelConfig.from_path(path, dtype="float32", device="cpu", cpu_fast_path=False)
    model = loader.load_model(cfg, progress=False, tp=TensorParallel(1, 2))
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    hd = model.spec.head_dim
    pre = "model.layers.0"
    q, k = full[f"{pre}.self_attn.q_proj.weight"], full[f"{pre}.self_attn.k_proj.weight"]
    assert attn.num_heads == 2 and attn.num_kv_heads == 1
    torch.testing.assert_close(attn.qkv_proj.weight[: 2 * hd], q[2 * hd :])  # heads 2 and 3
    torch.testing.assert_close(
        attn.qkv_proj.weight[2 * hd : 3 * hd], k
    )  # the one KV head, replicated
    torch.testing.assert_close(
        attn.qkv_proj.bias[: 2 * hd], full[f"{pre}.self_attn.q_proj.bias"][2 * hd :]
    )
    o = full[f"{pre}.self_attn.o_proj.weight"]
    torch.testing.assert_close(attn.o_proj.weight, o[:, 2 * hd :])  # the matching input columns
    inter = mlp.down_proj.in_features
    torch.testing.assert_close(
        mlp.gate_up_proj.weight[inter:], full[f"{pre}.mlp.up_proj.weight"][inter:]
    )
    torch.testing.assert_close(mlp.down_proj.weight, full[f"{pre}.mlp.down_proj.weight"][:, inter:])
    vocab, rows = model.spec.vocab_size, model.model.embed_tokens.rows
    emb = full["model.embed_tokens.weight"]
    torch.testing.assert_close(model.model.embed_tokens.weight[: vocab - rows], emb[rows:])
    assert not model.model.embed_tokens.weight[vocab - rows :].any()  # vocab padding rows are zeros
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: the same rows
    # what was read: half of every split tensor, the replicated KV head and the norms whole
    halves = ("q_proj.weight", "q_proj.bias", "o_proj.weight", "gate_proj", "up_proj", "down_proj")
    for name, t in full.items():
        if name == "model.embed_tokens.weight":
            want = (vocab - rows) * t.shape[1]
        else:
            want = t.numel() // 2 if any(h in name for h in halves) else t.numel()
        assert reads[name] == want, name


def _config_dir(tmp_path: Path, **fields: int) -> Path:
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 96, "intermediate_size": 192,
           "num_hidden_layers": 1, "vocab_size": 100, "max_position_embeddings": 64, **fields}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "message"),
    [
        (
            6,
            6,
            4,
            r"tensor_parallel_size: 4 does not divide num_attention_heads \(6\); use one of \[1, 2, 3, 6\]",
        ),
        (6, 3, 2, r"tensor_parallel_size: 2 ranks cannot share 3 KV heads"),
        (4, 2, 8, r"tensor_parallel_size: 8 does not divide num_attention_heads"),
    ],
)
def test_indivisible_heads_fail_at_start(
    tmp_path: Path, heads: int, kv: int, tp: int, message: str
) -> None:
    path = _config_dir(tmp_path, num_attention_heads=heads, num_key_value_heads=kv)
    with pytest.raises(ValueError, match=message):
        EngineArgs(model=str(path), device="cpu", tensor_parallel_size=tp).create_engine_config()
    # the model refuses the same split (each rank checks again when it builds its layers)
    tp_group = TensorParallel(0, tp)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        if heads % tp:
            tp_group.split(heads, "num_attention_heads")
        else:
            tp_group.kv_heads(kv)


def test_features_under_tp2_equal_one_process(tiny_model_dir: Callable[..., Path]) -> None:
    """What crosses the runner under TP gives one process's results: seeded sampling with n = 2
    and logprobs, prompt logprobs, beam search, a JSON schema, prefix-cache hits."""
    from inflight import LLM, SamplingParams

    path = str(tiny_model_dir("qwen2", num_key_value_heads=1))
    args = {"dtype": "float32", "device": "cpu", "num_kv_blocks": 40, "progress": False}
    one, two = LLM(model=path, **args), LLM(model=path, tensor_parallel_size=2, **args)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    cases = [
        SamplingParams(max_tokens=10, temperature=0.9, seed=7, n=2, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=2),
        SamplingParams(
            use_beam_search=True, n=2, best_of=3, temperature=0.0, max_tokens=6, ignore_eos=True
        ),
        SamplingParams(max_tokens=20, temperature=0.8, seed=3, structured_outputs={"json": schema}),
    ]
    prompt = [{"prompt_token_ids": list(range(5, 45))}]
    try:
        for params in cases + cases[:1]:  # the repeat runs from the prefix cache
            a = one.generate(prompt, params, use_tqdm=False)[0]
            b = two.generate(prompt, params, use_tqdm=False)[0]
            assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs], params
            cum_a, cum_b = (
                [o.cumulative_logprob for o in a.outputs],
                [o.cumulative_logprob for o in b.outputs],
            )
            assert cum_b == (cum_a if None in cum_a else pytest.approx(cum_a, abs=1e-4))
            if params.prompt_logprobs:
                ours = [next(iter(e.values())).logprob for e in b.prompt_logprobs[1:]]
                ref = [next(iter(e.values())).logprob for e in a.prompt_logprobs[1:]]
                assert ours == pytest.approx(ref, abs=1e-4)
        assert two.engine.kv.pool.num_hit_tokens > 0
    finally:
        two.engine.shutdown()


def test_a_layer_refuses_a_checkpoint_tensor_that_does_not_fit() -> None:
    from inflight.models.linear import Linear

    lin = Linear(8, 6, bias=False)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"shape \[7, 8\] does not fit weight part \[6, 8\]"):
            lin.load("weight", torch.randn(7, 8))  # whole layer: the shapes must be equal
        with pytest.raises(ValueError, match="does not fit"):
            lin.load("weight", torch.randn(6, 9))
        lin.partial, lin.row_start = True, 1  # a rank's rows [1, 7) of a bigger tensor
        t = torch.randn(7, 8)
        lin.load("weight", t)
    assert torch.equal(lin.weight, t[1:])


def test_lora_under_tp_is_refused_at_start(tiny_model_dir: Callable[..., Path]) -> None:
    path = str(tiny_model_dir("llama"))
    with pytest.raises(ValueError, match="enable_lora: not supported with tensor_parallel_size > 1"):
        EngineArgs(model=path, device="cpu", tensor_parallel_size=2, enable_lora=True).create_engine_config()
