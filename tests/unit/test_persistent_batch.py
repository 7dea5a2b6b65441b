"""The runner's persistent batch (worker/input_batch.py): rows kept per request and reused once freed,
block tables grown from the pieces' deltas (restarted after preemption), sampling columns equal
to what the per-step lists gave, and the per-request check that lets a step skip the processors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inflight.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from inflight.request_inputs import RequestInputs
from inflight.sample.processors import build_processors, uses_processors
from inflight.sampling_params import SamplingParams
from inflight.worker.input_batch import InputBatch

CPU = torch.device("cpu")


def _new(rid: str, params: SamplingParams, prompt: list[int] | None = None) -> NewRequestData:
    return NewRequestData(rid, RequestInputs(prompt or [1, 2, 3, 4, 5], params))


def _piece(rid: str, computed: int, n: int, blocks: list[int], at: int) -> ScheduledRequest:
    return ScheduledRequest(rid, computed, n, samples=True, new_block_ids=blocks, new_blocks_from=at)


def test_rows_tables_and_reuse() -> None:
    batch = InputBatch(CPU, max_blocks=8, block_size=4, capacity=2)
    failed: dict[str, str] = {}
    new = [_new("a", SamplingParams()), _new("b", SamplingParams(), list(range(10, 19)))]
    batch.update(SchedulerOutput([_piece("a", 0, 5, [7, 3], 0), _piece("b", 0, 9, [1, 2, 6], 0)], 14, new_requests=new), failed)
    table, slots = batch.step_tables([_piece("a", 0, 5, [], 2), _piece("b", 0, 9, [], 3)], [batch["a"], batch["b"]])
    assert table.tolist() == [[7, 3, 0], [1, 2, 6]]  # width: b's 3 blocks
    assert slots.tolist() == [28, 29, 30, 31, 12] + [4, 5, 6, 7, 8, 9, 10, 11, 24]
    # a decode step: a's table grows by one block at index 2; b's by none
    batch.update(SchedulerOutput([_piece("a", 8, 1, [5], 2), _piece("b", 9, 1, [], 3)], 2), failed)
    table, slots = batch.step_tables([_piece("a", 8, 1, [], 3), _piece("b", 9, 1, [], 3)], [batch["a"], batch["b"]])
    assert table.tolist() == [[7, 3, 5], [1, 2, 6]] and slots.tolist() == [20, 25]
    # one decode alone (batch 1's own path): the same rows and slots as beside another piece, a copy
    for at in (7, 8, 11):  # the last slot of block 1, the first and last of block 2
        one, one_slot = batch.step_tables([_piece("a", at, 1, [], 3)], [batch["a"]])
        both, both_slots = batch.step_tables([_piece("a", at, 1, [], 3), _piece("b", 0, 1, [], 3)], [batch["a"], batch["b"]])
        assert one.tolist() == both[:1, : at // 4 + 1].tolist() and one_slot.tolist() == both_slots[:1].tolist()
        assert (one.dtype, one_slot.dtype) == (torch.int32, torch.int64)
        one[0, 0] = -1
        assert batch.block_table[batch["a"].row, 0] == 7
    # preempted and resumed: the table restarts from 0
    batch.update(SchedulerOutput([_piece("a", 0, 6, [9, 4], 0)], 6), failed)
    assert batch.block_table[batch["a"].row, :2].tolist() == [9, 4]
    # freed rows are reused; a third request doubles the columns
    row_b = batch["b"].row
    batch.update(SchedulerOutput([], 0, freed_ids=["b"], new_requests=[_new("c", SamplingParams()), _new("d", SamplingParams())]), failed)
    assert batch["c"].row == row_b and batch.capacity == 4 and batch["d"].row not in (batch["a"].row, row_b)
    assert not failed


def test_sampling_columns_give_what_the_lists_gave() -> None:
    batch = InputBatch(CPU, max_blocks=4)
    settings = [
        SamplingParams(),  # temperature 1
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9),
        SamplingParams(temperature=1e-9, min_p=0.1, typical_p=0.8, top_k=-1),
        SamplingParams(temperature=0.0),
    ]
    failed: dict[str, str] = {}
    batch.update(SchedulerOutput([], 0, new_requests=[_new(f"r{i}", p) for i, p in enumerate(settings)]), failed)
    reqs = [batch["r2"], batch["r0"], batch["r1"], batch["r1"]]  # any order; a request repeats for its draft rows
    got = batch.sampling_batch(reqs, {}, [None] * 4)
    # each row's own settings; temperature clamped to [1e-5, 1e5], top-k -1 = 0 (off)
    assert got.temperature.tolist() == pytest.approx([1e-5, 1.0, 0.7, 0.7])
    assert got.top_k is not None and got.top_k.dtype == torch.int64 and got.top_k.tolist() == [0, 0, 5, 5]
    assert got.top_p.tolist() == pytest.approx([1.0, 1.0, 0.9, 0.9])  # type: ignore[union-attr]
    assert got.min_p.tolist() == pytest.approx([0.1, 0.0, 0.0, 0.0])  # type: ignore[union-attr]
    assert got.typical_p.tolist() == pytest.approx([0.8, 1.0, 1.0, 1.0])  # type: ignore[union-attr]
    assert not got.all_greedy
    greedy = batch.sampling_batch([batch["r3"]], {}, [None])
    assert greedy.all_greedy and greedy.top_k is greedy.top_p is greedy.min_p is greedy.typical_p is None


class _History:
    def __init__(self, params: SamplingParams, bad: list[list[int]]) -> None:
        self.params, self.bad_words_ids = params, bad
        self.all_token_ids, self.eos_token_ids = [1, 2, 3, 2], (0,)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[2:]

    @property
    def num_output_tokens(self) -> int:
        return 2


CONTROLS = [
    {"allowed_token_ids": [1, 2]}, {"logit_bias": {3: 1.0}}, {"embedding_bias": [0.5] * 8}, {"repetition_penalty": 1.2},
    {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}, {"no_repeat_ngram_size": 1}, {"min_tokens": 5},
    {"watermark": True},
]  # fmt: skip


@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: next(iter(c)))
def test_a_step_skips_processors_only_when_no_row_has_any(control: dict) -> None:
    params = SamplingParams(**control)
    assert uses_processors(params, []) and build_processors([_History(params, [])], CPU, 8)


def test_plain_and_bad_words_rows() -> None:
    assert not uses_processors(SamplingParams(), []) and build_processors([_History(SamplingParams(), [])], CPU, 8) == []
    assert uses_processors(SamplingParams(), [[5]]) and build_processors([_History(SamplingParams(), [[5]])], CPU, 8)
    assert np.array_equal(InputBatch(CPU, 2).sampling[0], np.array([0.0, 0.0, 1.0, 0.0, 1.0], np.float32))
