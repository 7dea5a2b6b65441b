"""Input processing: a prompt and its parameters -> a validated `Request` (tokenize, check every
field against the model, compile the grammar). Pure with respect to engine state: any thread may
call it (the server does, before a request enters the engine loop)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from typing import Any, TypedDict

from typing_extensions import Unpack

from inflight.config import EngineConfig
from inflight.engine.prompt_checks import check_drafts, check_prompt_ids, prompt_table
from inflight.engine.tokenizer import PromptInput, encode_prompt, encode_text, max_chars_per_token
from inflight.multimodal import inputs as mm
from inflight.multimodal.qwen2_vl_processor import (
    ProcessedVision,
    VisionProcessorConfig,
    process_image,
    process_video,
)
from inflight.request import Request
from inflight.request_inputs import RequestInputs
from inflight.sampling_params import ParamError, SamplingParams
from inflight.structured.backend import GrammarBackend, GrammarRef
from inflight.worker import logits_capture

# prompt-dict keys that select a LoRA adapter (lora/registry.py): by name, or TensorRT-LLM's task
# id alone (cached) or with its weights and config
LORA_FIELDS = ("lora_name", "lora_task_id", "lora_weights", "lora_config")


class RequestOptions(TypedDict, total=False):
    """make_request's keywords besides the prompt and its SamplingParams (declared once: the engine
    and its clients pass them on as they are)."""

    request_id: str | None  # default: a fresh id ("req-N"; the AsyncEngine: a uuid)
    priority: int  # 1 (highest) .. 5; default 5
    timeout: float | None  # seconds, (0, 3600]; default: the engine's default_timeout_s
    arrival_time: float | None  # time.perf_counter() seconds; default: now
    lora_name: str | None  # run with this adapter (also the prompt dict's lora_* fields)
    cache_salt: str | None  # vLLM: prefix-cache hits only between requests of the same salt (also the prompt dict's)
    # CompletionOutput.cumulative_logprob without logprobs asked (default True, as the Python API
    # documents); False: None there, and no log-softmax for this row (the servers, which show it
    # only with logprobs). Logprobs, best_of and beams compute it anyway.
    cumulative_logprob: bool
    final_only: bool  # one RequestOutput, when it finishes (default False: one per step it changes)


class InputProcessor:
    def __init__(self, config: EngineConfig, tokenizer: Any | None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self._ids = itertools.count()
        self._grammar_backend: GrammarBackend | None = None
        self.loras: Any = None  # lora.registry.LoRARegistry when LoRA is enabled (set by the engine)
        self.num_kv_blocks: int | None = None  # set by the engine once the pool is sized
        self._max_prompt_chars: int | None = None
        # vision-language models: how prompts name images, and how to preprocess them
        self.vision_spec = mm.VisionSpec.from_hf(config.model.hf_config)
        self.vision_processor = VisionProcessorConfig.from_dir(config.model.path) if self.vision_spec else None

    @property
    def max_model_len(self) -> int:
        return self.config.model.max_model_len

    @property
    def max_prompt_tokens(self) -> int:
        return min(self.max_model_len - 1, self.config.max_input_tokens or self.max_model_len)

    @property
    def max_prompt_chars(self) -> int:
        """Text longer than this can't fit `max_prompt_tokens` whatever it says: it is refused before
        tokenizing (a 1.6 MB prompt takes seconds to tokenize only to be refused)."""
        if self._max_prompt_chars is None:
            per_token = max_chars_per_token(self.tokenizer) if self.tokenizer is not None else 1
            self._max_prompt_chars = self.max_prompt_tokens * per_token
        return self._max_prompt_chars

    # ------------------------------------------------------------ structured output
    @property
    def grammar_backend(self) -> GrammarBackend:
        """xgrammar over this tokenizer (built on first use: chat-only deployments never pay)."""
        if self._grammar_backend is None:
            if self.tokenizer is None:
                raise ParamError("structured_outputs: this model has no tokenizer", "structured_outputs")
            self._grammar_backend = GrammarBackend(
                self.tokenizer, self.config.model.vocab_size, list(self.config.model.eos_token_ids)
            )
        return self._grammar_backend

    def compile_grammar(self, request: Request) -> None:
        """Compile (or fetch from cache) the request's grammar; thread-safe, ParamError if invalid.
        The last part of building its inputs (kept apart: the server compiles off the input threads)."""
        spec = request.params.structured_outputs
        if spec is not None and request.grammar is None:
            backend = self.grammar_backend
            ref = GrammarRef(backend.compile(spec), backend.banned_ids)  # type: ignore[arg-type]
            request.inputs = dataclasses.replace(request.inputs, grammar=ref)

    # ------------------------------------------------------------ requests
    def make_request(
        self, prompt: PromptInput, params: SamplingParams | None = None, **options: Unpack[RequestOptions]
    ) -> Request:
        """Tokenize and validate; pure (touches no engine state), so any thread may call it."""
        params = params or SamplingParams()
        lora = self._lora_fields(prompt, options.get("lora_name"))
        self._check_schedulable(params)
        text, ids = encode_prompt(self.tokenizer, prompt, self.max_prompt_chars)
        media = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        vision: dict[str, Any] = {}
        if media:
            ids, items, positions = self._multimodal(ids, media)
            if items:
                vision = {"mm_items": tuple(items), "mrope_positions": positions[0], "mrope_delta": positions[1]}
        hidden = int(self.config.model.hf_config["hidden_size"])
        table = prompt_table(prompt, hidden)
        check_prompt_ids(ids, table, self.config.model.vocab_size, hidden)
        limit = self.max_prompt_tokens
        if len(ids) > limit:
            raise ParamError(f"prompt: {len(ids)} tokens; at most {limit} are accepted", "prompt")
        priority = options.get("priority", 5)
        if not (isinstance(priority, int) and 1 <= priority <= 5):
            raise ParamError("priority: must be an integer in [1, 5]", "priority")
        timeout = options.get("timeout")
        timeout = self.config.default_timeout_s if timeout is None else timeout
        if not (0 < timeout <= 3600 or timeout == math.inf):  # inf: no deadline (offline LLM.generate)
            raise ParamError("timeout: must be in (0, 3600] seconds", "timeout")
        self._check_token_ids(params)
        room = min(self.max_model_len - len(ids), self.config.max_iter_times or self.max_model_len)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        self._check_logits_size(params, len(ids), max_tokens)
        self._check_beam_blocks(params, len(ids), max_tokens)
        drafts: tuple[Any, ...] = ((), None)
        if isinstance(prompt, dict) and prompt.get("draft_input_ids") is not None:
            ids_, logits = check_drafts(prompt, params, max_tokens, self.config.model.vocab_size)
            drafts = (tuple(ids_), logits)
        arrival = options.get("arrival_time")
        inputs = RequestInputs(
            ids,
            params,
            prompt=text,
            priority=priority,
            timeout_s=timeout,
            max_tokens=max_tokens,
            eos_token_ids=self.config.model.eos_token_ids,
            bad_words_ids=[*(params.bad_words_ids or []), *self._tokenize_bad_words(params)],
            cache_salt=_salt(_client_salt(prompt, options.get("cache_salt")), table),
            prompt_embedding_table=None if table is None else table.detach().to("cpu", self.config.model.dtype),
            lora=self.loras.select(lora) if lora else None,
            draft_token_ids=drafts[0],
            draft_logits=drafts[1],
            chosen_logprobs=options.get("cumulative_logprob", True) or _reads_logprobs(params),
            final_only=options.get("final_only", False),
            **vision,
            **({} if arrival is None else {"arrival_time": arrival}),
        )  # the runner moves the table to its device
        request_id = options.get("request_id")
        return Request.from_inputs(request_id if request_id is not None else f"req-{next(self._ids)}", inputs)

    def _lora_fields(self, prompt: PromptInput, lora_name: str | None) -> dict[str, Any]:
        """The adapter fields of a request: the prompt dict's lora_* keys, or an adapter name."""
        fields = {k: prompt[k] for k in LORA_FIELDS if isinstance(prompt, dict) and prompt.get(k) is not None}
        if lora_name is not None:
            fields["lora_name"] = lora_name
        if fields and self.loras is None:
            name = next(iter(fields))
            raise ParamError(f"{name}: LoRA adapters are not enabled on this engine (enable_lora / --enable-lora)", name)
        return fields

    def _check_schedulable(self, params: SamplingParams) -> None:
        """A request's sequences run side by side (a beam search's must): more of them than the
        running batch holds would never all be scheduled, and would hold every slot meanwhile."""
        limit = self.config.scheduler.max_num_seqs
        width = params.num_beams if params.is_beam_search else params.num_sequences
        if width > limit:
            field = width_field(params)
            raise ParamError(
                f"{field}: {width} sequences; this server runs at most {limit} at once (--max-num-seqs)",
                field,
            )

    def _check_beam_blocks(self, params: SamplingParams, prompt_len: int, max_tokens: int) -> None:
        """Every beam of a search must hold its KV at once: the shared prompt blocks plus, per beam,
        its generated tokens and a copy of the partial prompt block."""
        if not params.is_beam_search or self.num_kv_blocks is None:
            return
        bs = self.config.cache.block_size
        need = -(-prompt_len // bs) + params.num_beams * (-(-max_tokens // bs) + 1)
        if need > self.num_kv_blocks:
            field = width_field(params)
            raise ParamError(
                f"{field}: {params.num_beams} beams of {max_tokens} tokens need {need} KV blocks; the pool has "
                f"{self.num_kv_blocks} (lower the width or max_tokens)", field,
            )  # fmt: skip

    # ------------------------------------------------------------ images and video
    def process_media(self, modality: str, value: Any) -> ProcessedVision:
        """A PIL image, or video frames (a list sampled at the processor's video_fps, or (frames, fps))
        -> encoder input.
        NumPy and Pillow only: the server runs it in a worker thread."""
        cfg = self.vision_processor
        if cfg is None:
            field = f"{modality}_url"
            raise ParamError(f"{field}: this model takes no {modality}s (it is not a vision-language model)", field)
        if isinstance(value, ProcessedVision):
            return value
        if modality == "image":
            return process_image(value, cfg)
        if isinstance(value, tuple):  # (frames, the rate they were sampled at)
            return process_video(list(value[0]), float(value[1]), cfg)
        return process_video(list(value), cfg.video_fps, cfg)

    def _multimodal(self, ids: list[int], media: dict[str, Any]) -> tuple[list[int], list[Any], Any]:
        """Expand the prompt's placeholders for its images / videos; their M-RoPE positions."""
        unknown = set(media) - {"image", "video"}
        if unknown:
            name = sorted(unknown)[0]
            if name == "audio":
                raise ParamError("audio_url: this model takes no audio", "audio_url")
            raise ParamError(f"multi_modal_data: unknown modality {name!r}; use image or video", "multi_modal_data")
        given = {m: (v if isinstance(v, list) else [v]) for m in ("image", "video") if (v := media.get(m))}
        total = sum(len(v) for v in given.values())
        if total > mm.MAX_MEDIA_ITEMS:
            raise ParamError(f"messages: {total} media items; at most {mm.MAX_MEDIA_ITEMS} per request", "messages")
        processed = {m: [self.process_media(m, v) for v in vs] for m, vs in given.items()}  # text model: 400
        spec = self.vision_spec
        if spec is None:  # a text model given no media at all
            return ids, [], None
        ids, items = mm.expand_placeholders(ids, processed, spec)
        positions = mm.mrope_positions(len(ids), items, spec)
        return ids, items, positions

    def _check_logits_size(self, params: SamplingParams, prompt_len: int, max_tokens: int) -> None:
        vocab = self.config.model.vocab_size
        for field, rows in (("return_context_logits", prompt_len), ("return_generation_logits", max_tokens)):
            limit = logits_capture.MAX_LOGITS_ELEMENTS
            if getattr(params, field) and rows * vocab > limit:
                raise ParamError(f"{field}: {rows} x {vocab} logits exceed the {limit} element limit", field)

    def _check_token_ids(self, params: SamplingParams) -> None:
        vocab = self.config.model.vocab_size
        # stop_token_ids >= vocab are never produced, so they are ignored (as MindIE documents)
        fields = {
            "logit_bias": list(params.logit_bias or {}),
            "allowed_token_ids": params.allowed_token_ids or [],
            "bad_words": [t for seq in params.bad_words_ids or [] for t in seq],
            "logprob_token_ids": params.logprob_token_ids or [],
        }
        fields["stop_words"] = [t for seq in params.stop_token_sequences or [] for t in seq]
        fields["end_id"] = [] if params.end_id is None else [params.end_id]
        fields["pad_id"] = [] if params.pad_id is None else [params.pad_id]
        for name, ids in fields.items():
            if any(t >= vocab for t in ids):
                raise ParamError(f"{name}: token ids must be < vocab size {vocab}", name)
        if params.embedding_bias is not None and len(params.embedding_bias) != vocab:
            raise ParamError(f"embedding_bias: needs {vocab} values, one per token id", "embedding_bias")

    def _tokenize_bad_words(self, params: SamplingParams) -> list[list[int]]:
        """Each bad word as it tokenizes at the start of the text and after a space (as vLLM)."""
        if not params.bad_words:
            return []
        if self.tokenizer is None:
            raise ParamError("bad_words: this model has no tokenizer; send token-id sequences", "bad_words")
        seqs = []
        for word in params.bad_words:
            for variant in (word, " " + word.lstrip(" ")):
                ids = encode_text(self.tokenizer, variant, "bad_words")
                if ids and ids not in seqs:
                    seqs.append(ids)
        return seqs


def _client_salt(prompt: PromptInput, option: str | None) -> str | None:
    """The client's cache_salt: the keyword, else the prompt dict's (vLLM's prompt dicts carry one)."""
    salt = option if option is not None else prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and not (isinstance(salt, str) and salt):
        raise ParamError("cache_salt: must be a non-empty string", "cache_salt")
    return salt


def _salt(cache_salt: str | None, table: Any) -> bytes:
    """The prefix-cache salt of a request: the client's cache_salt and its p-tuning table's digest
    (both shape what the KV of its tokens means)."""
    salt = b""
    if cache_salt is not None:
        salt = hashlib.blake2b(cache_salt.encode(), digest_size=16).digest()
    if table is not None:
        salt += hashlib.blake2b(table.float().numpy().tobytes(), digest_size=16).digest()
    return salt


def width_field(params: SamplingParams) -> str:
    """The field that set how many sequences a request runs."""
    return "beam_width" if params.beam_width > 1 else "best_of" if (params.best_of or 0) > params.n else "n"


def _reads_logprobs(params: SamplingParams) -> bool:
    """Whether the engine reads a request's chosen-token logprobs whatever the client asked:
    logprob entries, best_of's ranking by cumulative logprob, a beam search's scores."""
    return (
        params.logprobs is not None or params.logprob_token_ids is not None
        or params.num_sequences > params.n or params.is_beam_search
    )  # fmt: skip
