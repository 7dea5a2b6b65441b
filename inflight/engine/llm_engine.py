"""LLMEngine: the synchronous step loop (schedule -> execute -> update -> outputs)."""

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
from inflight.engine.tokenizer import PromptInput, load_tokenizer
from inflight.outputs import RequestOutput, SchedulerOutput
from inflight.request import FinishReason, Request
from inflight.sampling_params import ParamError, SamplingParams
from inflight.spec_decode.config import RUNNER_METHODS
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
        self._step_ids: list[str] | None = None  # the requests of the step in progress (fail_step ends them)
        self._inflight: SchedulerOutput | None = None  # sent to the worker ahead of its output (async scheduling)
        self.num_steps_ahead = 0  # steps scheduled before the previous step's output was read
        self._step_freed: list[str] = []  # finished ids that step's output told the runner to drop
        self._step_finished: list[str] = []  # requests that step finished before running (abort, timeout)
        self.last_step_tokens = 0  # tokens the last step ran (the admission estimate's rate)
        spec = config.speculative  # the engine proposes drafts itself before each step it schedules
        self.speculator = Speculator(spec, config.model.vocab_size) if spec is not None else None

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

    # ------------------------------------------------------------ the step
    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns an output for every request that changed.

        With a worker process (`mp`) and `async_scheduling`, the next step is scheduled and sent
        before this one's output is read, so the worker never waits for the engine: the
        scheduler counts the tokens being sampled as pending (core/scheduler.py) and the runner
        already holds them. A request that stops (EOS, stop string) may have run one more row,
        which is dropped. Steps with beams or drafts are not run ahead of: what comes
        next depends on their output (a grammar does not stop it: the runner's matcher already
        took the token it sampled).

        A request whose own work fails (the runner reports it, or its output processing raises)
        ends alone with `finish_reason` "abort" and `error` set; if the step raises anyway,
        `fail_step` ends the requests it scheduled (and those of the step sent after it)."""
        self._step_ids = None
        self.last_step_tokens = 0
        sched, self._inflight = self._inflight, None
        try:
            if sched is None:
                if self.speculator is not None:  # nothing in flight: every last token is known
                    self.speculator.propose(self.scheduler)
                sched = self.scheduler.schedule()
                if sched.has_work:
                    self.executor.submit(sched)
            self._track([sched])
            ahead = None
            if self._can_run_ahead(sched):
                self.num_steps_ahead += 1
                ahead = self.scheduler.schedule()
                self._track([sched, ahead])
                if ahead.has_work:
                    self.executor.submit(ahead)
            outputs = self._finish(sched)
            if ahead is not None and ahead.has_work:
                self._inflight = ahead
            elif ahead is not None:
                outputs += self._finish(ahead)
            if not self.scheduler.has_unfinished():
                if self._inflight is not None:  # rows of requests that have all finished since
                    outputs += self._finish(self._inflight)
                    self._inflight = None
                self._release_runner_state()
        except BaseException:
            self._inflight = None
            self.executor.drain()  # the worker answers every step sent: read those answers
            raise
        self._step_ids = None
        return outputs

    def _track(self, steps: list[SchedulerOutput]) -> None:
        """What fail_step ends if the step raises from here on."""
        self._step_ids = [sr.request_id for s in steps for sr in s.scheduled]
        self._step_freed = [rid for s in steps for rid in s.freed_ids]
        self._step_finished = [rid for s in steps for rid in s.finished_ids]

    def _live(self, request_id: str, serial: int) -> bool:
        req = self.requests.get(request_id)
        return req is not None and req.serial == serial and not req.is_finished

    def _can_run_ahead(self, sched: SchedulerOutput) -> bool:
        """Can the step after `sched` be scheduled before `sched`'s output is read?"""
        if not (self.executor.pipelined and self.config.async_scheduling and sched.scheduled):
            return False
        if self.speculator is not None and self.speculator.active(self.scheduler):
            return False  # the next step proposes from this one's tokens (spec_decode/proposer.py)
        for sr in sched.scheduled:
            req = self.requests.get(sr.request_id)
            if sr.num_draft_tokens or req is None or req.beam_group_id is not None:
                return False  # its verified drafts / its group's chosen beams decide what runs next
        return True

    def _finish(self, sched: SchedulerOutput) -> list[RequestOutput]:
        """Read `sched`'s output from the runner (it was submitted) and turn it into outputs."""
        changed: list[Request] = [self.requests[rid] for rid in sched.finished_ids if rid in self.requests]
        if not sched.has_work:
            return self.seqs.outputs(changed)
        result = self.executor.collect()
        self.last_step_tokens += sched.num_batched_tokens
        # async scheduling: a request may have finished (and its id been reused) since this step was
        # sent; what the step made for it is dropped (its extra row's logits included)
        gone = {sr.request_id for sr in sched.scheduled if not self._live(sr.request_id, sr.serial)}
        if gone:
            result.drop(gone)
        for rid, err in result.failed.items():
            if rid in self.requests and not self.requests[rid].is_finished:
                logger.error("request %s failed in the model step: %s", rid, err)
                changed.extend(self.seqs.fail(self.requests[rid], f"engine error: {err}"))
        self.output_processor.absorb(result)
        touched = self.scheduler.update_from_output(sched, result)
        if self.speculator is not None and self.speculator.config.method in RUNNER_METHODS:
            self.speculator.absorb([self.requests[sr.request_id] for sr in sched.scheduled if self._live(sr.request_id, sr.serial)], result.draft_token_ids)
        for req in touched:
            try:
                new = result.sampled[req.request_id][: req.num_new_tokens]  # > 1: accepted drafts
                for i, st in enumerate(new):
                    stop = self.output_processor.on_token(req, st, last=i == len(new) - 1)
                    if stop is not None and not req.is_finished:
                        self.scheduler.finish(req, FinishReason.STOP, stop)
            except Exception as e:  # its own output processing: fail it alone
                logger.exception("request %s: output processing failed", req.request_id)
                changed.extend(self.seqs.fail(req, f"engine error: {type(e).__name__}: {e}"))
                continue
            changed.append(req)
        outputs = self.seqs.outputs(changed)
        return outputs + self.seqs.advance_beams(result.beam_logprobs, result.generation_logits)

    def fail_step(self, error: str) -> list[RequestOutput]:
        """The step raised: end the requests it scheduled (all live ones if it failed while
        scheduling, when the scheduler's state can't be trusted); the rest go on."""
        ids, self._step_ids = self._step_ids, None
        self._inflight = None
        self.executor.drain()
        if ids is None:
            return self.finish_all(error)
        self.scheduler.free_again(self._step_freed)  # the runner may not have seen them
        changed = [self.requests[rid] for rid in self._step_finished if rid in self.requests]  # timed out, aborted
        for rid in ids:
            req = self.requests.get(rid)
            if req is not None and not req.is_finished:
                changed.extend(self.seqs.fail(req, error))
        try:
            return self.seqs.outputs(changed)
        except Exception:  # the output state is what broke: everything goes
            logger.exception("outputs of a failed step")
            return self.finish_all(error)

    def _release_runner_state(self) -> None:
        """Nothing live: hand the runner the ids finished in the last step now, not at the next one."""
        idle = self.scheduler.schedule()
        if idle.has_work:
            self.executor.execute(idle)

    def finish_all(self, error: str) -> list[RequestOutput]:
        """Fail every live request (used when a step raised): blocks freed, outputs carry the error."""
        self._inflight = None
        self.executor.drain()
        live = list(self.requests.values())
        for req in live:
            if not req.is_finished:
                self.scheduler.finish(req, FinishReason.ABORT)
        outputs = self.seqs.outputs(live, error)
        self.seqs.clear()
        try:
            self._release_runner_state()
        except Exception:  # the runner is what failed: its state goes with the next request's
            logger.exception("runner state not released after a failed step")
        return outputs

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
        )
