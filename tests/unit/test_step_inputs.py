"""A step's inputs (worker/step_inputs.py): the list comprehensions of a step of plain one-token
decodes give what the general piece-by-piece loop gives, and any request that is not plain (or any
piece that is not such a decode) sends the step down the general loop."""

from __future__ import annotations

import torch

from inflight.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from inflight.request_inputs import RequestInputs
from inflight.sampling_params import SamplingParams
from inflight.worker.input_batch import InputBatch
from inflight.worker.step_inputs import general_inputs, plain_decodes, step_inputs

CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0.0)


def _batch(params: list[SamplingParams]) -> tuple[InputBatch, list[ScheduledRequest]]:
    """Requests of 3 + i prompt tokens each, through their prompt; then a decode piece each."""
    batch = InputBatch(CPU, max_blocks=8, block_size=4, capacity=2)
    new = [NewRequestData(f"r{i}", RequestInputs(list(range(10 + i, 13 + 2 * i)), p)) for i, p in enumerate(params)]
    prompt = [ScheduledRequest(d.request_id, 0, d.num_prompt_tokens, True, new_block_ids=[2 * i, 2 * i + 1], new_blocks_from=0) for i, d in enumerate(new)]
    batch.update(SchedulerOutput(prompt, 0, new_requests=new), {})
    for i, d in enumerate(new):
        batch[d.request_id].all_token_ids.append(100 + i)  # the token the prompt step sampled
    decodes = [ScheduledRequest(d.request_id, d.num_prompt_tokens, 1, True) for d in new]
    return batch, decodes[::-1]  # not in row order


def _lists(s: object) -> tuple[object, ...]:
    f = ("pieces", "reqs", "ids", "positions", "sample_rows", "sample_reqs", "drafts", "histories", "row_drafts")
    return tuple(getattr(s, name) for name in f)


def test_plain_decodes_equal_the_general_loop() -> None:
    batch, decodes = _batch([GREEDY] * 5)
    assert batch.num_special == 0
    fast = step_inputs(batch, decodes, proposer=False)
    assert fast.plain_decodes
    slow = general_inputs(batch, decodes)
    assert _lists(fast) == _lists(slow)
    assert fast.ids == [104, 103, 102, 101, 100] and fast.positions == [7, 6, 5, 4, 3]
    # the step's tables from its positions: the general path's
    (t1, s1), (t2, s2) = batch.step_tables(fast.pieces, fast.reqs, fast.positions), batch.step_tables(slow.pieces, slow.reqs)
    assert (t1.tolist(), s1.tolist(), t1.dtype, s1.dtype) == (t2.tolist(), s2.tolist(), t2.dtype, s2.dtype)
    assert s1.tolist() == [(2 * i + (3 + i) // 4) * 4 + (3 + i) % 4 for i in (4, 3, 2, 1, 0)]  # blocks 2i, 2i + 1
    # the proposer's q of a request is consumed by the step, verified or not (as verify_rows)
    batch["r2"].draft_q = ([7], [torch.zeros(3)])
    assert plain_decodes(batch, decodes, proposer=True).ids == fast.ids and batch["r2"].draft_q is None


def test_anything_not_plain_takes_the_general_loop() -> None:
    for special in (SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=0.8, seed=1),
                    SamplingParams(temperature=0.0, repetition_penalty=1.2), SamplingParams(temperature=0.0, prompt_logprobs=1)):  # fmt: skip
        batch, decodes = _batch([GREEDY, special, GREEDY])
        assert batch.num_special == 1
        s = step_inputs(batch, decodes, proposer=False)
        assert not s.plain_decodes and _lists(s) == _lists(general_inputs(batch, decodes))
        # once the special request is freed, its neighbours' steps are plain again
        batch.update(SchedulerOutput([], 0, freed_ids=["r1"]), {})
        assert batch.num_special == 0 and step_inputs(batch, [decodes[0], decodes[2]], proposer=False).plain_decodes
    # a prefill piece, or a one-token piece that does not sample (a prompt chunk), in a plain batch
    batch, decodes = _batch([GREEDY] * 3)
    chunk = ScheduledRequest("r0", 1, 1, False)
    for pieces in ([*decodes[:2], ScheduledRequest("r0", 0, 3, True)], [*decodes[:2], chunk]):
        s = step_inputs(batch, pieces, proposer=False)
        assert not s.plain_decodes and _lists(s) == _lists(general_inputs(batch, pieces))
