"""A quantized base (a tiny llama as Q8_0 GGUF) with everything else: tensor parallelism, the mp
executor, LoRA, speculative decoding (prefix caching, structured output and beams in every format:
tests/model/test_quant_features.py).

References: transformers' GGUF loader (the same file dequantized), PEFT on it for LoRA, HF beam
search. The portable path runs (`INFLIGHT_QUANT_KERNEL=0`, inherited by worker processes) so the
products are HF's up to summation order and greedy tokens must be identical.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from inflight.config import ModelConfig
from inflight.engine.args import DEMO_MODEL
from inflight.models import loader
from inflight.models.parallel import TensorParallel
from inflight.quant.gguf import GGUFCheckpoint
from inflight.quant.weight import dequantize
from inflight.testing import make_peft_lora
from inflight.testing.gguf import hf_to_gguf

N_NEW = 8


@pytest.fixture(autouse=True)
def _portable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", "0")


@pytest.fixture(scope="module")
def base(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def gguf_path(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qfeat")
    for f in ("config.json", "generation_config.json"):
        (out / f).write_text((base / f).read_text())
    return hf_to_gguf(base, out / "model.gguf", "q8_0")


@pytest.fixture(scope="module")
def hf(gguf_path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                dtype=torch.float32).eval()  # fmt: skip


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (9, 30)]


def _greedy(model: Any, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                             do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def _llm(path: Path, **kw: Any) -> LLM:
    args = dict(dtype="float32", device="cpu", num_kv_blocks=32, max_num_seqs=4, progress=False)
    return LLM(model=str(path), **(args | kw))


def _run(llm: LLM, prompts: list[list[int]], **params: Any) -> list[list[int]]:
    sp = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True, **params)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)]


@pytest.mark.parametrize("kw", [{"tensor_parallel_size": 2}, {"distributed_executor_backend": "mp"}], ids=["tp2", "mp"])
def test_tensor_parallel_and_worker_process_match_hf(kw: dict[str, Any], gguf_path: Path, hf: Any) -> None:
    """Each rank (a worker process) reads the GGUF itself: column shards by rows, row-parallel
    shards by whole Q8_0 blocks (o_proj: 32 of 64 inputs; down_proj: 64 of 128)."""
    llm = _llm(gguf_path, **kw)
    try:
        assert _run(llm, _prompts()) == [_greedy(hf, p) for p in _prompts()]
    finally:
        llm.engine.shutdown()


def test_a_shard_that_would_cut_a_block_is_a_load_error(gguf_path: Path) -> None:
    """Rank 1 of 4 built in this process, past the start-up check (loading needs no collective):
    o_proj's 64 inputs (4 heads of 16) give it [16, 32), which cuts Q8_0's 32-element blocks.
    (down_proj's 128 never is: intermediate rows are dealt in whole blocks, models/parallel.py.)"""
    cfg = ModelConfig.from_path(gguf_path, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match=r"o_proj\.weight.*input columns \[16, 32\) do not fall on q8_0 block boundaries"):
        loader.load_model(cfg, progress=False, tp=TensorParallel(1, 4))


def test_lora_on_a_quantized_base_matches_peft(base: Path, gguf_path: Path, tmp_path: Path) -> None:
    import peft

    adapter = make_peft_lora(base, tmp_path / "lora", r=8, lora_alpha=16,
                             target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"])  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    ref = peft.PeftModel.from_pretrained(hf, str(adapter)).eval()  # (wraps hf in place: its own copy)
    llm = _llm(gguf_path, enable_lora=True)
    llm.load_lora_adapter("a", str(adapter))
    prompts = _prompts()
    sp = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p, "lora_name": "a"} for p in prompts] + [{"prompt_token_ids": prompts[0]}],
                        sp, use_tqdm=False)  # fmt: skip
    assert [o.outputs[0].token_ids for o in outs[:2]] == [_greedy(ref, p) for p in prompts]
    with ref.disable_adapter():
        assert outs[2].outputs[0].token_ids == _greedy(ref, prompts[0])  # the base rows beside them


def test_speculation_on_a_quantized_target_matches_hf(base: Path, gguf_path: Path, hf: Any, tmp_path: Path) -> None:
    """The GGUF target verifies drafts of its safetensors original (the same tokenizer: the GGUF's
    tokenizer.ggml.tokens against tokenizer.json) and of an EAGLE head over its dequantized
    embedding and lm_head: HF's tokens either way. A draft whose tokenizer differs is refused."""
    from inflight.testing.eagle import make_eagle1_head

    ref = [_greedy(hf, p) for p in _prompts()]
    for spec in ({"method": "draft_model", "model": str(base)}, {"method": "eagle", "model": str(make_eagle1_head(base, tmp_path / "head"))}):
        llm = _llm(gguf_path, speculative_config={**spec, "num_speculative_tokens": 3})
        outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == ref, spec["method"]
        assert sum(o.metrics.num_draft_tokens for o in outs) > 0
        if spec["method"] == "draft_model":  # the float original mostly agrees with its Q8_0 copy
            assert sum(o.metrics.num_accepted_draft_tokens for o in outs) > 0
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    for f in base.iterdir():
        if f.is_file():
            (swapped / f.name).write_bytes(f.read_bytes())
    tok = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="speculative_config.model: its tokenizer differs"):
        _llm(gguf_path, speculative_config={"method": "draft_model", "model": str(swapped), "num_speculative_tokens": 3})


def test_f16_file_on_avx2_with_lora(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUF F16 file forced to AVX2 (its weights stay f16: `WidenedLinear`, the float kernels):
    a LoRA adapter wrapping the f16 layers gives PEFT's tokens on the same file, the base rows
    beside it the base's (HF's)."""
    import peft

    monkeypatch.delenv("INFLIGHT_QUANT_KERNEL")  # the float kernels themselves
    monkeypatch.setenv("INFLIGHT_CPU_FEATURES", "avx2")
    for f in ("config.json", "generation_config.json"):
        (tmp_path / f).write_text((base / f).read_text())
    path = hf_to_gguf(base, tmp_path / "model-f16.gguf", "f16")
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    prompts = _prompts()
    adapter = make_peft_lora(base, tmp_path / "lora", r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    ref = peft.PeftModel.from_pretrained(hf, str(adapter)).eval()
    llm = _llm(path, dtype="auto", enable_lora=True)
    assert llm.engine.config.model.weight_dtype == torch.float16
    llm.load_lora_adapter("a", str(adapter))
    sp = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": prompts[0], "lora_name": "a"}, {"prompt_token_ids": prompts[0]}], sp,
                        use_tqdm=False)  # fmt: skip
    want = _greedy(ref, prompts[0])
    with ref.disable_adapter():
        assert [o.outputs[0].token_ids for o in outs] == [want, _greedy(ref, prompts[0])] and want != _greedy(ref, prompts[0])


def test_quant_weights_pickle(gguf_path: Path) -> None:
    """A QuantWeight crosses a process as it is (the mp / TP workers get configs, but a weight
    sent anywhere keeps its bytes)."""
    name, src = next((n, s) for n, s in GGUFCheckpoint(gguf_path).weights() if s.quantized)
    w = src.read_quant(0, 0, src.shape[0])
    back = pickle.loads(pickle.dumps(w))
    assert back.qtype == "q8_0" and torch.equal(dequantize(back), dequantize(w)), name


def test_the_demo_model_as_a_gguf_file_answers_as_the_float_one(tmp_path: Path) -> None:
    """The newcomer's path (docs/QUANTIZATION.md): scripts/make_tiny_gguf.py writes the bundled
    demo model as Q8_0; served from that file it answers a trained question as the float model."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "scripts" / "make_tiny_gguf.py"), str(tmp_path / "demo.gguf")],
                         check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.stdout.strip() == str(tmp_path / "demo.gguf")
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    sp = SamplingParams(max_tokens=16, temperature=0.0)
    answers = [LLM(model=m, progress=False).chat(msgs, sp, use_tqdm=False)[0].outputs[0].text
               for m in (str(tmp_path / "demo.gguf"), DEMO_MODEL)]  # fmt: skip
    assert answers[0] == answers[1] and answers[0].startswith("I am sorry, I do not know")
