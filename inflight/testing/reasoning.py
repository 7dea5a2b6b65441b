"""A tiny reasoning model that thinks on cue: a scripted checkpoint for the reasoning tests.

Its tokenizer is the tiny ChatML one plus Qwen3's added (not special) `<think>`, `</think>`,
`<tool_call>`, `</tool_call>` tokens, and its chat template is shaped like Qwen3's: Hermes tool
calls, `enable_thinking` (false closes an empty `<think>\\n\\n</think>` in the prompt).

The weights make greedy decoding follow a script: every layer's output projections are zero, so
the last hidden state is the current token's embedding, and the LM head maps token t to the next
token of the script (row next(t) = 10 * embedding(t); with 64 random dimensions the right row
scores ~640 after the norm, any other below ~200). So after `<|im_start|>assistant\\n` the model
writes `<think>` THINKING `</think>` ANSWER `<|im_end|>`, whatever the prompt said; and wherever
something else (a grammar, a thinking budget) forces a script token, it carries on from there.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from inflight.testing.checkpoints import make_tiny_checkpoint
from inflight.testing.tokenizer import IM_END

THINKING = "The teacher wants a color"
ANSWER = "Blue today!"
REASONING_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

QWEN3_LIKE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions.\n<tools>"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools>\n"
    'Answer calls as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n{% if m.content %}{{ m.content }}{% endif %}"
    "{%- for tc in m.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{%- endif %}{%- endif %}"
)


def make_scripted_reasoning_checkpoint(out_dir: str | Path, thinking: str = THINKING, answer: str = ANSWER) -> Path:
    """Write the scripted model (qwen2 shapes, vocab 1024, untied head) to out_dir."""
    from transformers import AutoTokenizer

    path = make_tiny_checkpoint("qwen2", out_dir, vocab_size=1024, tie_word_embeddings=False, max_position_embeddings=4096)
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_tokens(list(REASONING_TOKENS))  # as Qwen3: added, not special
    tok.chat_template = QWEN3_LIKE_TEMPLATE
    tok.save_pretrained(path)
    ids = tok.convert_tokens_to_ids
    script = [
        tok.encode("\n")[-1], ids("<think>"), *tok.encode(thinking), ids("</think>"), *tok.encode(answer), ids(IM_END),
    ]  # fmt: skip
    if len(set(script)) != len(script):
        raise ValueError(f"the script repeats a token: {script}")
    weights_file = path / "model.safetensors"
    weights = load_file(str(weights_file))
    hidden = weights["model.embed_tokens.weight"].shape[1]
    gen = torch.Generator().manual_seed(7)
    embed = torch.randn(weights["model.embed_tokens.weight"].shape, generator=gen)
    head = torch.zeros_like(embed)
    for cur, nxt in zip(script, script[1:]):
        head[nxt] = 10.0 * embed[cur]
    for name, w in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = torch.zeros_like(w)
        elif name == "model.norm.weight":
            weights[name] = torch.ones(hidden, dtype=w.dtype)
    weights["model.embed_tokens.weight"] = embed.to(weights["model.embed_tokens.weight"].dtype)
    weights["lm_head.weight"] = head.to(weights["model.embed_tokens.weight"].dtype)
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    return path
