"""Several decode passes in one engine step (`SchedulerOutput.num_steps`; docs/MULTISTEP.md).

A step of plain greedy decodes whose scheduler reserved KV slots for N tokens runs N forward
passes; pass i + 1 runs the tokens pass i sampled. Between passes no engine work happens (no
schedule, no output processing, no message): at batch 1 that host time is ~1 ms of a 7.6 ms
H100 step (docs/GPU.md) and ~0.7 ms of a 14-18 ms CPU step (docs/QUANTIZATION.md).

  - CUDA graphs: the graphs replay N times; each pass's argmax is copied device-to-device into
    the graph's input buffer, positions / slots / context lengths of every pass are computed on
    the host before the first replay and copied once; one device->host copy at the end.
  - the CPU decode kernel (steps it takes: <= 4 decodes): its C call N times with its greedy
    head (lm_head, argmax and chosen logprob in the call), the argmax fed to the next call;
  - otherwise (eager CUDA, the eager CPU model): the single-step forward, lm_head and greedy
    sampler N times over the pass's rows.
Every token and logprob is the one the step would have made alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from inflight.models.step import StepBatch
from inflight.outputs import ModelRunnerOutput, SampledToken, ScheduledRequest
from inflight.sample.sampler import GreedyRows, SamplingBatch, row_argmax
from inflight.worker.input_batch import InputBatch, RunnerRequest
from inflight.worker.one_decode import inference_mode

ModelRunner = Any  # worker/model_runner.py's, which imports this module: its forward, logits, sampler, graphs


def pass_tables(batch: InputBatch, pieces: list[ScheduledRequest], reqs: list[RunnerRequest], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block table (S, width) int32 covering every pass, positions (n, S), slots (n, S)) of n
    passes over one-token pieces: pass i writes position num_computed + i (the scheduler reserved
    the blocks)."""
    bs = batch.block_size
    pos = np.array([sr.num_computed_tokens for sr in pieces], np.int64)[None, :] + np.arange(n)[:, None]  # (n, S)
    table = batch.block_table[[r.row for r in reqs], : int(pos.max()) // bs + 1]  # (S, width): a copy
    slots = table[np.arange(len(reqs))[None, :], pos // bs].astype(np.int64) * bs + pos % bs  # (n, S)
    return table, pos, slots


@inference_mode
def run_passes(runner: ModelRunner, pieces: list[ScheduledRequest], result: ModelRunnerOutput, n: int) -> bool:
    """n greedy decode passes over `pieces` into `result` (each request's n tokens, in order),
    when every piece allows it (the runner's side of core/pieces.py `multistep_ok`: one-token
    decodes of plain greedy requests on one rank, nothing the fast paths can't take); False:
    nothing ran, the step runs one pass (the scheduler takes the one token)."""
    reqs = [runner.batch[sr.request_id] for sr in pieces]
    ok = runner.driver and runner.tp.size == 1 and runner.draft is None and all(
        sr.num_tokens == 1 and sr.samples and not sr.num_draft_tokens and sr.lora_slot < 0 and r.plain_greedy
        and not r.captures and r.prompt_embedding_table is None and not r.mrope_delta for sr, r in zip(pieces, reqs)
    )  # fmt: skip
    if not ok:
        return False
    table, pos, slots = pass_tables(runner.batch, pieces, reqs, n)
    ids = [r.all_token_ids[sr.num_computed_tokens] for sr, r in zip(pieces, reqs)]
    want_lp = any(r.inputs.chosen_logprobs for r in reqs)
    graphs, kernel = runner.graphs, runner.decode_kernel
    if graphs is not None and hasattr(graphs, "forward_steps") and graphs.accepts(len(ids)):
        rows = _graph_passes(runner, ids, pos, slots, table, want_lp)
    elif kernel is not None and kernel.lm_head is not None and kernel.accepts(len(ids), True, False, len(ids)):
        rows = _kernel_passes(kernel, ids, pos, slots, table, want_lp)
    else:
        rows = _host_passes(runner, ids, pos, slots, table, want_lp)
    result.sampled = {r.request_id: [row[j] for row in rows] for j, r in enumerate(reqs)}
    runner.batch.append_sampled(pieces, result.sampled)
    return True


def _kernel_passes(
    kernel: Any, ids: list[int], pos: np.ndarray, slots: np.ndarray, table: np.ndarray, want_lp: bool
) -> list[list[SampledToken]]:
    """The CPU decode kernel's C call once a pass with its greedy head (the lm_head, argmax and
    chosen logprob in the same call, as a plain greedy step of <= 8 rows takes them): nothing
    else runs between passes."""
    block_table = torch.from_numpy(table)
    rows = []
    for i in range(pos.shape[0]):
        taken = GreedyRows(want_lp)
        kernel.logits(kernel.forward(ids, pos[i].tolist(), torch.from_numpy(slots[i]), block_table, taken), taken)
        ids = taken.token_ids  # type: ignore[assignment]
        lps = taken.logprobs if want_lp else None
        rows.append([SampledToken(t, math.nan if lps is None else lps[j]) for j, t in enumerate(ids)])
    return rows


def _host_passes(
    runner: ModelRunner, ids: list[int], pos: np.ndarray, slots: np.ndarray, table: np.ndarray, want_lp: bool
) -> list[list[SampledToken]]:
    """Each pass as the step would run it alone: `forward` (the decode kernel takes the greedy
    head in its C call), `logits`, the greedy sampler; the tokens feed the next pass."""
    s = len(ids)
    block_table = torch.from_numpy(table)
    rows = []
    for i in range(pos.shape[0]):
        slot = torch.from_numpy(slots[i])
        step = StepBatch(
            token_ids=ids, positions=pos[i].tolist(), query_lens=[1] * s, context_lens=(pos[i] + 1).tolist(),
            slots=slot if runner.device.type == "cpu" else slot.to(runner.device, non_blocking=True),
            block_table=block_table, device=runner.device,
        )  # fmt: skip
        taken = GreedyRows(want_lp)
        hidden = runner.forward(step, None, taken)
        logits = runner.logits(hidden, taken)
        sampled = runner.sampler(logits, SamplingBatch.greedy(s, want_lp, taken))
        rows.append(sampled)
        ids = [t.token_id for t in sampled]
    return rows


def _graph_passes(
    runner: ModelRunner, ids: list[int], pos: np.ndarray, slots: np.ndarray, table: np.ndarray, want_lp: bool
) -> list[list[SampledToken]]:
    """The CUDA graphs replayed once a pass, the argmax fed back on the device; the lm_head,
    argmax and log-softmax are the greedy sampler's ops (the same tokens and logprobs)."""
    n, s = pos.shape
    tokens = torch.empty(n, s, dtype=torch.float64, device=runner.device)
    lps = torch.full((n, s), math.nan, dtype=torch.float64, device=runner.device)

    def pick(hidden: torch.Tensor, i: int) -> torch.Tensor:
        logits = runner.logits(hidden)
        tok = row_argmax(logits)
        tokens[i] = tok
        if want_lp:
            lps[i] = torch.log_softmax(logits, dim=-1).gather(1, tok[:, None])[:, 0]
        return tok

    runner.graphs.forward_steps(ids, pos, slots, table, pick)  # type: ignore[union-attr]
    host = torch.stack((tokens, lps)).tolist()  # the one device->host copy of the step
    return [[SampledToken(int(t), lp) for t, lp in zip(host[0][i], host[1][i])] for i in range(n)]
