#!/usr/bin/env python
"""Train the small demo chat model that ships in inflight/demo_model/.

Everything is made here, offline: an English chat corpus generated from templates and word
lists written for this script (no outside text, so the result carries the project's license),
a byte-level BPE tokenizer trained on that corpus, and a small Qwen2 decoder trained from
scratch on CPU. transformers trains it (this is an offline script; the inflight engine never
runs transformers models) and writes a bfloat16 safetensors checkpoint with config.json,
generation_config.json and a ChatML tokenizer.

    python scripts/train_demo_model.py                 # ~8 minutes on 2 CPU cores
    python scripts/train_demo_model.py --steps 1200    # a fixed number of steps (reproducible)

With --minutes (the default) the cosine schedule runs on elapsed time, so the step count
depends on how busy the machine is; it is printed and written to demo_model/README.md. With
--steps the run is deterministic (same seed, thread count and torch build).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

# the corpus (demo_words, demo_corpus) and its ChatML (demo_chatml) live beside this script
sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_chatml import CHAT_TEMPLATE, ENDOFTEXT, IM_END, IM_START, assistant_spans, render  # noqa: E402
from demo_corpus import build_corpus, conversation  # noqa: E402
from demo_words import NAME  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "inflight" / "demo_model"

MODEL_CONFIG: dict[str, Any] = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    hidden_act="silu",
)

# ================================================================================ tokenizer
def train_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    """The same byte-level BPE and ChatML wrapper as the test fixtures (inflight.testing)."""
    from inflight.testing import chatml_fast_tokenizer, train_bytelevel_bpe

    # The special tokens are added to the tokenizer, not learned: train on the text between them.
    def texts() -> Any:
        for doc in corpus:
            for part in doc.replace(IM_START, IM_END).split(IM_END):
                if part.strip():
                    yield part

    tok = train_bytelevel_bpe(texts(), vocab_size)
    return chatml_fast_tokenizer(tok, MODEL_CONFIG["max_position_embeddings"])


def save_tokenizer(tokenizer: Any, out_dir: Path) -> None:
    """As inflight.testing.build_tiny_tokenizer: the hub layout, readable by transformers 4 and 5."""
    tokenizer.save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config.pop("extra_special_tokens", None)
    tok_config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
    )
    config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    special_map = {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": [IM_START]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")


# ================================================================================= training
def tokenize(tokenizer: Any, corpus: list[str], train_on_prompts: bool) -> list[tuple[list[int], list[bool]]]:
    """Token ids of each conversation plus <|endoftext|>, and which tokens the loss counts.

    By default only the assistant replies (and the <|im_end|> that ends them) are learned: the
    questions are many-worded and random, and predicting them would take most of the small
    model's training signal away from answering.
    """
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    enc = tokenizer(corpus, add_special_tokens=False, return_offsets_mapping=True)
    docs = []
    for text, ids, offsets in zip(corpus, enc["input_ids"], enc["offset_mapping"]):
        if train_on_prompts:
            mask = [True] * len(ids)
        else:
            spans = assistant_spans(text)
            mask = [any(b <= s < e for b, e in spans) for s, _ in offsets]
        docs.append((ids + [eot], mask + [train_on_prompts]))
    return docs


def pack(docs: list[tuple[list[int], list[bool]]], seq_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole conversations greedily packed into rows of seq_len tokens.

    Every row starts at a conversation start (as a served prompt does); the tail of a row is
    padding, and it and the tokens not learned get label -100.
    """
    rows: list[tuple[list[int], list[int]]] = []
    row_ids: list[int] = []
    row_labels: list[int] = []
    for ids, mask in docs:
        ids, mask = ids[:seq_len], mask[:seq_len]
        if len(row_ids) + len(ids) > seq_len:
            rows.append((row_ids, row_labels))
            row_ids, row_labels = [], []
        row_ids.extend(ids)
        row_labels.extend(t if m else -100 for t, m in zip(ids, mask))
    if row_ids:
        rows.append((row_ids, row_labels))
    inputs = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), seq_len), -100, dtype=torch.long)
    for i, (r, lab) in enumerate(rows):
        inputs[i, : len(r)] = torch.tensor(r)
        labels[i, : len(r)] = torch.tensor(lab)
    return inputs, labels


def lr_at(step: int, progress: float, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warmup over `warmup` steps, then cosine from peak to floor * peak as progress goes 0 -> 1."""
    progress = min(1.0, max(0.0, progress))
    cosine = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return peak * min(1.0, (step + 1) / warmup) * cosine


SAMPLE_PROMPTS = [
    "Hello! What is your name?",
    "What is a cat?",
    "What color is the sky?",
    "What is 3 plus 4?",
    "What day comes after Monday?",
    "Tell me a story.",
    "Can you explain quantum physics?",
    "What is the capital of France?",
]


@torch.no_grad()
def show_samples(model: Any, tokenizer: Any, seed: int) -> None:
    model.eval()
    for prompt in SAMPLE_PROMPTS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids = torch.tensor([tokenizer.encode(text)])
        eos = tokenizer.convert_tokens_to_ids(IM_END)
        greedy = model.generate(ids, max_new_tokens=60, do_sample=False, eos_token_id=eos, pad_token_id=0)
        torch.manual_seed(seed)
        sampled = model.generate(ids, max_new_tokens=60, do_sample=True, temperature=0.7, top_p=0.9,
                                 top_k=0, eos_token_id=eos, pad_token_id=0)
        print(f"USER: {prompt}")
        print(f"  greedy : {tokenizer.decode(greedy[0, ids.shape[1]:])!r}")
        print(f"  sampled: {tokenizer.decode(sampled[0, ids.shape[1]:])!r}")


def readme(i: dict[str, Any]) -> str:
    c = MODEL_CONFIG
    return (
        f"# {NAME}: the inflight demo model\n\n"
        "A tiny chat model that ships with inflight, so that a first chat request works without\n"
        "downloading anything. It was trained from scratch by `scripts/train_demo_model.py` on a\n"
        "synthetic English corpus that the script generates from its own templates and word lists\n"
        "(greetings, simple facts about animals, colors, food, numbers, days, months and seasons,\n"
        "small sums, short stories). No outside text or weights were used; it is released under\n"
        "the project's license (Apache-2.0).\n\n"
        "It only knows what its corpus says, and gets some of that wrong: it is meant for smoke\n"
        "tests and first runs, not for real use.\n\n"
        f"- architecture: Qwen2ForCausalLM, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
        f"{c['num_attention_heads']} heads ({c['num_key_value_heads']} KV heads), intermediate "
        f"{c['intermediate_size']}, tied embeddings, {c['max_position_embeddings']} positions; "
        f"{i['n_params'] / 1e6:.2f} M parameters, {i['dtype']} ({i['mb']:.1f} MB)\n"
        f"- tokenizer: byte-level BPE, {i['vocab']} tokens, ChatML chat template, eos `<|im_end|>`\n"
        f"- corpus: {i['conversations']} conversations, {i['n_tokens']} tokens of which "
        f"{i['n_learned']} are learned (seed {i['seed']})\n"
        f"- training: {i['steps']} steps of {i['batch_size']} x {i['seq_len']} packed tokens, AdamW, "
        f"peak lr {i['lr']:g}, cosine ({i['budget']}); final loss {i['final']:.3f} on the learned tokens\n"
        f"- generation defaults (generation_config.json): temperature 0.7, top_p 0.9\n\n"
        "Train the same number of steps again (deterministic for a given torch build and thread\n"
        "count; a --minutes run spreads its schedule over time instead, so it is not bit-exact):\n\n"
        "```bash\n"
        f"python scripts/train_demo_model.py --steps {i['steps']} --conversations {i['conversations']} "
        f"--vocab-size {i['vocab_size']} --seed {i['seed']} --threads {i['threads']}{i['extra']}\n"
        "```\n"
    )


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--minutes", type=float, default=8.0, help="training time budget (ignored with --steps)")
    p.add_argument("--steps", type=int, default=None, help="a fixed number of optimizer steps")
    p.add_argument("--conversations", type=int, default=60000)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8, help="packed rows per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=30, help="warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--train-on-prompts", action="store_true",
                   help="learn every token, not just the assistant replies")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="saved weights")
    return p.parse_args()


def _data(args: argparse.Namespace) -> tuple[Any, torch.Tensor, torch.Tensor, dict[str, int]]:
    """The tokenizer, the packed rows (inputs, labels) and the corpus counts the README reports."""
    corpus = build_corpus(args.conversations, args.seed)
    tokenizer = train_tokenizer(corpus, args.vocab_size)
    probe = conversation(random.Random(args.seed + 1))
    assert tokenizer.apply_chat_template(probe, tokenize=False) == render(probe), "template drift"
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    docs = tokenize(tokenizer, corpus, args.train_on_prompts)
    n_tokens = sum(len(ids) for ids, _ in docs)
    n_learned = sum(sum(mask) for _, mask in docs)
    n_words = sum(len(doc.split()) for doc in corpus)
    inputs, labels = pack(docs, args.seq_len, eot)
    print(f"corpus: {len(corpus)} conversations, {sum(map(len, corpus)) / 1e6:.2f} M chars, "
          f"{n_words} words, {n_tokens} tokens ({n_learned} learned), {len(set(corpus))} distinct "
          "conversations; "
          f"vocab {len(tokenizer)}; {inputs.shape[0]} packed rows of {args.seq_len}", flush=True)
    return tokenizer, inputs, labels, {"n_tokens": n_tokens, "n_learned": n_learned}


def _new_model(tokenizer: Any) -> tuple[Any, int]:
    """A randomly initialised Qwen2 of MODEL_CONFIG's shape for this tokenizer, and its parameter count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2Config(
        **MODEL_CONFIG,
        vocab_size=len(tokenizer),
        bos_token_id=ids(ENDOFTEXT),  # as Qwen: the tokenizer itself never adds a BOS
        eos_token_id=ids(IM_END),
        pad_token_id=ids(ENDOFTEXT),
    )
    model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen2 {MODEL_CONFIG}, {n_params / 1e6:.2f} M parameters", flush=True)
    return model, n_params


def _optimizer(model: Any, args: argparse.Namespace) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )


def _batches(inputs: torch.Tensor, labels: torch.Tensor, batch_size: int, seed: int) -> Any:
    """Endless batches of packed rows: a fresh shuffle whenever the current one runs short."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(inputs.shape[0], generator=gen)
    cursor = 0
    while True:
        if cursor + batch_size > len(order):
            order, cursor = torch.randperm(inputs.shape[0], generator=gen), 0
        idx = order[cursor : cursor + batch_size]
        cursor += batch_size
        yield inputs[idx], labels[idx]


def _train(model: Any, inputs: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace) -> tuple[int, float, float]:
    """The training loop; returns the steps taken, the last step's loss and the seconds it took."""
    opt = _optimizer(model, args)
    batches = _batches(inputs, labels, args.batch_size, args.seed)
    # Progress (which drives the cosine) is steps done / --steps, or else time spent / --minutes:
    # a time-budgeted run always finishes its schedule, however fast this machine is today.
    budget_s = args.minutes * 60
    model.train()
    t_train = time.time()

    def progress(step: int) -> float:
        if args.steps is not None:
            return step / args.steps
        return (time.time() - t_train) / budget_s

    step, ema = 0, None
    while progress(step) < 1.0:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, progress(step), args.lr, args.warmup)
        x, y = next(batches)
        loss = model(input_ids=x, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.4f} (ema {ema:.4f}) lr {opt.param_groups[0]['lr']:.2e} "
                  f"progress {progress(step):.0%} {time.time() - t_train:.0f}s", flush=True)
    return step, loss.item(), time.time() - t_train


def _final_loss(model: Any, inputs: torch.Tensor, labels: torch.Tensor, dtype: str) -> tuple[Any, float]:
    """The model rounded to the saved dtype (and back to float32), and its loss over a fixed
    slice of rows: the final loss of the weights as shipped."""
    model = model.to(getattr(torch, dtype)).to(torch.float32).eval()
    with torch.no_grad():
        eval_rows = torch.arange(min(64, inputs.shape[0]))
        final = sum(model(input_ids=inputs[i : i + 16], labels=labels[i : i + 16]).loss.item()
                    for i in range(0, len(eval_rows), 16)) / math.ceil(len(eval_rows) / 16)
    return model, final


def _save(model: Any, tokenizer: Any, args: argparse.Namespace, info: dict[str, Any]) -> Path:
    """The checkpoint, generation config, tokenizer and README in --out (replaced); returns the
    weights file."""
    from transformers import GenerationConfig

    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model = model.to(getattr(torch, args.dtype))
    model.config.dtype = getattr(torch, args.dtype)
    model.save_pretrained(str(out), safe_serialization=True)
    config = model.config
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=0.7,
        top_p=0.9,
        max_new_tokens=128,
    ).save_pretrained(str(out))
    save_tokenizer(tokenizer, out)
    weights = out / "model.safetensors"
    (out / "README.md").write_text(readme(info | dict(mb=weights.stat().st_size / 1e6)))
    return weights


def main() -> None:
    args = _parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    t_start = time.time()

    tokenizer, inputs, labels, counts = _data(args)
    model, n_params = _new_model(tokenizer)
    step, last_loss, train_s = _train(model, inputs, labels, args)
    tokens_seen = step * args.batch_size * args.seq_len
    model, final = _final_loss(model, inputs, labels, args.dtype)
    print(f"trained {step} steps ({tokens_seen / 1e6:.2f} M tokens) in {train_s / 60:.1f} min; "
          f"last-step loss {last_loss:.4f}, final loss ({args.dtype} weights, 64 rows) {final:.4f}",
          flush=True)

    info = dict(
        n_params=n_params, dtype=args.dtype, vocab=len(tokenizer),
        conversations=args.conversations, seed=args.seed, **counts,
        steps=step, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr, final=final,
        vocab_size=args.vocab_size, threads=args.threads,
        budget=f"--steps {args.steps}" if args.steps is not None else f"--minutes {args.minutes:g}",
        extra=" --train-on-prompts" if args.train_on_prompts else "",
    )
    weights = _save(model, tokenizer, args, info)
    print(f"saved {args.out} ({weights.stat().st_size / 1e6:.2f} MB weights) in {(time.time() - t_start) / 60:.1f} min total")
    show_samples(model.to(torch.float32), tokenizer, args.seed)


if __name__ == "__main__":
    main()
