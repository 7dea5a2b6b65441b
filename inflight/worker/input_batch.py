"""The runner's own per-request state, kept from a request's first step until it is freed.

Built from `NewRequestData`, advanced by the tokens it samples itself (and, on ranks that do not
sample, by each `ScheduledRequest`'s tokens appended since the runner last saw it), dropped when the scheduler lists the id in `freed_ids`. Attribute
names follow `Request`'s where both hold the same thing, so the logits processors
(sample/processors.py) read either.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from inflight.outputs import NewRequestData, SampledToken, ScheduledRequest, SchedulerOutput
from inflight.sample.processors import uses_processors
from inflight.sample.sampler import SAMPLING_OFF, SamplingBatch, clamp_temperature
from inflight.sampling_params import SamplingParams
from inflight.structured.thinking import ThinkingState


class RunnerRequest:
    def __init__(self, data: NewRequestData, device: torch.device, row: int = 0) -> None:
        inputs = data.inputs
        self.row = row  # its row of the InputBatch's columns, for as long as it lives
        self.request_id = data.request_id
        self.inputs = inputs  # what the client asked for (request_inputs.py): a new field is read from here
        self.params: SamplingParams = inputs.params
        self.all_token_ids: list[int] = data.token_ids
        self.num_prompt_tokens = data.num_prompt_tokens
        self.eos_token_ids = inputs.eos_token_ids
        self.bad_words_ids = inputs.bad_words_ids
        self.is_beam = data.is_beam
        self.seed = inputs.sequence_seed(data.seq_index)
        bias = inputs.params.embedding_bias  # a vocabulary-long list: a tensor once, not every step
        self.embedding_bias = None if bias is None else torch.tensor(bias, dtype=torch.float32, device=device)
        table = inputs.prompt_embedding_table
        self.prompt_embedding_table: torch.Tensor | None = None if table is None else table.to(device)
        # vision-language prompts: items (placeholder spans + pixels), M-RoPE positions, and the
        # encoder output of each item once computed (kept through preemption; worker/vision.py)
        self.mm_items = inputs.mm_items
        self.mrope_positions = inputs.mrope_positions
        self.mrope_delta = inputs.mrope_delta
        self.mm_embeds: dict[int, torch.Tensor] = {}
        # what its steps need beyond plain sampling (read per step: rows that need nothing cost nothing)
        p = inputs.params
        self.uses_processors = uses_processors(p, self.bad_words_ids)
        self.captures = p.needs_prompt_logits or p.pooling is not None  # prompt logits / pooling
        self.matcher: Any = None
        if inputs.grammar is not None:
            from inflight.structured.backend import new_matcher

            self.matcher = new_matcher(inputs.grammar)
        # a reasoning model's thinking: the grammar waits for its end, a budget forces that end
        self.thinking = None if inputs.params.thinking is None else ThinkingState(inputs.params.thinking)
        # a greedy row nothing else reads: no logprobs, processors, grammar, thinking, logits
        # outputs or beam (a step of such rows takes the sampler's argmax path and skips the rest)
        self.plain_greedy = (
            p.is_plain_greedy and not self.uses_processors and self.matcher is None and not self.is_beam
        )  # fmt: skip
        # ... whose decodes are plain rows as well (token embeddings, 1-D positions, no captures):
        # alone in a step, one C call runs it (worker/one_decode.py)
        self.one_call = (
            self.plain_greedy and not self.captures and table is None and not self.mm_items and self.mrope_positions is None
            and not self.mrope_delta
        )  # fmt: skip
        self.generator: torch.Generator | None = None  # seeded sampling: made on first use
        # drafts the runner's proposer drew for a sampled request and their logits (spec_decode/picker.py)
        self.draft_q: tuple[list[int], list[torch.Tensor]] | None = None
        # logits outputs: prompt positions captured so far (a recompute after preemption skips them)
        self.num_prompt_logits = 0
        # decoder embeddings: running sum over pooled positions; done once the vector is sent
        self.pooled_sum: torch.Tensor | None = None
        self.num_pooled = 0
        self.embedded = False

    def progress(self) -> tuple[Any, ...]:
        """What running a step changes (besides the grammar matcher, advanced last): a failed
        step's retry restores it first (`ModelRunner.execute`)."""
        gen_state = None if self.generator is None else self.generator.get_state()
        return (
            self.num_prompt_logits,
            self.pooled_sum,
            self.num_pooled,
            self.embedded,
            self.generator,
            gen_state,
        )

    def restore(self, saved: tuple[Any, ...]) -> None:
        (
            self.num_prompt_logits,
            self.pooled_sum,
            self.num_pooled,
            self.embedded,
            self.generator,
            gen_state,
        ) = saved
        if self.generator is not None:
            self.generator.set_state(gen_state)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens


class InputBatch:
    """Every live request's RunnerRequest, each with a row of persistent columns that the step
    reads instead of rebuilding them from Python lists: the block table (grown in place from each
    piece's new block ids) and the sampling settings (written once, when the request arrives).

    Rows are reused once their request is freed; the columns double when more requests are live
    than they hold (preempted requests keep their row: their state carries on)."""

    def __init__(self, device: torch.device, max_blocks: int, block_size: int = 16, capacity: int = 64) -> None:
        self.device = device
        self.block_size = block_size
        self.requests: dict[str, RunnerRequest] = {}
        # live requests that are not `one_call` plain: none, and a step of one-token decodes
        # checks nothing row by row (worker/step_inputs.py)
        self.num_special = 0
        self.max_blocks = max_blocks  # blocks of one max_model_len request
        self._free: list[int] = []
        self.capacity = 0
        # NumPy, not torch: a step reads a few dozen rows, and a NumPy index is ~1 us where a torch
        # op on a small CPU tensor is 3-10 us (the step's tensors are made once, from these)
        self.block_table = np.zeros((0, max_blocks), dtype=np.int32)
        # the same ids as int64, the decode kernel's type: a batch-1 step hands it a row's address
        # (`decode_row`), no array made a step (each numpy / torch op right after the previous C step
        # runs cache-cold: 5-40 us, Zen 4)
        self.table64 = np.zeros((0, max_blocks), dtype=np.int64)
        self._table64_ptr = 0
        self._table64_ids = memoryview(b"").cast("q")  # its flat view: one id read without numpy
        # sampling columns, SAMPLING_COLUMNS order (top-k as a float: exact below 2^24)
        self.sampling = np.zeros((0, len(SAMPLING_OFF)), dtype=np.float32)
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        more = capacity - old
        self.block_table = np.concatenate([self.block_table, np.zeros((more, self.max_blocks), np.int32)])
        self.table64 = np.concatenate([self.table64, np.zeros((more, self.max_blocks), np.int64)])
        self._table64_ptr = self.table64.ctypes.data
        self._table64_ids = memoryview(self.table64).cast("B").cast("q")
        self.sampling = np.concatenate([self.sampling, np.tile(np.array(SAMPLING_OFF, np.float32), (more, 1))])
        self._free += range(capacity - 1, old - 1, -1)  # lowest row first
        self.capacity = capacity

    def _add(self, data: NewRequestData) -> None:
        if not self._free:
            self._grow(2 * self.capacity)
        row = self._free.pop()
        try:
            req = RunnerRequest(data, self.device, row)
        except BaseException:
            self._free.append(row)
            raise
        p = req.params
        self.sampling[row] = (clamp_temperature(p.temperature), max(p.top_k, 0), p.top_p, p.min_p, p.typical_p)
        self.requests[data.request_id] = req
        self.num_special += not req.one_call

    def update(self, out: SchedulerOutput, failed: dict[str, str]) -> None:
        """Apply `out`; a request whose state can't be built is put in `failed` (id -> error)."""
        for rid in out.freed_ids:  # first: a new request may reuse a freed id
            gone = self.requests.pop(rid, None)
            if gone is not None:
                self._free.append(gone.row)
                self.num_special -= not gone.one_call
        for data in out.new_requests:
            try:
                self._add(data)
            except Exception as e:  # e.g. its grammar or embedding table: fails this request only
                failed[data.request_id] = f"{type(e).__name__}: {e}"
        requests = self.requests
        for sr in out.scheduled:  # (every piece, every step)
            req = requests.get(sr.request_id)
            if req is None:
                continue
            if tokens := sr.new_token_ids:
                start = sr.new_tokens_from
                req.all_token_ids[start : start + len(tokens)] = tokens
            if blocks := sr.new_block_ids:  # a decode adds a block every block_size steps: most pieces bring none
                at = sr.new_blocks_from
                self.block_table[req.row, at : at + len(blocks)] = blocks
                self.table64[req.row, at : at + len(blocks)] = blocks

    def append_sampled(self, pieces: list[ScheduledRequest], sampled: dict[str, list[SampledToken]]) -> None:
        """Append the tokens this step sampled to their requests, as the scheduler will: with
        drafts, those that match the sampled tokens and one more. The runner needs no message to
        know them, so the next step can be scheduled before this one's output is read."""
        for sr in pieces:
            got = sampled.get(sr.request_id)
            if not got or not sr.samples:
                continue
            keep = 0  # got may end early: a grammar completed at an accepted draft
            while keep < min(sr.num_draft_tokens, len(got) - 1) and got[keep].token_id == sr.draft_token_ids[keep]:
                keep += 1
            kept = got[: keep + 1] if sr.num_draft_tokens else got  # a multi-step decode: all of its passes'
            self.requests[sr.request_id].all_token_ids.extend(t.token_id for t in kept)

    def append_decoded(self, reqs: list[RunnerRequest], tokens: list[SampledToken]) -> None:
        """`append_sampled` of one-token decodes without drafts: each request's one token."""
        for req, t in zip(reqs, tokens):
            req.all_token_ids.append(t.token_id)

    def step_tables(
        self, pieces: list[ScheduledRequest], reqs: list[RunnerRequest], decodes: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(block table, slots) of a step: the pieces' rows of the table, (S, width) int32, width =
        the most blocks a piece reads (entries past a row's blocks are stale: context lengths say
        where a row ends), and the cache slot of every token, (T,) int64; both on the CPU.
        `decodes`: every piece is a one-token decode, at these positions (worker/step_inputs.py)."""
        bs = self.block_size
        if len(pieces) == 1 and pieces[0].num_tokens == 1:  # one decode (batch 1): no gather, no index arrays
            pos, row = pieces[0].num_computed_tokens, self.block_table[reqs[0].row]
            one = row[None, : pos // bs + 1].copy()  # (1, width); a copy: the table changes under a step in flight
            return torch.from_numpy(one), torch.from_numpy(np.array([int(row[pos // bs]) * bs + pos % bs], np.int64))
        if decodes is not None:  # (the general path's decodes-only result, without its lists over the pieces)
            table = self.block_table[[r.row for r in reqs], : max(decodes) // bs + 1]
            pos = np.array(decodes)
            return torch.from_numpy(table), torch.from_numpy(table[np.arange(len(reqs)), pos // bs] * np.int64(bs) + pos % bs)
        ends = [sr.num_computed_tokens + sr.num_tokens for sr in pieces]
        rows = [r.row for r in reqs]
        table = self.block_table[rows, : -(-max(ends) // bs)]  # (S, width): one gather
        if all(sr.num_tokens == 1 for sr in pieces):  # decodes only
            pos = np.array(ends) - 1  # (S,) one token per piece: its slot is read straight off the table
            return torch.from_numpy(table), torch.from_numpy(table[np.arange(len(rows)), pos // bs] * np.int64(bs) + pos % bs)
        starts = np.array([sr.num_computed_tokens for sr in pieces])
        lens = np.array([sr.num_tokens for sr in pieces])
        piece = np.repeat(np.arange(len(pieces)), lens)  # (T,) the piece of each token
        pos = np.arange(lens.sum()) - (np.cumsum(lens) - lens)[piece] + starts[piece]
        slots = table[piece, pos // bs].astype(np.int64) * bs + pos % bs
        return torch.from_numpy(table), torch.from_numpy(slots)

    def decode_row(self, req: RunnerRequest, pos: int) -> tuple[int, int, int]:
        """One decode at `pos` of `req`, for the decode kernel's batch-1 call: the address of its
        int64 block-table row, the row's width up to `pos`, and the token's cache slot. The row is
        read in place: it changes only in `update`, never under a step."""
        bs, at = self.block_size, req.row * self.max_blocks
        width = pos // bs + 1
        return self._table64_ptr + at * 8, width, self._table64_ids[at + width - 1] * bs + pos % bs

    def sampling_batch(
        self, reqs: list[RunnerRequest], generators: dict[int, torch.Generator], num_logprobs: list[int | None]
    ) -> SamplingBatch:
        """The sampling settings of these sample rows (a request repeats for its draft rows)."""
        return SamplingBatch.of_rows(self.sampling[[r.row for r in reqs]], generators, num_logprobs, self.device)

    def tables_of(self, reqs: list[RunnerRequest]) -> dict[str, np.ndarray]:
        """Each request's whole block-table row (the draft model's lookahead reads past the step's)."""
        return {r.request_id: self.block_table[r.row] for r in reqs}

    def __getitem__(self, request_id: str) -> RunnerRequest:
        return self.requests[request_id]

    def piece_tokens(self, sr: ScheduledRequest) -> list[int]:
        """The token ids a piece runs: known tokens, then its draft tokens."""
        req = self.requests[sr.request_id]
        start, end = sr.num_computed_tokens, sr.num_computed_tokens + sr.num_tokens
        k = sr.num_draft_tokens
        return req.all_token_ids[start : end - k] + sr.draft_token_ids[:k]
