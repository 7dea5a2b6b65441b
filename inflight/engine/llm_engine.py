"""LLMEngine: the synchronous engine. It builds the model's executor, the KV pool and the
scheduler, and composes the core and its front:

  StepLoop       (engine/step_loop.py)       schedule -> execute -> update, async scheduling
  Sequences      (engine/sequences.py)       siblings, beams, a step's outputs per user request
  OutputProcessor (engine/output_processor.py) detokenizing, stop strings, logprob entries
  InputProcessor (engine/input_processor.py) tokenize + validate -> RequestInputs (any thread)
  EngineAdapters (engine/adapters.py)        LoRA adapters: host registry, stats
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from typing_extensions import Unpack

from inflight.config import EngineConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.scheduler import Scheduler
from inflight.engine.adapters import EngineAdapters, LoRAStats
from inflight.engine.args import EngineArgs
from inflight.engine.input_processor import InputProcessor, RequestOptions
from inflight.engine.output_processor import OutputProcessor
from inflight.engine.sequences import Sequences
from inflight.engine.step_loop import StepLoop
from inflight.engine.tokenizer import PromptInput, load_tokenizer
from inflight.outputs import RequestOutput
from inflight.request import FinishReason, Request
from inflight.sampling_params import ParamError, SamplingParams
from inflight.spec_decode.proposer import Speculator
from inflight.structured.backend import GrammarBackend
from inflight.worker.executor import make_executor

logger = logging.getLogger(__name__)


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of blocks in use (cached-free blocks count as free)
    prefix_cache_hit_rate: float
    num_preemptions: int
    lora: LoRAStats | None = None  # None: LoRA is off
    worker_busy_s: float | None = None  # the model worker process's step and idle seconds (None: `uni`)
    worker_idle_s: float | None = None


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer: Any | None = None, progress: bool = True) -> None:
        # load first, then size the KV pool from the memory the weights left (on a GPU, "85 % of
        # free memory" measured before loading would count the weights' bytes twice)
        self.executor = make_executor(config, config.distributed_executor_backend, progress)
        self.runner = self.executor.runner  # None with "mp": the model lives in the worker process
        num_blocks = self.executor.num_kv_blocks()
        self.config = self._fit_pool(config, num_blocks)
        config = self.config
        self._check_budget()
        self.tokenizer = tokenizer
        self.executor.allocate_kv_cache(config, num_blocks)
        self.kv = KVCacheManager(num_blocks, config.cache.block_size, config.cache.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, self.kv)
        self.output_processor = OutputProcessor(tokenizer)
        self.requests: dict[str, Request] = {}  # every scheduled sequence (n > 1: one per sibling)
        # LoRA adapters by name / task id, host-memory LRU (engine/adapters.py); None-safe when off
        self.adapters = EngineAdapters(config, self.requests)
        self.seqs = Sequences(self.scheduler, self.output_processor, tokenizer, self.requests, self.adapters.trim)
        self.parents = self.seqs.parents  # user request id -> its siblings or beam search
        self._parent_of = self.seqs.parent_of  # sequence id -> its parent
        self.inputs = InputProcessor(config, tokenizer)
        self.inputs.loras = self.adapters.registry
        self.inputs.num_kv_blocks = num_blocks
        spec = config.speculative  # the engine proposes drafts itself before each step it schedules
        speculator = Speculator(spec, config.model.vocab_size) if spec is not None else None
        self.loop = StepLoop(config, self.executor, self.scheduler, self.seqs, speculator)

    @classmethod
    def from_engine_args(cls, args: EngineArgs, tokenizer: Any | None = None, progress: bool = True) -> LLMEngine:
        """Build the config tree from `args`, load the model; `tokenizer` defaults to the checkpoint's."""
        config = args.create_engine_config()
        return cls(config, tokenizer if tokenizer is not None else load_tokenizer(args.tokenizer or config.model.path), progress)

    @classmethod
    def from_args(cls, model: str, *, tokenizer: Any | None = None, progress: bool = True, **kwargs: Any) -> LLMEngine:
        """`from_engine_args(EngineArgs(model=model, **kwargs))`; an unknown keyword is a TypeError."""
        return cls.from_engine_args(EngineArgs.from_kwargs(model, "LLMEngine.from_args", **kwargs), tokenizer, progress)

    def _check_budget(self) -> None:
        sched = self.config.scheduler
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens: {sched.max_num_batched_tokens} < max_model_len "
                f"{self.max_model_len}; without chunked prefill a long prompt could never be scheduled"
            )

    @staticmethod
    def _fit_pool(config: EngineConfig, num_blocks: int) -> EngineConfig:
        """A lone request must always fit, or preemption could never make room for it."""
        capacity = num_blocks * config.cache.block_size
        if capacity >= config.model.max_model_len:
            return config
        logger.warning(
            "KV pool holds %d tokens < max_model_len %d: capping max_model_len",
            capacity,
            config.model.max_model_len,
        )
        return replace(config, model=replace(config.model, max_model_len=capacity))

    @property
    def max_model_len(self) -> int:
        return self.config.model.max_model_len

    # ------------------------------------------------------------ requests (engine/input_processor.py)
    @property
    def grammar_backend(self) -> GrammarBackend:
        return self.inputs.grammar_backend

    def compile_grammar(self, request: Request) -> None:
        """Compile (or fetch from cache) the request's grammar; thread-safe, ParamError if invalid."""
        self.inputs.compile_grammar(request)

    def make_request(
        self, prompt: PromptInput, params: SamplingParams | None = None, **options: Unpack[RequestOptions]
    ) -> Request:
        """Tokenize and validate; pure (touches no engine state), so any thread may call it.
        Options: `RequestOptions` (engine/input_processor.py)."""
        return self.inputs.make_request(prompt, params, **options)

    def add_request(self, request: Request) -> None:
        """Queue a request; with n / best_of > 1 it runs as sibling sequences (engine/groups.py)."""
        rid = request.request_id
        if rid in self.requests or rid in self.parents:
            raise ParamError(f"request_id: {rid!r} is already in use", "request_id")
        self.adapters.activate(request)
        self.compile_grammar(request)  # the server has done it off the step loop already
        self.seqs.add(request)

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        self.seqs.abort(request_id, reason)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------ the step (engine/step_loop.py)
    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns an output for every request that changed (StepLoop.step)."""
        return self.loop.step()

    def fail_step(self, error: str) -> list[RequestOutput]:
        """The step raised: end the requests it scheduled; the rest go on (StepLoop.fail_step)."""
        return self.loop.fail_step(error)

    def finish_all(self, error: str) -> list[RequestOutput]:
        """Fail every live request: blocks freed, outputs carry the error."""
        return self.loop.finish_all(error)

    @property
    def speculator(self) -> Speculator | None:
        return self.loop.speculator

    @speculator.setter
    def speculator(self, value: Speculator | None) -> None:  # tests and benchmarks switch it off and on
        self.loop.speculator = value

    @property
    def num_steps_ahead(self) -> int:
        return self.loop.num_steps_ahead

    @property
    def last_step_tokens(self) -> int:
        return self.loop.last_step_tokens

    def shutdown(self) -> None:
        """Stop the model worker process, if any (the "mp" executor)."""
        self.executor.shutdown()

    def stats(self) -> EngineStats:
        pool = self.kv.pool
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=pool.usage,
            prefix_cache_hit_rate=pool.num_hit_tokens / pool.num_query_tokens if pool.num_query_tokens else 0.0,
            num_preemptions=self.scheduler.num_preemptions,
            lora=self.adapters.stats(self.scheduler.lora_slots),
            worker_busy_s=getattr(self.executor, "worker_seconds", None),
            worker_idle_s=getattr(self.executor, "worker_idle_seconds", None),
        )
