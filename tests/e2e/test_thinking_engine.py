"""The thinking budget and the grammar-after-thinking in the engine itself, with the runner in
its own worker process ("mp", async scheduling): `SamplingParams.thinking` pickles to the worker
and its `ThinkingState` decides there. The model is scripted (inflight/testing/reasoning.py):
greedy output is `<think>The teacher wants a color</think>Blue today!`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from inflight.llm import LLM
from inflight.sampling_params import SamplingParams
from inflight.structured.thinking import ThinkingParams
from inflight.testing.reasoning import ANSWER, THINKING, make_scripted_reasoning_checkpoint


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> Iterator[LLM]:  # type: ignore[no-untyped-def]
    path = make_scripted_reasoning_checkpoint(tmp_path_factory.mktemp("thinking_model"))
    llm = LLM(model=str(path), device="cpu", dtype="float32", distributed_executor_backend="mp", progress=False)
    yield llm
    llm.engine.shutdown()  # the worker process goes now, not at exit


def test_budget_and_grammar_in_the_worker(llm) -> None:  # type: ignore[no-untyped-def]
    ids = llm.engine.tokenizer.convert_tokens_to_ids
    prompt = "<|im_start|>user\nWhich color?<|im_end|>\n<|im_start|>assistant\n"
    think = ThinkingParams(ids("<think>"), ids("</think>"), "open", budget=2)
    free, budgeted = llm.generate([prompt, prompt], [
        SamplingParams(max_tokens=40, temperature=0),
        SamplingParams(max_tokens=40, temperature=0, thinking=think),
    ])  # fmt: skip
    assert free.outputs[0].text == f"<think>{THINKING}</think>{ANSWER}"
    assert budgeted.outputs[0].text == f"<think>The teacher</think>{ANSWER}"
    schema = {"type": "object", "properties": {"c": {"enum": ["blue", "red"]}}, "required": ["c"], "additionalProperties": False}
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=60, temperature=0, thinking=ThinkingParams(ids("<think>"), ids("</think>")),
                                                   structured_outputs={"json": schema}))  # fmt: skip
    head, _, answer = out.outputs[0].text.partition("</think>")
    assert head == f"<think>{THINKING}" and json.loads(answer)["c"] in ("blue", "red")
