"""Contracts between the engine layers and what the user receives.

Scheduler -> ModelRunner: `SchedulerOutput`.
ModelRunner -> Scheduler: `ModelRunnerOutput`.
Engine -> caller: `RequestOutput` (shaped like vLLM's, so callers can switch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from inflight.request_inputs import RequestInputs


# ---------------------------------------------------------------- internal contracts
@dataclass
class NewRequestData:
    """Everything the runner keeps about a request, sent the first time it is scheduled.

    The runner holds it (worker/input_batch.py) until the request's id comes back in
    `SchedulerOutput.freed_ids`; later steps send only what changed (`ScheduledRequest`).
    Preemption does not drop it: a resumed request's tokens, generator and matcher carry on.
    """

    request_id: str
    inputs: RequestInputs  # what the client asked for (shared by a request's sequences)
    output_token_ids: list[int] = field(default_factory=list)  # generated before it was first sent (a beam's)
    seq_index: int = 0  # n / best_of: which sibling (seeded sampling: seed + index)
    is_beam: bool = False  # a beam search member: the runner returns its log-softmax row

    @property
    def token_ids(self) -> list[int]:
        """Prompt + tokens generated so far."""
        return [*self.inputs.prompt_token_ids, *self.output_token_ids]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.inputs.prompt_token_ids)


@dataclass(slots=True)  # one per running request per step: 256 a step at 256 requests
class ScheduledRequest:
    """One request's piece of a step: tokens [num_computed, num_computed + num_tokens).
    core/pieces.py `make_piece` passes every field by position (keywords cost twice the time):
    a field goes last, or there too."""

    request_id: str
    num_computed_tokens: int  # tokens whose KV is already in the cache
    num_tokens: int  # tokens to run this step (1 for a decode, a chunk for prefill)
    samples: bool  # True when this piece reaches the end of the known tokens
    num_draft_tokens: int = 0  # draft tokens appended after the piece, verified this step
    draft_token_ids: list[int] = field(default_factory=list)  # those tokens
    draft_logits: Any = None  # (K, vocab) float32 CPU tensor: the draft model's logits, when given
    # tokens appended since the runner last saw the request, from position new_tokens_from on;
    # the sampling rank already holds the tokens it sampled, so they overwrite equal values there
    new_token_ids: list[int] = field(default_factory=list)
    new_tokens_from: int = 0
    # the block table's change since the runner last saw it: these blocks from index new_blocks_from
    # on, after which the table holds new_blocks_from + len(new_block_ids) blocks (0 after preemption:
    # the whole new table); the runner keeps the table (worker/input_batch.py)
    new_block_ids: list[int] = field(default_factory=list)
    new_blocks_from: int = 0
    lora_slot: int = -1  # the LoRA slot its rows use this step (-1: the base model)
    # speculative decoding with a draft model: propose this many drafts after the step (the
    # block table covers them: the draft model writes their KV now, the target next step)
    num_lookahead: int = 0
    serial: int = (
        0  # which request under this id (Request.serial): the engine's, the runner ignores it
    )

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        """Pickled as its fields in order (the mp executor sends 256 a step at 256 requests): the
        slots dataclass's own __getstate__ / __setstate__ walk `fields()` per object, 3x the time."""
        return ScheduledRequest, _piece_fields(self)


_piece_fields = attrgetter(*ScheduledRequest.__slots__)  # every field, in order


@dataclass
class SchedulerOutput:
    """What the model runs this step, self-contained: the runner needs nothing else (it pickles).

    `scheduled` is ordered as the flat batch is laid out; requests the runner has not seen
    come with a `NewRequestData` in `new_requests`."""

    scheduled: list[ScheduledRequest]
    num_batched_tokens: int
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # timed out / aborted this step
    new_requests: list[NewRequestData] = field(default_factory=list)
    # every request finished since the previous SchedulerOutput: the runner drops their state
    freed_ids: list[str] = field(default_factory=list)
    # (src, dst) KV blocks to copy before the forward (a beam fork's partial block)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    # (slot, lora.adapter.LoRAAdapter) to copy into the runner's LoRA slots before the forward
    lora_loads: list[tuple[int, Any]] = field(default_factory=list)
    # decode passes (every piece a plain greedy decode; docs/MULTISTEP.md): pass i + 1 runs the
    # token pass i sampled, so each piece samples up to num_steps tokens, its KV slots reserved
    num_steps: int = 1

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def has_work(self) -> bool:
        """Anything for the runner: pieces to run or state to update."""
        return bool(self.scheduled or self.freed_ids or self.blocks_to_copy or self.lora_loads)


@dataclass
class SampledToken:  # made by position (one a sample row: keywords cost twice the time)
    token_id: int
    logprob: float  # log-softmax of the raw logits at the chosen token
    # (token_id, logprob) of the top-N, best first, when logprobs were asked
    top: list[tuple[int, float]] | None = None
    rank: int | None = None  # 1-based rank of the chosen token among all tokens
    asked: list[tuple[int, float]] | None = None  # logprob_token_ids: (id, logprob) of each (no rank)


@dataclass
class ModelRunnerOutput:
    """Everything the runner made this step, by request id."""

    # a token per piece with samples=True; K + 1 for a piece that verified K draft tokens; up to
    # SchedulerOutput.num_steps for a multi-step decode
    sampled: dict[str, list[SampledToken]] = field(default_factory=dict)
    # beam search members: log_softmax over the vocabulary (the beam group picks the tokens)
    beam_logprobs: dict[str, Any] = field(default_factory=dict)
    # logits outputs (worker/logits_capture.py): what this step added
    prompt_logprobs: dict[str, list[SampledToken]] = field(default_factory=dict)
    context_logits: dict[str, Any] = field(default_factory=dict)  # (n, vocab) float32 CPU tensor
    generation_logits: dict[str, list[Any]] = field(default_factory=dict)  # (vocab,) rows
    embeddings: dict[str, Any] = field(default_factory=dict)  # decoder embeddings, when complete
    grammar_terminated: set[str] = field(default_factory=set)  # grammar complete after the token
    # requests whose own work raised this step (id -> "Type: message"): the engine fails them alone
    failed: dict[str, str] = field(default_factory=dict)
    # the draft model's proposals after this step's tokens (pieces with num_lookahead > 0)
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)

    # the fields keyed by request id (grammar_terminated is a set of them)
    BY_REQUEST = ("sampled", "beam_logprobs", "prompt_logprobs", "context_logits", "generation_logits", "embeddings", "failed", "draft_token_ids")

    def drop(self, request_ids: set[str]) -> None:
        """Forget what the step made for these requests (gone, or their id reused, since it ran)."""
        for name in self.BY_REQUEST:
            for rid in request_ids:
                getattr(self, name).pop(rid, None)
        self.grammar_terminated -= request_ids

    def merge(self, other: ModelRunnerOutput) -> None:
        """Add another output's requests (a failed step's pieces re-run one by one)."""
        for name in self.BY_REQUEST:
            getattr(self, name).update(getattr(other, name))
        self.grammar_terminated |= other.grammar_terminated


# ---------------------------------------------------------------- user-facing
class Logprob(NamedTuple):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class RequestMetrics:
    """Per-request performance figures (times are `time.perf_counter()` seconds)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    schedule_times: list[float] = field(
        default_factory=list
    )  # start of each step that ran the request
    batch_sizes: list[int] = field(default_factory=list)  # requests in the step of each token
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_draft_tokens: int = 0  # draft tokens verified (a client's or the engine's own, spec_decode/)
    num_accepted_draft_tokens: int = 0
    num_drafts: int = 0  # steps that verified drafts (mean accepted length = 1 + accepted / num_drafts)
    num_computed_tokens: int = 0  # positions whose KV it had when it finished (cache hits included)
    # tokens the model ran for it: prompt and generated, recomputed after preemption, drafts; not
    # prefix-cache hits or blocks shared from a sibling / beam. A group's output (n / best_of,
    # beam search) sums every sequence's and beam's, retired beams included.
    num_tokens_run: int = 0

    @property
    def queue_wait_us(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return (self.first_scheduled_time - self.arrival_time) * 1e6

    @property
    def time_to_first_token_ms(self) -> float | None:
        if self.first_token_time is None:
            return None
        return (self.first_token_time - self.arrival_time) * 1e3

    @property
    def queue_wait_times_us(self) -> list[float]:
        """Per generated token: how long it waited to be scheduled (the first: since arrival)."""
        if self.first_scheduled_time is None:
            return []
        waits = [self.queue_wait_us or 0.0]
        for prev in self.token_times[:-1]:
            nxt = next((t for t in self.schedule_times if t >= prev), prev)
            waits.append(max(0.0, (nxt - prev) * 1e6))
        return waits

    @property
    def decode_times_ms(self) -> list[float]:
        """Time between consecutive generated tokens, one per token after the first."""
        t = self.token_times
        return [(b - a) * 1e3 for a, b in zip(t, t[1:])]


class Prefix(NamedTuple):
    """The first `length` items of a sequence's own list that only ever grows (its output tokens,
    `Request.append_token`; its logprob entries): a snapshot without a copy, so an output per step
    costs O(new tokens), not O(all tokens) -- O(n^2) a request (32 rows of 8k tokens: 0.8 ms a step)."""

    items: list[Any]
    length: int


class _Snapshot:
    """A `CompletionOutput` field that holds a list, or a `Prefix` made into one when first read.
    (A data descriptor with no class-level value: the dataclass field keeps no default.)"""

    def __set_name__(self, owner: Any, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            raise AttributeError(self.name)
        value = obj.__dict__[self.name]
        if isinstance(value, Prefix):
            value = obj.__dict__[self.name] = value.items[: value.length]
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = value


class TextSoFar:
    """A request's output text while it grows: the pieces appended, joined when read (`str`,
    which keeps the join). `text += delta` on a str that an earlier output still holds copies
    it whole every token, O(n^2) a stream; a step here appends one piece and its delta reads the
    last ones (`between`)."""

    __slots__ = ("_pieces", "length")

    def __init__(self, text: str = "") -> None:
        self._pieces = [text] if text else []
        self.length = len(text)

    def append(self, piece: str) -> None:
        if piece:
            self._pieces.append(piece)
            self.length += len(piece)

    def __str__(self) -> str:
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def between(self, start: int, end: int) -> str:
        """str(self)[start:end], joining only the pieces that hold it (the newest, for a delta)."""
        if start >= end:
            return ""
        pieces, i, at = self._pieces, len(self._pieces), self.length  # at: where pieces[i] starts
        while i > 0 and at > start:
            i -= 1
            at -= len(pieces[i])
        held = pieces[i] if i == len(pieces) - 1 else "".join(pieces[i:])
        return held[start - at : end - at]


class TextPrefix(NamedTuple):
    """The first `length` characters of a `TextSoFar`: an output's text without a copy, made a
    str when first read (as `Prefix` for the lists)."""

    text: TextSoFar
    length: int


class _Text:
    """`CompletionOutput.text`: a str, or a `TextPrefix` made into one when first read."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            raise AttributeError("text")
        value = obj.__dict__["text"]
        if isinstance(value, TextPrefix):
            whole = str(value.text)
            value = obj.__dict__["text"] = whole if len(whole) == value.length else whole[: value.length]
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["text"] = value


@dataclass
class CompletionOutput:  # made by position (engine/output_processor.py make_output): new fields go last
    index: int
    text: str = _Text()  # type: ignore[assignment]  # (a TextPrefix is taken too)
    token_ids: list[int] = _Snapshot()  # type: ignore[assignment]  # (a Prefix is taken too)
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None = _Snapshot()  # type: ignore[assignment]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "timeout"
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    # streaming: what is new since the previous RequestOutput of this request
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[dict[int, Logprob]] | None = None
    generation_logits: Any = (
        None  # (generated, vocab) float32 tensor, final output only, when asked
    )

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:  # made by position (engine/output_processor.py make_output): new fields go last
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    error: str | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # first entry None, as vLLM
    context_logits: Any = None  # (prompt_len, vocab) float32 tensor, final output only, when asked
    embedding: Any = None  # (hidden,) float32 L2-normalized tensor, when params.pooling is set
    # which request under this id made it (Request.serial; -1: unknown): async scheduling can end an
    # aborted request a step after its id was freed and taken again (engine/streams.py)
    serial: int = field(default=-1, repr=False, compare=False)


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """LLM.embed's result (vLLM's shape): `.outputs.embedding` is the L2-normalized vector."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True
