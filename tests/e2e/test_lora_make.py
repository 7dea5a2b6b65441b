"""`inflight lora make OUT_DIR`: the adapter a new user tries LoRA with (README). It loads in PEFT
and in inflight, and inflight's greedy tokens with it are PEFT's on the demo model."""

from __future__ import annotations

from pathlib import Path

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from inflight import LLM, SamplingParams, cli
from inflight.engine.args import DEMO_MODEL

MAX_TOKENS = 12


@torch.no_grad()
def _peft_greedy(adapter: Path | None, prompt: list[int]) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32, local_files_only=True)
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, str(adapter))
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                         do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def test_lora_make_writes_an_adapter_that_matches_peft(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "my-lora"
    cli.main(["lora", "make", str(out)])
    assert f"--lora-modules my-lora={out}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="not empty"):  # never overwrites
        cli.main(["lora", "make", str(out)])
    tok = AutoTokenizer.from_pretrained(DEMO_MODEL)
    text = tok.apply_chat_template([{"role": "user", "content": "What color is the sky?"}], tokenize=False, add_generation_prompt=True)
    prompt = tok.encode(text, add_special_tokens=False)
    llm = LLM(model=DEMO_MODEL, dtype="float32", device="cpu", enable_lora=True, progress=False)
    llm.load_lora_adapter("my-lora", str(out))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    base, tuned = llm.generate([{"prompt_token_ids": prompt}, {"prompt_token_ids": prompt, "lora_name": "my-lora"}],
                               params, use_tqdm=False)  # fmt: skip
    assert tuned.outputs[0].token_ids == _peft_greedy(out, prompt)
    assert base.outputs[0].token_ids == _peft_greedy(None, prompt)
    assert tuned.outputs[0].token_ids != base.outputs[0].token_ids  # the adapter visibly changes the answer
