"""SamplingParams: what to generate for one request, validated at construction.

Field names follow vLLM so users can switch; the TensorRT-LLM engine names of
SPEC §1 map onto them in the protocol layers (e.g. `request_output_len` ->
`max_tokens`, `end_id` -> `end_id`). Controls that arrive with the decoding
controls issue slot in as new fields plus a logits processor in `sample/`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inflight.errors import ParamError
from inflight.structured.params import StructuredOutputsParams
from inflight.structured.thinking import ThinkingParams

__all__ = ["ParamError", "SamplingParams", "StructuredOutputsParams", "embedding_params"]

_UINT64_MAX = 2**64 - 1


def _check(cond: bool, param: str, message: str) -> None:
    if not cond:
        raise ParamError(f"{param}: {message}", param=param)


@dataclass
class SamplingParams:
    """Per-request generation settings.

    Args:
        n: number of output sequences to return.
        best_of: sequences generated (>= n); the n with the highest cumulative logprob return.
        max_tokens: most new tokens to generate (capped by the model length).
        min_tokens: EOS / stop ids are banned until this many tokens exist.
        temperature: 0 means greedy.
        top_k: 0 or -1 disables.
        top_p: nucleus mass in (0, 1].
        seed: per-request generator; same seed + same request = same tokens,
            whatever else shares the batch.
        stop: strings that end generation (trimmed from the text unless
            `include_stop_str_in_output`).
        stop_token_ids: token ids that end generation (kept in token_ids,
            not rendered in text).
        ignore_eos: keep generating past EOS.
        logprobs: return the chosen token's logprob and the top-N (0 = chosen only, -1 = every
            token of the vocabulary, as vLLM).
        allowed_token_ids: only these token ids may be sampled (vLLM); every other is masked.
        skip_special_tokens: drop special tokens from the decoded text.
        end_id: overrides the model's EOS ids for this request.
        repetition_penalty: CTRL/HF multiplicative penalty over prompt and output tokens; 1 = off
            (any value > 0; MindIE documents values above 2 as allowed but not recommended).
        presence_penalty, frequency_penalty: OpenAI additive penalties over output tokens.
        logit_bias: token id -> additive bias.
        embedding_bias: additive bias over the whole vocabulary (one value per token id).
        stop_token_sequences: token-id sequences that end generation when the output ends with
            one (TensorRT-LLM stop words; unlike `stop` strings they stay in tokens and text).
        min_p: drop tokens whose probability is below min_p x the top probability.
        typical_p: locally typical sampling mass; 1 = off.
        no_repeat_ngram_size: ban tokens that would repeat an n-gram of the sequence.
        bad_words / bad_words_ids: sequences never produced (the last token of a sequence is
            banned when its prefix has just been generated). `bad_words` takes strings and
            token-id lists (the lists move to `bad_words_ids`).
        embedding_bias: a list, or TensorRT-LLM's [1, vocab] tensor / nested list.
        max_batch_size: MindIE's `batch_size`: while this request runs, every engine step runs at
            most this many sequences (1: it runs alone, a latency mode); None = no cap. A beam
            search needs at least its width (its beams run side by side). See core/admission.py.
    """

    n: int = 1
    best_of: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    # vLLM's: report the logprobs of exactly these ids (with the chosen token's) instead of the top-N
    logprob_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    end_id: int | None = None
    pad_id: int | None = None
    detokenize: bool = True
    # decoding controls (SPEC §1), applied in HF's order: see sample/processors.py
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None  # only these may be sampled (vLLM)
    embedding_bias: list[float] | None = None  # a full-vocabulary additive bias (TensorRT-LLM)
    stop_token_sequences: list[list[int]] | None = None  # token-id stop words; kept in tokens and text
    min_p: float = 0.0
    typical_p: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words: list[str | list[int]] | None = None  # strings are tokenized by the engine into bad_words_ids
    bad_words_ids: list[list[int]] | None = None
    watermark: bool = False  # green-list watermark (sample/watermark.py; detect with detect_watermark)
    prompt_logprobs: int | None = None  # per prompt token: its logprob + the top-N (first token: None)
    return_context_logits: bool = False  # (prompt_len, vocab) float32 logits of the prompt positions
    return_generation_logits: bool = False  # (generated, vocab) raw logits of each generated token
    # embeddings from a decoder model: "last" (final hidden state of the last prompt token) or
    # "mean" (over the prompt), L2-normalized, in RequestOutput.embedding (see LLM.embed)
    pooling: str | None = None
    # grammar-constrained output (xgrammar): a StructuredOutputsParams or a dict of its fields
    structured_outputs: StructuredOutputsParams | dict[str, Any] | None = None
    # a reasoning model's thinking tags, where it begins and its budget (structured/thinking.py):
    # the grammar starts after the thinking; past the budget the end token is forced
    thinking: ThinkingParams | None = None
    # beam search (HF semantics): width = beam_width, or best_of / n with use_beam_search
    use_beam_search: bool = False
    beam_width: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True / False / "never", as in HF
    max_batch_size: int | None = None  # cap on the running batch while this request runs (MindIE batch_size)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._split_bad_words()
        self._validate()

    def _split_bad_words(self) -> None:
        """`bad_words` may mix strings and token-id lists (SPEC §1): the lists join bad_words_ids."""
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        if not self.bad_words:
            return
        ids = [w for w in self.bad_words if isinstance(w, (list, tuple))]
        if ids:
            self.bad_words = [w for w in self.bad_words if not isinstance(w, (list, tuple))] or None
            self.bad_words_ids = [*(self.bad_words_ids or []), *(list(w) for w in ids)]

    def _validate(self) -> None:
        self._validate_lengths()
        self._validate_sampling()
        self._validate_controls()
        self._validate_logprobs()
        self._validate_outputs()
        self._validate_beam()
        self._validate_sequences()

    def _validate_lengths(self) -> None:
        _check(isinstance(self.n, int) and 1 <= self.n <= 128, "n", "must be an integer in [1, 128]")
        if self.max_tokens is not None:
            _check(
                isinstance(self.max_tokens, int) and self.max_tokens >= 1,
                "max_tokens",
                "must be an integer >= 1",
            )
        _check(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0,
            "min_tokens",
            "must be an integer >= 0",
        )
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens", "must not exceed max_tokens")

    def _validate_sampling(self) -> None:
        _check(self.temperature >= 0 and math.isfinite(self.temperature), "temperature", "must be a finite number >= 0")
        _check(
            isinstance(self.top_k, int) and (self.top_k in (-1, 0) or 0 < self.top_k < 2**31),
            "top_k",
            "must be -1, 0 or in (0, 2^31)",
        )
        _check(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        if self.seed is not None:
            _check(
                isinstance(self.seed, int) and 0 <= self.seed <= _UINT64_MAX,
                "seed",
                "must be an unsigned 64-bit integer",
            )
        for s in self.stop:
            _check(isinstance(s, str) and len(s) > 0, "stop", "stop strings must be non-empty")
        _check(sum(len(s) for s in self.stop) <= 32768, "stop", "total length must be <= 32768")
        for t in self.stop_token_ids:
            _check(isinstance(t, int) and t >= 0, "stop_token_ids", "must be non-negative ints")

    def _validate_logprobs(self) -> None:
        if self.logprobs is not None:
            _check(
                isinstance(self.logprobs, int) and -1 <= self.logprobs <= 20,
                "logprobs",
                "must be an integer in [0, 20], or -1 for the whole vocabulary",
            )
        if self.logprob_token_ids is not None:
            ids = self.logprob_token_ids
            _check(isinstance(ids, list) and len(ids) > 0, "logprob_token_ids", "must not be an empty list")
            _check(
                len(ids) <= 128 and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids),
                "logprob_token_ids",
                "must be at most 128 token ids",
            )
            _check(self.logprobs is not None, "logprob_token_ids", "logprobs must be set when using `logprob_token_ids`")
        if self.prompt_logprobs is not None:
            _check(
                isinstance(self.prompt_logprobs, int) and -1 <= self.prompt_logprobs <= 20,
                "prompt_logprobs",
                "must be an integer in [0, 20], or -1 for the whole vocabulary",
            )

    def _validate_outputs(self) -> None:
        _check(self.pooling in (None, "last", "mean"), "pooling", 'must be "last" or "mean"')
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        _check(
            self.structured_outputs is None or not (self.is_beam_search or self.pooling),
            "structured_outputs",
            "not available with beam search or embeddings",
        )
        _check(self.pooling is None or self.num_sequences == 1, "pooling", "one sequence per embedding (n = 1)")

    def _validate_sequences(self) -> None:
        """n, best_of and max_batch_size: how many sequences a request runs, side by side."""
        _check(
            self.n == 1 or self.temperature > 0 or self.use_beam_search or self.beam_width > 1,
            "n",
            "sampling with n > 1 needs temperature > 0",
        )
        if self.max_batch_size is not None:
            _check(
                isinstance(self.max_batch_size, int) and not isinstance(self.max_batch_size, bool) and self.max_batch_size >= 1,
                "max_batch_size",
                "must be an integer >= 1",
            )
            _check(
                not self.is_beam_search or self.max_batch_size >= self.num_beams,
                "max_batch_size",
                f"must be at least the beam width ({self.num_beams}): the beams run side by side",
            )
        if self.best_of is not None:
            _check(
                isinstance(self.best_of, int) and self.n <= self.best_of <= 128,
                "best_of",
                "must be an integer in [n, 128]",
            )
            _check(
                self.best_of == 1 or self.temperature > 0 or self.use_beam_search,
                "best_of",
                "best_of > 1 needs temperature > 0",
            )

    def _validate_controls(self) -> None:
        _check(0 < self.repetition_penalty < math.inf, "repetition_penalty", "must be > 0")
        for name in ("presence_penalty", "frequency_penalty"):
            _check(-2 <= getattr(self, name) <= 2, name, "must be in [-2, 2]")
        _check(0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        _check(0 < self.typical_p <= 1, "typical_p", "must be in (0, 1]")
        _check(
            isinstance(self.no_repeat_ngram_size, int) and self.no_repeat_ngram_size >= 0,
            "no_repeat_ngram_size",
            "must be an integer >= 0",
        )
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError, AttributeError) as e:
                raise ParamError("logit_bias: must map token ids to numbers", "logit_bias") from e
            _check(all(t >= 0 for t in self.logit_bias), "logit_bias", "token ids must be >= 0")
            _check(all(-100 <= b <= 100 for b in self.logit_bias.values()), "logit_bias", "biases must be in [-100, 100]")
        if self.allowed_token_ids is not None:
            _check(
                isinstance(self.allowed_token_ids, list)
                and len(self.allowed_token_ids) > 0
                and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.allowed_token_ids),
                "allowed_token_ids",
                "must be a non-empty list of token ids",
            )
        if self.embedding_bias is not None:
            bias: Any = self.embedding_bias
            if hasattr(bias, "tolist"):  # a tensor / array, e.g. TensorRT-LLM's [1, vocab]
                bias = bias.tolist()
            if isinstance(bias, list) and len(bias) == 1 and isinstance(bias[0], list):
                bias = bias[0]  # [1, vocab]
            try:
                self.embedding_bias = [float(v) for v in bias]
            except (TypeError, ValueError) as e:
                raise ParamError("embedding_bias: must be a list of numbers, one per vocabulary entry", "embedding_bias") from e
            _check(all(abs(v) <= 1e30 for v in self.embedding_bias), "embedding_bias", "values must be in [-1e30, 1e30]")
        for seq in self.stop_token_sequences or []:
            _check(
                isinstance(seq, list) and seq and all(isinstance(t, int) and t >= 0 for t in seq),
                "stop_words",
                "token-id stop sequences must be non-empty lists of token ids",
            )
        for word in self.bad_words or []:
            _check(isinstance(word, str) and word != "", "bad_words", "must be non-empty strings or token-id lists")
        for seq in self.bad_words_ids or []:
            _check(
                isinstance(seq, list) and seq and all(isinstance(t, int) and t >= 0 for t in seq),
                "bad_words",
                "token sequences must be non-empty lists of token ids",
            )

    def _validate_beam(self) -> None:
        _check(isinstance(self.beam_width, int) and 1 <= self.beam_width <= 128, "beam_width", "must be in [1, 128]")
        _check(self.early_stopping in (True, False, "never"), "early_stopping", 'must be true, false or "never"')
        # beam scores divide by length ** length_penalty: |10| keeps that finite for any length < 10^30
        _check(-10 <= self.length_penalty <= 10, "length_penalty", "must be in [-10, 10]")
        if not self.is_beam_search:
            return
        _check(self.n <= self.num_beams, "n", "must not exceed the beam width")
        # temperature > 0: HF's beam sampling (engine/beam.py); top_k applies there too. Penalties,
        # bans, biases and min_tokens act per beam on its log-probs and stop words end hypotheses
        # (HF's processors and stopping criteria); top_k / top_p / min_p / typical_p warp beam sampling
        unsupported = {"watermark": self.watermark, "logprob_token_ids": self.logprob_token_ids is not None}
        for name, used in unsupported.items():
            _check(not used, name, "is not supported with beam search yet")

    @property
    def is_beam_search(self) -> bool:
        return self.beam_width > 1 or (self.use_beam_search and max(self.n, self.best_of or 1) > 1)

    @property
    def num_beams(self) -> int:
        return self.beam_width if self.beam_width > 1 else max(self.n, self.best_of or 1)

    @property
    def needs_prompt_logits(self) -> bool:
        """Logits at prompt positions are needed, so the prompt can't come from the prefix cache."""
        return self.prompt_logprobs is not None or self.return_context_logits

    def uses_processors(self, bad_words_ids: list[list[int]]) -> bool:
        """Whether a logits processor (sample/processors.py) acts on this request's rows."""
        return bool(
            self.allowed_token_ids or self.logit_bias or self.embedding_bias is not None or self.repetition_penalty != 1.0
            or self.presence_penalty or self.frequency_penalty or self.no_repeat_ngram_size > 0 or bad_words_ids
            or self.min_tokens > 0 or self.watermark
        )  # fmt: skip

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy with nothing else read of a row (no logprobs beyond the chosen token's, no
        logits outputs): with no processor, grammar or beam either, its token is the argmax alone."""
        return (
            self.temperature == 0 and self.logprobs is None and self.logprob_token_ids is None
            and not self.return_generation_logits and self.thinking is None
        )  # fmt: skip

    @property
    def needs_whole_prompt(self) -> bool:
        """Every prompt position must run (logits or mean pooling): no prefix-cache hits."""
        return self.needs_prompt_logits or self.pooling == "mean"

    @property
    def num_sequences(self) -> int:
        """Independent sampled sequences (1 for beam search, which runs as a BeamGroup)."""
        return 1 if self.is_beam_search else max(self.n, self.best_of or 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def clone(self) -> SamplingParams:
        import copy

        return copy.deepcopy(self)


def embedding_params(pooling: str = "last") -> SamplingParams:
    """An embedding request: the prompt runs once; its pooled hidden state is the result."""
    return SamplingParams(max_tokens=1, temperature=0.0, pooling=pooling, ignore_eos=True)
