"""The tiny byte-level BPE tokenizer (ChatML), trained in-process on a generated corpus."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
TINY_VOCAB_SIZE = 1000

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# ------------------------------------------------------------------------------------ tokenizer
_SUBJECTS = (
    "the cat|a dog|my friend|the old man|a young girl|the teacher|our team|the robot|a small bird|"
    "the engineer|her brother|the city|a farmer|the doctor|his sister|the captain|a stranger|"
    "the children|my neighbor|the artist|a student|the pilot|the king|a merchant"
).split("|")
_VERBS = (
    "sees likes builds finds reads writes opens carries paints watches follows cleans moves takes "
    "brings sells helps drives remembers forgets loves hates chooses answers borrows catches draws "
    "explains fixes gathers hides imagines joins keeps lifts measures notices orders plants "
    "questions repairs shares teaches visits wants"
).split()
_ADJECTIVES = (
    "red big quiet happy bright heavy green strange simple fast warm cold little ancient golden "
    "wooden blue soft yellow purple silent noisy gentle brave clever dusty empty famous fragile "
    "hidden hollow lucky modern narrow perfect rapid rough shiny sleepy tiny wild"
).split()
_NOUNS = (
    "house book river garden window letter apple mountain road song table picture machine bridge "
    "story forest ship flower computer market island castle candle blanket bottle button camera "
    "carpet ceiling chimney compass desert engine feather fountain guitar hammer harbor helmet "
    "kettle ladder lantern meadow mirror needle ocean orchard pencil pillow planet puzzle rabbit "
    "saddle shadow spoon statue tunnel umbrella valley village wagon whistle"
).split()
_ENDINGS = (
    "today|every morning|at night|in the park|with care|again|near the sea|before dinner|"
    "after school|quickly|in winter|on Sunday|without a word|for the first time"
).split("|")
_CHINESE = "你好世界，今天天气很好。我们一起去公园散步吧。这是一个简单的测试。人工智能正在改变世界！明天会下雨吗？"
_EMOJI = "😀🚀🎉👍"
# Seen once only, so BPE never merges their bytes: they stay split across several tokens.
_RARE = "龍鳳麒麟饕餮魑魅魍魉🦄🧩🪐🫠🦖🧬"


def _corpus() -> list[str]:
    rng = random.Random(1234)
    lines = []
    for i in range(600):
        line = (
            f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} "
            f"{rng.choice(['a', 'the', 'one', 'every', 'that'])} {rng.choice(_ADJECTIVES)} "
            f"{rng.choice(_NOUNS)} {rng.choice(_ENDINGS)}{rng.choice('.!?.')}"
        )
        if i % 8 == 0:
            line += f" {rng.randint(0, 9999)} {rng.choice(_EMOJI)}"
        lines.append(line)
    for _ in range(80):
        start = rng.randrange(len(_CHINESE) - 8)
        lines.append(_CHINESE[start : start + rng.randint(4, 12)] + rng.choice(["", *_EMOJI]))
    lines.append(_RARE)
    return lines


_tokenizer_json: str | None = None


def train_bytelevel_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 / Qwen style) with our special tokens; deterministic for a given corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def chatml_fast_tokenizer(tok: Tokenizer, model_max_length: int) -> Any:
    """The transformers fast tokenizer around `tok`: ChatML template, eos <|im_end|>, pad <|endoftext|>."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def tiny_tokenizer_json() -> str:
    """Train once per process; training is deterministic, so the cache is only a speed-up."""
    global _tokenizer_json
    if _tokenizer_json is None:
        _tokenizer_json = train_bytelevel_bpe(_corpus(), TINY_VOCAB_SIZE).to_str()
    return _tokenizer_json


def tiny_tokenizer() -> Any:
    return chatml_fast_tokenizer(Tokenizer.from_str(tiny_tokenizer_json()), model_max_length=512)


def build_tiny_tokenizer(out_dir: str | Path) -> Path:
    """Write a 1000-token byte-level BPE tokenizer (GPT-2/Qwen style, ChatML) to out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tiny_tokenizer().save_pretrained(str(out_dir))
    # transformers 5 writes the template only to chat_template.jinja, names its own backend class
    # and drops special_tokens_map.json; add the layout of hub checkpoints and transformers 4 too.
    config_path = out_dir / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config.pop("extra_special_tokens", None)
    tok_config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
    )
    config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    special_map = {
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "additional_special_tokens": [IM_START],
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return out_dir
