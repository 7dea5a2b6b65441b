"""p-tuning: prompt ids >= vocab size read their embeddings from the request's table."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, ParamError, SamplingParams

N_NEW = 10


@pytest.fixture(scope="module")
def setup(tiny_model_dir):  # type: ignore[no-untyped-def]
    path = tiny_model_dir("llama")
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return llm, hf


def test_virtual_tokens_match_hf_inputs_embeds(setup) -> None:  # type: ignore[no-untyped-def]
    llm, hf = setup
    vocab, hidden = hf.config.vocab_size, hf.config.hidden_size
    g = torch.Generator().manual_seed(5)
    table = torch.randn(4, hidden, generator=g) * 0.1
    ids = [vocab + 0, vocab + 1, 17, 29, vocab + 3, 40, 41, vocab + 2] + list(range(50, 70))
    params = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True, logprobs=0)
    # two requests in one batch: tabled and plain must not disturb each other
    outs = llm.generate(
        [{"prompt_token_ids": ids, "prompt_embedding_table": table}, {"prompt_token_ids": list(range(50, 70))}],
        params, use_tqdm=False,
    )  # fmt: skip
    with torch.no_grad():
        embeds = hf.get_input_embeddings()(torch.tensor([ids]).clamp(max=vocab - 1))
        virtual = torch.tensor(ids) >= vocab
        embeds[0, virtual] = table[torch.tensor(ids)[virtual] - vocab]
        ref = hf.generate(
            inputs_embeds=embeds, attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    assert outs[0].outputs[0].token_ids == ref[0].tolist()[-N_NEW:]
    plain_ref = hf.generate(torch.tensor([list(range(50, 70))]), max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert outs[1].outputs[0].token_ids == plain_ref[0, 20:].tolist()


def test_tables_key_the_prefix_cache(setup) -> None:  # type: ignore[no-untyped-def]
    """Same ids with different tables must not share cached KV; the same table does."""
    llm, hf = setup
    vocab, hidden = hf.config.vocab_size, hf.config.hidden_size
    ids = [vocab, vocab + 1] + list(range(100, 140))
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    t1, t2 = torch.randn(2, hidden) * 0.1, torch.randn(2, hidden) * 0.1
    a = llm.generate([{"prompt_token_ids": ids, "prompt_embedding_table": t1}], params, use_tqdm=False)[0]
    b = llm.generate([{"prompt_token_ids": ids, "prompt_embedding_table": t2}], params, use_tqdm=False)[0]
    c = llm.generate([{"prompt_token_ids": ids, "prompt_embedding_table": t1.clone()}], params, use_tqdm=False)[0]
    assert b.num_cached_tokens == 0 and c.num_cached_tokens > 0
    assert c.outputs[0].token_ids == a.outputs[0].token_ids
    # the client's cache_salt (a prompt-dict key, as vLLM's) keys the blocks too, beside the table:
    # a salt does not replace the table's digest, and the same salt + table hits
    salted = {"prompt_token_ids": ids, "prompt_embedding_table": t1, "cache_salt": "s"}
    d = llm.generate([salted], params, use_tqdm=False)[0]
    e = llm.generate([{**salted, "prompt_embedding_table": t2}], params, use_tqdm=False)[0]
    f = llm.generate([{**salted}], params, use_tqdm=False)[0]
    assert (d.num_cached_tokens, e.num_cached_tokens) == (0, 0) and f.num_cached_tokens > 0
    assert d.outputs[0].token_ids == f.outputs[0].token_ids == a.outputs[0].token_ids
    with pytest.raises(ParamError) as err:
        llm.generate([{"prompt_token_ids": ids[2:], "cache_salt": 3}], params, use_tqdm=False)
    assert err.value.param == "cache_salt"


def test_virtual_ids_need_a_table_of_the_right_shape(setup) -> None:  # type: ignore[no-untyped-def]
    llm, hf = setup
    vocab = hf.config.vocab_size
    with pytest.raises(ParamError) as e:
        llm.generate([{"prompt_token_ids": [vocab, 5]}], use_tqdm=False)
    assert e.value.param == "prompt"
    with pytest.raises(ParamError) as e:
        llm.generate([{"prompt_token_ids": [vocab + 2, 5], "prompt_embedding_table": torch.zeros(2, hf.config.hidden_size)}], use_tqdm=False)
    assert e.value.param == "prompt"
    with pytest.raises(ParamError) as e:
        llm.generate([{"prompt_token_ids": [5], "prompt_embedding_table": torch.zeros(2, 3)}], use_tqdm=False)
    assert e.value.param == "prompt_embedding_table"


def test_tensorrt_llm_table_shape(setup) -> None:  # type: ignore[no-untyped-def]
    """TensorRT-LLM's [1, rows, hidden] float16 table and prompt_vocab_size are accepted."""
    llm, hf = setup
    vocab, hidden = hf.config.vocab_size, hf.config.hidden_size
    table = (torch.randn(3, hidden, generator=torch.Generator().manual_seed(1)) * 0.1).half()
    ids = [vocab + 2, vocab, 17, vocab + 1] + list(range(60, 75))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    trt = llm.generate([{"prompt_token_ids": ids, "prompt_embedding_table": table[None], "prompt_vocab_size": torch.tensor([3])}], params, use_tqdm=False)[0]
    ours = llm.generate([{"prompt_token_ids": ids, "prompt_embedding_table": table.float()}], params, use_tqdm=False)[0]
    assert trt.outputs[0].token_ids == ours.outputs[0].token_ids
    with pytest.raises(ParamError) as e:
        llm.generate([{"prompt_token_ids": ids, "prompt_embedding_table": table[None], "prompt_vocab_size": 4}], params, use_tqdm=False)
    assert e.value.param == "prompt_vocab_size"
