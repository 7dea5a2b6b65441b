"""Speculation with a grammar and with thinking tags: each draft row is masked by the grammar
(and the thinking state) after the drafts before it, a draft the grammar rejects ends the run of
accepted tokens, and the matcher advances by the kept tokens only. The scripted reasoning model
(inflight/testing/reasoning.py) is its own draft model, or a mirror EAGLE-1 head's target: its
drafts are its unconstrained greedy tokens, which its grammar rejects once the answer starts, and which the thinking budget cuts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inflight import LLM, SamplingParams
from inflight.structured.thinking import ThinkingParams
from inflight.testing.eagle import make_eagle1_head, make_scripted_eagle3_head
from inflight.testing.reasoning import ANSWER, THINKING, make_scripted_reasoning_checkpoint

PROMPT = "<|im_start|>user\nWhich color?<|im_end|>\n<|im_start|>assistant\n"
SCHEMA = {"type": "object", "properties": {"c": {"enum": ["blue", "red"]}}, "required": ["c"], "additionalProperties": False}


@pytest.fixture(scope="module", params=["draft_model", "eagle"])
def llm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LLM:
    """The scripted model proposes for itself: as its own draft model, or through an EAGLE-1 head
    that is its layer with fc = [I | 0] (its output projections are zero, so the head's output is
    the next token's embedding, which the target's lm_head maps to the token after it)."""
    root = tmp_path_factory.mktemp("scripted")
    path = make_scripted_reasoning_checkpoint(root / "target")
    model = path if request.param == "draft_model" else make_eagle1_head(path, root / "head", mirror=True)
    spec = {"method": request.param, "model": str(model), "num_speculative_tokens": 4}
    return LLM(model=str(path), device="cpu", dtype="float32", speculative_config=spec, progress=False)


def _both(llm: LLM, params: SamplingParams, prompts: list[Any] | None = None) -> tuple[Any, Any]:
    prompts = prompts or [PROMPT]
    saved, llm.engine.speculator = llm.engine.speculator, None
    try:
        off = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.engine.speculator = saved
    on = llm.generate(prompts, params, use_tqdm=False)
    llm.engine.kv.pool.check_idle()
    return off, on


def test_thinking_budget_and_grammar_speculate(llm: LLM) -> None:
    ids = llm.engine.tokenizer.convert_tokens_to_ids
    free_off, free = _both(llm, SamplingParams(max_tokens=40, temperature=0))
    assert free[0].outputs[0].text == free_off[0].outputs[0].text == f"<think>{THINKING}</think>{ANSWER}"
    assert free[0].metrics.num_accepted_draft_tokens == free[0].metrics.num_draft_tokens > 0
    think = ThinkingParams(ids("<think>"), ids("</think>"), "open", budget=2)
    off, on = _both(llm, SamplingParams(max_tokens=40, temperature=0, thinking=think))
    assert on[0].outputs[0].text == off[0].outputs[0].text == f"<think>The teacher</think>{ANSWER}"
    m = on[0].metrics  # the budget forces </think> at a draft row: the draft there is rejected
    assert 0 < m.num_accepted_draft_tokens < m.num_draft_tokens
    grammar = SamplingParams(max_tokens=60, temperature=0, thinking=ThinkingParams(ids("<think>"), ids("</think>")),
                             structured_outputs={"json": SCHEMA})  # fmt: skip
    off, on = _both(llm, grammar)
    text = on[0].outputs[0].text
    assert text == off[0].outputs[0].text and on[0].outputs[0].finish_reason == "stop"
    head, _, answer = text.partition("</think>")
    assert head == f"<think>{THINKING}" and json.loads(answer)["c"] in ("blue", "red")
    m = on[0].metrics  # thinking drafts kept, the answer's unconstrained drafts rejected by the grammar
    assert 0 < m.num_accepted_draft_tokens < m.num_draft_tokens


def test_grammar_completing_inside_a_run_of_accepted_drafts(llm: LLM) -> None:
    """A choice grammar the model's own drafts satisfy: the matcher completes at an accepted draft
    (EOS, the 13th token: the second of the third step's 4 drafts), the rows after it are free and
    agree with the drafts, and the run is cut there, as without speculation (ignore_eos: only the
    grammar ends the request)."""
    ids = llm.engine.tokenizer.convert_tokens_to_ids
    think = ThinkingParams(ids("<think>"), ids("</think>"))
    params = SamplingParams(max_tokens=60, temperature=0, thinking=think, ignore_eos=True,
                            structured_outputs={"choice": ["Blue", "Blue today!"]})  # fmt: skip
    off, on = _both(llm, params)
    assert on[0].outputs[0].text == off[0].outputs[0].text
    assert on[0].outputs[0].token_ids == off[0].outputs[0].token_ids


def test_client_drafts_with_a_grammar(llm: LLM) -> None:
    """A client's drafts (draft_input_ids) combine with a grammar: the agreeing drafts are kept,
    the tokens are the constrained ones."""
    params = SamplingParams(max_tokens=30, temperature=0, structured_outputs={"choice": ["<think>The", "<think>Their"]})
    prompt = llm.engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    off, _ = _both(llm, params, [{"prompt_token_ids": prompt}])
    ref = off[0].outputs[0].token_ids
    saved, llm.engine.speculator = llm.engine.speculator, None
    try:
        (out,) = llm.generate([{"prompt_token_ids": prompt, "draft_input_ids": ref[:2] + [7]}], params, use_tqdm=False)
    finally:
        llm.engine.speculator = saved
    assert out.outputs[0].token_ids == ref and out.metrics.num_accepted_draft_tokens == 2


def test_ngram_drafts_with_a_grammar(tmp_path: Path) -> None:
    """n-gram drafts copied from a prompt that holds the script: kept through the thinking, the
    answer's rejected by the JSON grammar; the text is the constrained one without speculation."""
    path = str(make_scripted_reasoning_checkpoint(tmp_path / "target"))
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    llm = LLM(model=path, device="cpu", dtype="float32", speculative_config=spec, progress=False)
    ids = llm.engine.tokenizer.convert_tokens_to_ids
    prompt = f"<|im_start|>user\n<think>{THINKING}</think>{ANSWER}<|im_end|>\n<|im_start|>assistant\n"
    grammar = SamplingParams(max_tokens=60, temperature=0, thinking=ThinkingParams(ids("<think>"), ids("</think>")),
                             structured_outputs={"json": SCHEMA})  # fmt: skip
    off, on = _both(llm, grammar, [prompt])
    text = on[0].outputs[0].text
    assert text == off[0].outputs[0].text and text.startswith(f"<think>{THINKING}</think>")
    m = on[0].metrics
    assert 0 < m.num_accepted_draft_tokens < m.num_draft_tokens


def test_eagle3_head_drafts_through_d2t(tmp_path: Path) -> None:
    """A scripted EAGLE-3 head (inflight/testing/eagle.py) whose draft vocabulary is the script's
    tokens in reverse order: its first draft of every step is the target's next token only if the
    captured layer inputs and the d2t mapping are right; its later drafts are wrong by design.
    With a JSON grammar its drafts for the (unconstrained) answer are rejected."""
    path = make_scripted_reasoning_checkpoint(tmp_path / "target")
    head = make_scripted_eagle3_head(path, tmp_path / "head")
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 2}
    llm = LLM(model=str(path), device="cpu", dtype="float32", speculative_config=spec, progress=False)
    off, on = _both(llm, SamplingParams(max_tokens=40, temperature=0))
    assert on[0].outputs[0].text == off[0].outputs[0].text == f"<think>{THINKING}</think>{ANSWER}"
    m = on[0].metrics
    assert m.num_accepted_draft_tokens == m.num_drafts > 3 and m.num_draft_tokens > m.num_drafts, (m.num_accepted_draft_tokens, m.num_drafts, m.num_draft_tokens)
    ids = llm.engine.tokenizer.convert_tokens_to_ids
    grammar = SamplingParams(max_tokens=60, temperature=0, thinking=ThinkingParams(ids("<think>"), ids("</think>")),
                             structured_outputs={"json": SCHEMA})  # fmt: skip
    off, on = _both(llm, grammar)  # thinking drafts kept (one per step), the answer's rejected by the grammar
    assert on[0].outputs[0].text == off[0].outputs[0].text and on[0].outputs[0].text.startswith(f"<think>{THINKING}</think>")
    assert 0 < on[0].metrics.num_accepted_draft_tokens < on[0].metrics.num_drafts
