"""ModelRunner: SchedulerOutput -> one forward over the flat batch -> sampled tokens."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from inflight import memory
from inflight.config import EngineConfig
from inflight.models.attention import FastPath, select_backend
from inflight.models.cpu_kernel import DecodeKernel
from inflight.models.loader import load_model
from inflight.models.lora import LoRASlots
from inflight.models.parallel import TensorParallel
from inflight.models.step import StepBatch
from inflight.outputs import ModelRunnerOutput, SampledToken, ScheduledRequest, SchedulerOutput
from inflight.sample.sampler import GreedyRows, Sampler
from inflight.spec_decode.draft_model import DraftModel
from inflight.spec_decode.eagle import EagleProposer
from inflight.worker.input_batch import InputBatch, RunnerRequest
from inflight.worker.kv_cache import allocate_kv_cache, num_kv_blocks
from inflight.worker.logits_capture import (
    capture_pooled,
    capture_prompt_logits,
    drop_rejected_logits,
)
from inflight.worker.multistep import run_passes
from inflight.worker.one_decode import OneDecode, decode_one, inference_mode
from inflight.worker.sampling import sample
from inflight.worker.step_batch import step_batch
from inflight.worker.step_inputs import step_inputs
from inflight.worker.vision import VisionRunner

logger = logging.getLogger(__name__)


class ModelRunner:
    """Owns the model, the KV pool and the step's device work. Built in two stages: __init__ loads
    the weights, allocate_kv_cache() then takes the memory they left (LLMEngine sizes the pool).

    Tensor parallel (`tp`): every rank runs the same steps on its shard of the model and its
    heads of the KV cache; the logits are all-gathered, so every rank runs the same code up to
    them (prompt-logprob captures included) and only rank 0, the driver, samples: sampling on
    every rank would draw unseeded noise from N different process RNGs and advance N copies of
    each grammar matcher for tokens nobody reads."""

    def __init__(self, config: EngineConfig, progress: bool = True, tp: TensorParallel | None = None) -> None:
        self.config = config
        self.device = config.model.device
        self.block_size = config.cache.block_size
        self.tp = tp or TensorParallel.single()
        self.driver = self.tp.rank == 0  # samples and reports; the other ranks only compute
        self.model = load_model(config.model, progress=progress, tp=self.tp)
        self.num_kv_heads: int = self.model.num_local_kv_heads  # type: ignore[assignment]
        self.window: int | None = self.model.sliding_window  # type: ignore[assignment]
        self.attention = select_backend(config.model, self.block_size, self.window)
        self.sampler = Sampler()
        self.decode_kernel: DecodeKernel | None = None
        self.one_decode: OneDecode | None = None  # its batch-1 greedy call (worker/one_decode.py)
        self.graphs: FastPath | None = None  # CUDA graphs of decode steps, from the attention backend
        max_blocks = -(-config.model.max_model_len // self.block_size)
        self.batch = InputBatch(self.device, max_blocks, self.block_size)  # the runner's own per-request state, row-indexed
        # LoRA: every decoder linear wrapped; the scheduler says which adapter goes in which slot
        self.lora = LoRASlots(self.model, config.scheduler.max_loras, config.model.dtype, self.device) if config.enable_lora else None
        # vision-language models: the encoder runs in the step for the image rows it reaches
        self.vision: VisionRunner | None = None
        if hasattr(self.model, "encode_vision"):
            self.vision = VisionRunner(self.model, self.device, config.cache.mm_cache_mib * 2**20)
        # speculative decoding with a draft model: on the driver only (it alone samples)
        spec = config.speculative
        self.draft: DraftModel | EagleProposer | None = None
        if spec is not None and spec.method == "draft_model" and self.driver:
            self.draft = DraftModel(spec.draft, self.block_size, progress)
        elif spec is not None and spec.method in ("eagle", "eagle3") and self.driver:
            self.draft = EagleProposer(spec, self.model, self.block_size)
        self.eagle = self.draft if isinstance(self.draft, EagleProposer) else None

    def num_kv_blocks(self) -> int:
        """KV blocks that fit the memory the loaded weights left (or the configured budget)."""
        cfg = self.config
        sharers = cfg.parallel.core_sharers  # model processes sharing this node's memory
        extra = self.draft.bytes_per_block() if self.draft is not None else 0  # both pools share the budget
        return num_kv_blocks(cfg.model, cfg.cache, cfg.scheduler.max_num_seqs, self.num_kv_heads, sharers, extra)

    def allocate_kv_cache(self, config: EngineConfig, num_blocks: int) -> None:
        """The KV pool, then what reads it: the CPU decode kernel, or CUDA graphs of decode steps."""
        self.config = config  # max_model_len may have been capped to the pool
        self.kv_pool, self.kv_caches = allocate_kv_cache(config.model, num_blocks, self.block_size, self.num_kv_heads)
        if self.draft is not None:
            self.draft.allocate(num_blocks)  # the same block ids, in the draft's own pool
        # small steps in one C call (CPU): decodes, K + 1 verification rows; None: every step runs the PyTorch model
        self.decode_kernel = DecodeKernel.build(self.model, self.kv_caches, self.block_size)
        if self.decode_kernel is not None and self.eagle is not None and self.eagle.eagle3:
            self.decode_kernel.set_aux_layers(tuple(sorted(self.eagle.aux_layers)))  # the model's order: layer by layer
        memory.weights_in_huge_pages(self.model, self.decode_kernel, self.draft, skip=self.kv_caches)  # fewer TLB misses
        # not under tensor parallelism: nccl all-reduces inside captured graphs are untested here
        if self.tp.size == 1 and not config.model.enforce_eager:
            max_blocks = -(-config.model.max_model_len // self.block_size)
            self.graphs = self.attention.capture_graphs(self.model, self.kv_caches, config.scheduler.max_num_seqs, max_blocks)

    def _tensor(self, data: list[int]) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.int64, device=self.device)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Update the runner's request state from `out`, run its pieces (torch's work under its
        inference mode: `_run`, `run_passes`; a lone greedy stream's one C call needs none), sample.

        A request whose own work raises is reported in `failed`, never the whole step: when the
        batched step raises, each piece runs again alone (its progress restored first), so only
        the pieces that fail alone fail. Errors that leave the device unusable are raised (`fatal`).
        """
        result = ModelRunnerOutput()
        self.batch.update(out, result.failed)
        if out.blocks_to_copy:
            self.copy_blocks(out.blocks_to_copy)  # before this step's forward writes any block
        for slot, adapter in out.lora_loads:
            assert self.lora is not None, "LoRA adapters scheduled on an engine without enable_lora"
            inference_mode(self.lora.load)(slot, adapter)
        pieces = [sr for sr in out.scheduled if sr.request_id not in result.failed] if result.failed else list(out.scheduled)
        if not pieces:
            return result
        saved = self._progress(pieces) if len(pieces) > 1 else {}  # for reruns
        try:
            ran = out.num_steps > 1 and run_passes(self, pieces, result, out.num_steps)
            if not (ran or (len(pieces) == 1 and decode_one(self, pieces[0], result))):  # a lone greedy stream: one C call
                self._run(pieces, result)
        except Exception as e:
            if _is_fatal(e):
                e.fatal = True  # type: ignore[attr-defined]
                raise
            failed = result.failed
            result = ModelRunnerOutput(failed=failed)
            if len(pieces) == 1:
                failed[pieces[0].request_id] = _describe(e)
                return result
            for sr in pieces:  # which of them fails on its own?
                if sr.request_id in saved:
                    self.batch[sr.request_id].restore(saved[sr.request_id])
                alone = ModelRunnerOutput()
                try:
                    self._run([sr], alone)
                except Exception as e2:
                    if _is_fatal(e2):
                        e2.fatal = True  # type: ignore[attr-defined]
                        raise
                    failed[sr.request_id] = _describe(e2)
                else:
                    result.merge(alone)
        return result

    def _progress(self, pieces: list[ScheduledRequest]) -> dict[str, tuple[Any, ...]]:
        """What a step may change of its requests (`RunnerRequest.progress`), of those whose it
        may change: a request that captures nothing and has no seed keeps it as it is."""
        if not self.batch.num_special:  # all plain greedy: none may
            return {}
        reqs = [self.batch[sr.request_id] for sr in pieces]
        return {r.request_id: r.progress() for r in reqs if r.captures or r.seed is not None}

    @inference_mode
    def _run(self, scheduled: list[ScheduledRequest], result: ModelRunnerOutput) -> None:
        """One forward over the pieces and sampling; fills `result`."""
        inputs = step_inputs(self.batch, scheduled, self.draft is not None)
        pieces, reqs, ids, positions = inputs.pieces, inputs.reqs, inputs.ids, inputs.positions
        sample_rows, sample_reqs, drafts = inputs.sample_rows, inputs.sample_reqs, inputs.drafts
        histories, row_drafts, plain = inputs.histories, inputs.row_drafts, inputs.plain_decodes
        step = step_batch(self, pieces, reqs, ids, positions, plain)
        aux: list[torch.Tensor] | None = [] if self.eagle is not None and self.eagle.eagle3 else None
        # plain greedy rows: the decode kernel takes their argmax (and logprobs) beside the logits
        taken = None
        if self.driver and sample_rows and not drafts and (plain or all(r.plain_greedy for r in sample_reqs)):
            taken = GreedyRows(any(r.inputs.chosen_logprobs for r in sample_reqs))
        # every row samples (decodes): the decode kernel may run the lm_head in its step's C call
        head: GreedyRows | bool = taken if taken is not None else len(sample_rows) == len(ids)
        hidden = self.forward(step, aux, head)
        if isinstance(self.draft, DraftModel):  # the driver's draft model keeps its KV level with the target's
            self._draft_step(lambda d: d.catch_up(step))
        if not plain and any(r.captures for r in reqs):
            capture_prompt_logits(self.model, hidden, pieces, reqs, result)
            capture_pooled(hidden, pieces, reqs, result)
        if not sample_rows:
            self._propose(step, pieces, reqs, hidden, aux, {})  # prompt chunks only: an EAGLE head catches up
            return
        # every token samples (decodes): the hidden states as they are, no row gather
        logits = self.logits(hidden if len(sample_rows) == len(ids) else hidden[self._tensor(sample_rows)], taken)
        if not self.driver:  # only rank 0's tokens are read
            return
        cut, row_tokens = sample(self, logits, sample_reqs, histories, drafts, row_drafts, result, taken, plain)
        result.draft_token_ids = self._propose(step, pieces, reqs, hidden, aux, result.sampled)
        if result.generation_logits:
            drop_rejected_logits(pieces, result)
        for rid, n in cut.items():  # the grammar completed at an accepted draft: nothing after it is kept
            del result.sampled[rid][n:]
            del result.generation_logits.get(rid, [])[n:]
        if row_tokens is not None:  # plain decodes: one token a piece, nothing cut
            self.batch.append_decoded(reqs, row_tokens)
        else:
            self.batch.append_sampled(pieces, result.sampled)

    def _propose(
        self, step: StepBatch, pieces: list[ScheduledRequest], reqs: list[RunnerRequest], hidden: torch.Tensor,
        aux: list[torch.Tensor] | None, sampled: dict[str, list[SampledToken]],
    ) -> dict[str, list[int]]:  # fmt: skip
        """The runner's proposer after the step: an EAGLE head catches up on every step and proposes
        for the pieces with lookahead; a draft model proposes for them (it caught up before)."""
        lookahead = self.draft is not None and any(sr.num_lookahead for sr in pieces)  # (an EAGLE head is a draft)
        if self.eagle is not None:
            tables = self.batch.tables_of(reqs) if lookahead else {}
            return self._draft_step(lambda e: e.step(step, pieces, reqs, hidden, aux, sampled, tables)) or {}  # type: ignore[no-any-return]
        if not lookahead:
            return {}
        deltas = {sr.request_id: r.mrope_delta for sr, r in zip(pieces, reqs)}
        tables = self.batch.tables_of(reqs)
        return self._draft_step(lambda d: d.propose(pieces, tables, sampled, deltas, reqs)) or {}  # type: ignore[no-any-return]

    def forward(self, step: StepBatch, aux: list[torch.Tensor] | None = None, head: GreedyRows | bool = False) -> torch.Tensor:
        """Final hidden states of the flat batch: the first fast path that takes the step (a CUDA
        graph replay of decodes; the CPU decode kernel, which also takes a speculating request's
        K + 1 rows), else the model eagerly over the backend's metadata. `aux` (EAGLE-3) gets the
        inputs of the head's target layers: from the eager model or the kernel (CUDA graphs hand
        back the final states alone). The step's, and each pass of worker/multistep.py's."""
        for fast in self._fast_paths():
            if aux is not None and fast is not self.decode_kernel:
                continue
            if fast.accepts(step.num_tokens, step.decode_only, not step.plain, len(step.query_lens)):
                table = step.row_block_table()
                if fast is self.decode_kernel:  # `head`: its lm_head in the same C call (`logits` reads it)
                    hidden = self.decode_kernel.forward(step.token_ids, step.positions, step.slots, table, head)
                else:
                    hidden = fast.forward(step.token_ids, step.positions, step.slots, table)
                if aux is not None:
                    aux.extend(self.decode_kernel.aux_hidden.unbind(0))  # type: ignore[union-attr]
                return hidden
        step.attn = self.attention.build_metadata(step)
        extra = {} if aux is None else {"aux_layers": self.eagle.aux_layers, "aux_hidden": aux}  # type: ignore[union-attr]
        with self.lora.step(step.lora_slots) if step.lora_slots is not None else contextlib.nullcontext():  # type: ignore[union-attr]
            return self.model(step.input_ids, step.position_ids, self.kv_caches, step.attn, inputs_embeds=step.inputs_embeds, **extra)

    def _draft_step(self, work: Callable[[Any], Any]) -> Any:
        """Draft-model work; a failure costs only drafts (logged): no token depends on them."""
        try:
            return work(self.draft)  # type: ignore[arg-type]
        except Exception as e:
            if _is_fatal(e):
                raise
            logger.exception("draft model failed; no drafts from this step")
            return None

    def _fast_paths(self) -> list[FastPath]:
        """Read per step: benchmarks switch the kernel off by setting decode_kernel to None."""
        return [p for p in (self.graphs, self.decode_kernel) if p is not None]

    def logits(self, hidden: torch.Tensor, taken: GreedyRows | None = None) -> torch.Tensor:
        """The rows' logits: the decode kernel's lm_head (run in `forward`'s C call, or now) where
        it takes them, else the model's; `taken` gets the greedy rows' argmax from the kernel."""
        kernel = self.decode_kernel
        if kernel is not None and (kernel.holds_logits(hidden) or kernel.takes_logits(hidden.shape[0])):  # its lm_head GEMV
            return kernel.logits(hidden, taken)
        return self.model.compute_logits(hidden)  # type: ignore[operator]

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer (beam forks of a partial block)."""
        if not pairs:
            return
        bs = self.block_size
        offsets = torch.arange(bs, device=self.device)
        src = torch.cat([s * bs + offsets for s, _ in pairs])
        dst = torch.cat([d * bs + offsets for _, d in pairs])
        self.kv_pool.index_copy_(3, dst, self.kv_pool.index_select(3, src))  # (L, 2, KV, slots, hd)


def _is_fatal(e: BaseException) -> bool:
    """A CUDA error other than out-of-memory leaves the context unusable: no step can run again."""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return False
    accel = getattr(torch, "AcceleratorError", None)
    return (accel is not None and isinstance(e, accel)) or (isinstance(e, RuntimeError) and "CUDA error" in str(e))


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
