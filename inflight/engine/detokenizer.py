"""Incremental detokenization that never emits broken UTF-8.

Byte-level tokenizers split one character (a CJK ideograph, an emoji) over
several tokens; decoding a partial run yields U+FFFD. We decode a sliding
window `tokens[prefix_offset:]` and emit only the part beyond the text of
`tokens[prefix_offset:read_offset]`, and only once it no longer ends in U+FFFD.
Diffing against the prefix's own decode also keeps tokenizer quirks (leading
spaces of SentencePiece pieces) out of the delta.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inflight.outputs import TextSoFar

# Prompt tokens kept as left context so the first output token decodes as it would mid-text.
_CONTEXT_TOKENS = 5


def backend_decoder(tokenizer: Any) -> Callable[..., str] | None:
    """The `tokenizers` (Rust) decode under a transformers fast tokenizer, where calling it
    straight gives what `tokenizer.decode` gives: its `decode` and `_decode` are transformers'
    own and the clean-up pass does not run (off, or skipped for a BPE model, as transformers
    5.x does). `tokenizer.decode` spends ~5x the Rust call's time converting and checking its
    arguments (3.4 vs 1.0 us for a 6-token window, Zen 4), and the detokenizer decodes twice per token; None where
    the shortcut would differ."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    cls = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend) or cls.decode is not TokenizersBackend.decode:
        return None
    if cls._decode is not TokenizersBackend._decode:
        return None
    backend = tokenizer.backend_tokenizer
    if tokenizer.clean_up_tokenization_spaces and not (
        type(backend.model).__name__ == "BPE"
        and not getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    ):
        return None
    return backend.decode


def renders_at_once(tokenizer: Any) -> bool:
    """Does decoding a run of tokens at once give the text that pushing them one by one gives?
    Yes for a byte-level BPE decoder (GPT-2, Llama 3, Qwen: the tokens' bytes, joined, decoded
    with U+FFFD for what is not UTF-8). Not for byte fallback (Llama 2, Mistral): a run of byte
    tokens that is not UTF-8 renders as one U+FFFD per byte, valid bytes in the run included, so
    the text depends on where the windows were cut (tests/e2e/test_final_only.py)."""
    if backend_decoder(tokenizer) is None:
        return False
    return type(tokenizer.backend_tokenizer.decoder).__name__ == "ByteLevel"


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        one_token_texts: dict[int, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.backend = backend_decoder(tokenizer)  # the same text, a fifth of the time
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        known = self.known = len(tokenizer)  # p-tuning's virtual ids are not in the tokenizer
        self.tokens: list[int] = [t for t in prompt_token_ids[-_CONTEXT_TOKENS:] if t < known]
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self.text_so_far = TextSoFar()  # the text so far, as the pieces pushed (joined when read)
        # token id -> its text alone, shared by the detokenizers of one tokenizer and these
        # options: the prefix window of a push is most often the one token the last push emitted,
        # so half the decodes become a lookup (each decode costs 15-25 us of a batch-1 step,
        # cache-cold after the C step; Zen 4)
        self.one_token_texts = one_token_texts

    @property
    def text(self) -> str:
        return str(self.text_so_far)

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        if self.backend is not None:  # fast tokenizers ignore spaces_between_special_tokens
            return self.backend(ids, skip_special_tokens=self.skip_special_tokens)
        kwargs: dict[str, Any] = {"skip_special_tokens": self.skip_special_tokens}
        if not self.spaces_between_special_tokens:
            kwargs["spaces_between_special_tokens"] = False
        return self.tokenizer.decode(ids, **kwargs)

    def _decode_prefix(self) -> str:
        """The text of the window before the newest tokens."""
        texts, at = self.one_token_texts, self.prefix_offset
        if texts is None or self.read_offset != at + 1:
            return self._decode(self.tokens[at : self.read_offset])
        token = self.tokens[at]
        text = texts.get(token)
        if text is None:
            text = texts[token] = self._decode([token])
        return text

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        if token_id >= self.known and self.backend is not None and self.tokenizer.backend_tokenizer.id_to_token(token_id) is None:
            # no such token (a padded vocabulary's rows): the Rust decode drops it from every
            # window, so it renders nothing, ever; kept out, it no longer holds the window open
            # (which then grew, and was decoded whole, every step)
            return ""
        self.tokens.append(token_id)
        prefix_text = self._decode_prefix()
        new_text = self._decode(self.tokens[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""  # incomplete character (or a token that renders as nothing yet)
        delta = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.tokens)
        self.text_so_far.append(delta)
        return delta

    def finish(self, token_ids: list[int]) -> str:
        """Add the tokens not pushed yet all at once, then flush: two decodes for the lot instead
        of two per token (a final-only request without stop strings); the text pushing them one
        by one gives where `renders_at_once(tokenizer)`."""
        self.tokens.extend(token_ids)
        return self.flush()

    def flush(self) -> str:
        """At the end of generation: whatever is still held back, replacement chars included."""
        prefix_text = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.tokens[self.prefix_offset :])
        delta = new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
        self.prefix_offset = self.read_offset = len(self.tokens)
        self.text_so_far.append(delta)
        return delta
