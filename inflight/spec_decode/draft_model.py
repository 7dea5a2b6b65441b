"""The draft model (method draft_model): a smaller checkpoint of the target's vocabulary, run by
the target's runner (the driver rank), on its own paged KV pool laid out like the target's.

Same block tables: position p of a request lives in slot block_table[p // bs] * bs + p % bs of
both pools, so the scheduler allocates for both at once (the pool is sized for both,
`bytes_per_block`). Each step:
  1. the draft model runs the step's flat batch as the target did (same ids, positions, slots):
     its KV follows the target's, rejected drafts' slots included (overwritten later, as there);
  2. for each piece that asks for proposals (`num_lookahead`), from the token the target just sampled after its accepted drafts
     (position b), K greedy decode steps: d1 at b + 1 .. dK at b + K, KV written at b .. b + K - 1
     (the lookahead slots the scheduler allocated);
  3. the drafts go back in `ModelRunnerOutput.draft_token_ids`; the next step verifies them.
Drafts are the draft model's argmax for greedy requests; for sampled ones a draw from its
distribution q, kept for the verifying step's p / q rule (spec_decode/picker.py). A stale draft KV
(a step that ran without the draft model, a prefix-cache block computed then) only lowers
acceptance: verification never trusts the drafts. Cost when not proposing: one forward of the
draft model per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from inflight.models.attention import select_backend
from inflight.models.cpu_kernel import DecodeKernel
from inflight.models.loader import load_model
from inflight.models.step import StepBatch
from inflight.outputs import SampledToken, ScheduledRequest
from inflight.spec_decode.picker import pick_drafts
from inflight.worker.kv_cache import allocate_kv_cache, bytes_per_block


class DraftModel:
    def __init__(self, cfg: Any, block_size: int, progress: bool = False) -> None:
        self.cfg = cfg  # the draft's ModelConfig (SpeculativeConfig.draft)
        self.device = cfg.device
        self.block_size = block_size
        self.model = load_model(cfg, progress=progress)
        self.attention = select_backend(cfg, block_size, self.model.sliding_window)  # type: ignore[arg-type]
        self.kv_caches: list[torch.Tensor] = []
        self.kernel: DecodeKernel | None = None  # the CPU decode kernel over the draft's pool, as the target's

    def bytes_per_block(self) -> int:
        return bytes_per_block(self.cfg, self.block_size)

    def allocate(self, num_blocks: int) -> None:
        self.pool, self.kv_caches = allocate_kv_cache(self.cfg, num_blocks, self.block_size)
        self.kernel = DecodeKernel.build(self.model, self.kv_caches, self.block_size)

    def _tensor(self, data: list[int]) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.int64, device=self.device)

    def _forward(self, step: StepBatch) -> torch.Tensor:
        """The draft's final hidden states of `step`: its K greedy decodes and the catch-up of a
        verification step (K + 1 rows) in the CPU decode kernel where it takes them."""
        kernel = self.kernel
        if kernel is not None and kernel.accepts(step.num_tokens, step.decode_only, not step.plain, len(step.query_lens)):
            return kernel.forward(step.token_ids, step.positions, step.slots, step.row_block_table())
        meta = self.attention.build_metadata(step)  # its own, over the same slots and block tables
        vocab = self.cfg.vocab_size  # p-tuning's virtual ids have no row here: any token will do
        return self.model(step.input_ids.clamp(max=vocab - 1), self._tensor(step.positions), self.kv_caches, meta)  # type: ignore[operator]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and self.kernel.takes_logits(hidden.shape[0]):
            return self.kernel.logits(hidden)
        return self.model.compute_logits(hidden)  # type: ignore[operator,no-any-return]

    def catch_up(self, step: StepBatch) -> None:
        """1: run the step's flat batch as the target ran it, so the draft's KV follows the
        target's. Every step, proposing or not: a block computed now may be a prefix-cache hit of
        a later request that speculates."""
        self._forward(step)

    def propose(
        self, pieces: list[ScheduledRequest], tables: dict[str, np.ndarray], sampled: dict[str, list[SampledToken]],
        delta: dict[str, int], reqs: list[Any],
    ) -> dict[str, list[int]]:  # fmt: skip
        """2: drafts for the pieces with num_lookahead > 0, after `catch_up` ran the step;
        `tables`: each request's block table (the runner's row); `delta`: each request's rotary
        offset (position - index, M-RoPE prompts); `reqs`: the pieces' RunnerRequests."""
        todo = []
        runner_req = {r.request_id: r for r in reqs}
        for sr in pieces:
            got = sampled.get(sr.request_id)
            if not sr.num_lookahead or not got or not sr.samples:
                continue
            k = sr.num_draft_tokens
            kept = next((i for i in range(k) if got[i].token_id != sr.draft_token_ids[i]), k)
            pos = sr.num_computed_tokens + sr.num_tokens - k + kept  # index of the new token
            todo.append((sr, pos, got[kept].token_id))
        if not todo:
            return {}
        out: dict[str, list[int]] = {sr.request_id: [] for sr, _, _ in todo}
        tokens = [t for _, _, t in todo]
        for sr, _, _ in todo:
            runner_req[sr.request_id].draft_q = None  # this step's drafts replace any earlier ones
        for step in range(max(sr.num_lookahead for sr, _, _ in todo)):  # 2: batched greedy decodes
            rows = [(sr, pos + step) for sr, pos, _ in todo if step < sr.num_lookahead]
            live = [i for i, (sr, _, _) in enumerate(todo) if step < sr.num_lookahead]
            bs = self.block_size
            step_slots = [int(tables[sr.request_id][p // bs]) * bs + p % bs for sr, p in rows]
            step_pos = [p + delta.get(sr.request_id, 0) for sr, p in rows]
            width = max(p // bs + 1 for _, p in rows)
            ids = [tokens[i] for i in live]
            hidden = self._forward(StepBatch(
                token_ids=ids, positions=step_pos, query_lens=[1] * len(rows), context_lens=[p + 1 for _, p in rows],
                slots=self._tensor(step_slots), block_table=torch.from_numpy(np.stack([tables[sr.request_id][:width] for sr, _ in rows])),
                device=self.device,
            ))  # fmt: skip
            nxt = pick_drafts(self._logits(hidden), [runner_req[sr.request_id] for sr, _ in rows])
            for i, t in zip(live, nxt):
                tokens[i] = t
                out[todo[i][0].request_id].append(t)
        return out
