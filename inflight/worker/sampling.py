"""The runner's sampling of a step: the sample rows' logits -> one token each (the tensor work is
sample/sampler.py's), the sampling batch of the persistent columns, the beams' log-prob rows.
Once a step, from the runner's step (worker/model_runner.py)."""

from __future__ import annotations

from typing import Any

import torch

from inflight.outputs import ModelRunnerOutput, SampledToken
from inflight.sample.processors import TokenHistory, build_processors
from inflight.sample.sampler import DraftRows, GreedyRows, SamplingBatch
from inflight.structured.runtime import advance_matchers, grammar_mask
from inflight.worker.input_batch import RunnerRequest
from inflight.worker.logits_capture import capture_generation_logits

ModelRunner = Any  # worker/model_runner.py's, which imports this module: its sampler, batch, device, config


def sample(
    runner: ModelRunner, logits: torch.Tensor, reqs: list[RunnerRequest], histories: list[TokenHistory], drafts: list[DraftRows],
    row_drafts: list[list[int]], result: ModelRunnerOutput, taken: GreedyRows | None = None, plain: bool = False,
) -> tuple[dict[str, int], list[SampledToken] | None]:
    """One token per sample row into `result.sampled`; rows that are plain greedy (argmax, nothing
    else read) skip the sampling columns, the logits captures, beams and grammars. Returns the
    runs cut where their grammar completed (request id -> tokens kept) and, for `plain` rows, the
    tokens in row order (else None). `taken`: what the decode kernel took for plain greedy rows
    (`ModelRunner.logits`); `plain`: every row a plain decode of its own request (worker/step_inputs.py)."""
    cut: dict[str, int] = {}
    if not drafts and (plain or all(r.plain_greedy for r in reqs)):
        sampled = runner.sampler(logits, SamplingBatch.greedy(len(reqs), any(r.inputs.chosen_logprobs for r in reqs), taken))
    else:
        capture_generation_logits(logits, reqs, result)
        batch = sampling_batch(runner, reqs, histories, row_drafts)
        batch.drafts = drafts
        sampled = runner.sampler(logits, batch)
        beam_rows(runner, logits, reqs, histories, result)
        # last: a matcher can't be advanced twice, so nothing after this may fail (no retry repeats it)
        result.grammar_terminated, cut = advance_matchers(reqs, sampled, row_drafts)
    if plain and not result.sampled:  # a row per request: the dict in one go
        result.sampled = {r.request_id: [token] for r, token in zip(reqs, sampled)}
        return cut, sampled
    for r, token in zip(reqs, sampled):
        result.sampled.setdefault(r.request_id, []).append(token)
    return cut, None


def beam_rows(
    runner: ModelRunner, logits: torch.Tensor, reqs: list[RunnerRequest], histories: list[TokenHistory], result: ModelRunnerOutput
) -> None:
    """The beam group chooses tokens from full distributions: each beam's log-softmax row with
    the request's processors applied to it (HF `_beam_search` runs its processors on the
    log-probs, not the logits: penalties, bans and biases act per beam on its own history)."""
    rows = [row for row, r in enumerate(reqs) if r.is_beam]
    if not rows:
        return
    at = torch.tensor(rows, dtype=torch.int64, device=runner.device)
    lps = torch.log_softmax(logits[at].float(), dim=-1)  # (R, V)
    for proc in build_processors([histories[row] for row in rows], lps.device, runner.config.model.vocab_size):
        lps = proc(lps)
    for j, row in enumerate(rows):
        result.beam_logprobs[reqs[row].request_id] = lps[j]


def sampling_batch(
    runner: ModelRunner, reqs: list[RunnerRequest], histories: list[TokenHistory], row_drafts: list[list[int]]
) -> SamplingBatch:
    """The step's sample rows of the persistent sampling columns (worker/input_batch.py)."""
    gens = {}
    for row, r in enumerate(reqs):
        if r.seed is not None and r.params.temperature > 0:
            if r.generator is None:
                r.generator = torch.Generator(device=runner.device)
                r.generator.manual_seed(r.seed)
            gens[row] = r.generator
    vocab = runner.config.model.vocab_size
    batch = runner.batch.sampling_batch(reqs, gens, [vocab if r.params.logprobs == -1 else r.params.logprobs for r in reqs])
    batch.logprob_ids = [r.params.logprob_token_ids for r in reqs]
    batch.chosen_logprobs = any(r.inputs.chosen_logprobs for r in reqs)
    if any(r.uses_processors for r in reqs):
        batch.processors.extend(build_processors(histories, runner.device, vocab))
    mask = grammar_mask(reqs, vocab, row_drafts)
    if mask is not None:
        batch.processors.append(mask)  # last: nothing may re-enable a disallowed token
    return batch
