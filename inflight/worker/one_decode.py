"""The step of a lone greedy stream: one decode row in one C call, and as little Python as can be.

At batch 1 on CPU the step's host work runs right after the decode kernel's C call has streamed
the weights (525 MB a step for the Qwen2.5-0.5B-shaped Q8_0 file) through every cache, so each
line of Python, each numpy, torch and ctypes call, runs cache-cold: the same host work took 0.14
ms a step beside the tiny demo model's C step and 0.66 ms after a 512 MB read (Zen 4 VM,
benchmarks/engine_overhead.py). What costs there is what a step touches, not what it computes:
`decode_one` runs such a step (the runner's `_run` would build its lists, the StepBatch, the
tables' arrays and tensors, the sampler's batch) with Python ints, the kernel's own buffers and
one ctypes call, bit for bit what `_run` gives (the same C call with the same arguments).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from inflight.models.cpu_kernel import MAX_ROWS, DecodeKernel
from inflight.outputs import ModelRunnerOutput, SampledToken, ScheduledRequest
from inflight.sample.sampler import GreedyRows

ModelRunner = Any  # worker/model_runner.py's, which imports this module
F = TypeVar("F", bound=Callable[..., Any])


def inference_mode(fn: F) -> F:
    """`@torch.inference_mode()` with its guard alone: the decorator's Python (a context object,
    its clone, __init__, __enter__) cost 15-30 us of a batch-1 step, cache-cold (Zen 4)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C._InferenceMode(True):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


class OneDecode:
    """`DecodeKernel.forward(..., head=greedy)` of one row, for a caller that reads only the
    GreedyRows: the kernel's argument rows written through flat views (no numpy op), its
    hidden row and logits in buffers of its own (overwritten by the next call; nobody reads
    them), the block table passed as the address of the persistent batch's int64 row."""

    def __init__(self, kernel: DecodeKernel) -> None:
        self.kernel = kernel
        k = kernel
        self.args = memoryview(k.args).cast("B").cast("q")  # (3, MAX_ROWS) flat: ids, positions, slots
        self.argmax = memoryview(k.argmax).cast("B").cast("q")
        self.logprob = memoryview(k.logprob).cast("B").cast("d")
        self.globals = memoryview(k.global_ptrs_np).cast("B").cast("q")
        self.embedded = 0 if k.embedded is None else k.embedded.data_ptr()
        self.hidden = torch.empty(1, k.hidden, dtype=k.dtype)
        self.logits = torch.empty(1, k.vocab, dtype=torch.float32)
        p = k.args_ptr
        self.ptrs = (p, p + MAX_ROWS * 8, p + 2 * MAX_ROWS * 8, self.hidden.data_ptr(), self.logits.data_ptr())

    def takes(self) -> bool:
        """Whether this C call is `forward`'s for the kernel as it is now: its lm_head in C, the
        embedding rows its own or dequantized in C, no aux layers, its quantized products on."""
        k = self.kernel
        return k.lm_head is not None and not k.aux_layers and (k.embed_rows is None or k.embed_q is not None) and k.accepts(1)

    def __call__(self, token: int, pos: int, slot: int, table: int, width: int, greedy: GreedyRows) -> None:
        """Run the row (`table`: the address of its `width` int64 block ids); fills in `greedy`."""
        k, args = self.kernel, self.args
        args[0], args[MAX_ROWS], args[2 * MAX_ROWS] = token, pos, slot
        if k.embed_q is not None:  # the row dequantized in C into the kernel's own rows, as forward
            if k.embed_q(k.args_ptr, 1, self.embedded) != 0:
                raise ValueError(f"decode kernel: token ids {[token]} outside the embedding")
            self.globals[0] = self.embedded
            args[0] = 0
        ids, positions, slots, hidden, logits = self.ptrs
        want = greedy.want_logprobs
        k.fused, k.aux_hidden = None, None
        rc = k.lib.ifl_decode_step(
            *k.step_ptrs, 1, ids, positions, slots, table, width, hidden, 0, 0, 0, k.lm_head, logits, k.argmax_ptr,
            k.logprob_ptr if want else 0, torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"decode kernel failed ({rc})")
        greedy.token_ids = [self.argmax[0]]
        greedy.logprobs = [self.logprob[0]] if want else None


def decode_one(runner: ModelRunner, sr: ScheduledRequest, result: ModelRunnerOutput) -> bool:
    """Run `sr`, the step's only piece, if it is one plain greedy decode the kernel takes whole:
    what `_run` does for it (the step's tables, the kernel's forward with its lm_head, the
    sampler's taken row, append_sampled) in one C call. False: not such a step, `_run` runs it."""
    kernel = runner.decode_kernel
    if sr.num_tokens != 1 or not sr.samples or sr.num_draft_tokens or sr.lora_slot >= 0 or kernel is None:
        return False
    req = runner.batch[sr.request_id]
    if not (req.one_call and runner.driver and runner.draft is None and runner.graphs is None) or runner.vision is not None:
        return False
    one = runner.one_decode
    if one is None or one.kernel is not kernel:
        one = runner.one_decode = OneDecode(kernel)
    if not one.takes():
        return False
    pos = sr.num_computed_tokens
    table, width, slot = runner.batch.decode_row(req, pos)
    taken = GreedyRows(req.inputs.chosen_logprobs)
    req.draft_q = None  # as verify_rows: a step consumes the q of drafts it does not verify
    one(req.all_token_ids[pos], pos, slot, table, width, taken)
    token = taken.token_ids[0]  # type: ignore[index]
    result.sampled[sr.request_id] = [SampledToken(token, math.nan if taken.logprobs is None else taken.logprobs[0])]
    req.all_token_ids.append(token)  # as append_sampled
    return True
