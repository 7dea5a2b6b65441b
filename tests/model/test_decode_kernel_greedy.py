"""The greedy token the decode kernel takes beside its logits (decode_kernel.c ifl_logits's argmax
and logprob): torch's argmax and log-softmax of the same logits, in every flavour; and a plain
greedy generation through it gives the tokens and cumulative logprob of the sampler's torch path.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from inflight import LLM, SamplingParams, platform
from inflight.models import cpu_kernel
from inflight.sample.sampler import GreedyRows
from inflight.testing.gguf import hf_to_gguf

CASES = ["random", "ties", "max_in_tail", "nan", "all_-inf", "inf", "signed_zeros", "wide"]


def _logits(case: str, m: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(repr((case, m, n)).encode()))
    x = torch.randn(m, n, generator=g) * 4
    if case == "ties":  # the first maximum wins, inside a thread's slice and across slices
        x = torch.randint(0, 3, (m, n), generator=g).float()
    elif case == "max_in_tail":
        x[:, -1] = x.max() + 1
    elif case == "nan":  # torch's argmax takes the first NaN; the logprob is NaN
        x[0, n // 2 + 1] = x[0, n - 2] = float("nan")
    elif case == "all_-inf":
        x[:] = float("-inf")
    elif case == "inf":
        x[0, n // 3] = float("inf")
    elif case == "signed_zeros":
        x = -x.abs()
        x[:, n // 3] = -0.0
        x[:, n // 2] = 0.0
    elif case == "wide":  # logits 100 apart: e^(x - max) underflows for most of the row
        x = x * 25
    return x


def _kernel_greedy(flavour: str, logits: torch.Tensor, threads: int, logprobs: bool) -> tuple[list[int], list[float] | None]:
    """ifl_logits of a float32 lm_head built so that its logits are `logits`: hidden row m is the
    unit vector e_m, weight column m row m's logits (exact products)."""
    lib = cpu_kernel.load_library(cpu_kernel.Variant(flavour, torch.float32, torch.float32))
    m, n = logits.shape
    k = 16
    weight = torch.zeros(n, k)
    weight[:, :m] = logits.T
    hidden = torch.eye(m, k)
    out = torch.empty(m, n)
    argmax = torch.empty(m, dtype=torch.int64)
    lp = torch.empty(m, dtype=torch.float64) if logprobs else None
    rc = lib.ifl_logits(weight.data_ptr(), hidden.data_ptr(), m, n, k, out.data_ptr(), argmax.data_ptr(),
                        0 if lp is None else lp.data_ptr(), threads)  # fmt: skip
    assert rc == 0
    assert torch.equal(out.nan_to_num(), logits.nan_to_num())  # the construction holds
    return argmax.tolist(), None if lp is None else lp.tolist()


@pytest.mark.parametrize("flavour", list(platform.KERNEL_FLAVOURS))
@pytest.mark.parametrize("case", CASES)
def test_kernel_argmax_and_logprob_are_torchs(flavour: str, case: str) -> None:
    if not platform.current().can_run(flavour):
        pytest.skip(f"{flavour} does not run here")
    for m, n, threads in [(1, 151936, 2), (3, 1003, 3), (1, 5, 4), (2, 130, 1)]:
        if case in ("nan", "inf", "all_-inf") and m > 1:
            continue  # a non-finite logit times the other rows' 0 is NaN in them
        x = _logits(case, m, n)
        tokens, lps = _kernel_greedy(flavour, x, threads, logprobs=True)
        assert tokens == x.argmax(-1).tolist(), (m, n, threads)
        ref = torch.log_softmax(x.double(), -1).gather(1, x.argmax(-1, keepdim=True))[:, 0].tolist()
        assert lps is not None
        for got, want in zip(lps, ref):
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-6), (m, n, threads)
        assert _kernel_greedy(flavour, x, threads, logprobs=False) == (tokens, None)


@pytest.fixture(scope="module")
def q8_file(tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_to_gguf(tiny_model_dir("qwen2"), tmp_path_factory.mktemp("q8") / "model.gguf", "q8_0")


@pytest.mark.parametrize("model", ["float32", "q8_0"])
def test_plain_greedy_takes_the_kernels_token_and_logprob(model: str, q8_file: Path, tiny_model_dir: Callable[..., Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Greedy with nothing else asked: the kernel takes each token and its logprob (its lm_head
    float32 or q8_0); asking for logprobs sends the same logits through the sampler's torch ops:
    the same tokens, and their logprobs sum to the plain run's cumulative_logprob."""
    path = q8_file if model == "q8_0" else tiny_model_dir("qwen2")
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False)
    assert llm.engine.runner.decode_kernel is not None
    taken: list[GreedyRows | None] = []
    logits = cpu_kernel.DecodeKernel.logits

    def spy(self: cpu_kernel.DecodeKernel, hidden: torch.Tensor, greedy: GreedyRows | None = None) -> Any:
        out = logits(self, hidden, greedy)
        taken.append(greedy)
        return out

    monkeypatch.setattr(cpu_kernel.DecodeKernel, "logits", spy)
    prompts = [{"prompt_token_ids": list(range(7, 7 + n))} for n in (3, 11)]
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    fast = [llm.generate([p], plain, use_tqdm=False)[0].outputs[0] for p in prompts]  # batch 1: the kernel's steps
    assert taken and all(t is not None and t.token_ids is not None and t.logprobs is not None for t in taken)
    taken.clear()
    asked = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    slow = [llm.generate([p], asked, use_tqdm=False)[0].outputs[0] for p in prompts]
    assert taken and all(t is None for t in taken)
    for f, s in zip(fast, slow):
        assert f.token_ids == s.token_ids
        assert s.logprobs is not None and f.cumulative_logprob is not None
        assert f.cumulative_logprob == pytest.approx(sum(lp[t].logprob for lp, t in zip(s.logprobs, s.token_ids)), abs=1e-4)
    taken.clear()  # the servers' requests read no logprob: the kernel takes the tokens alone
    engine = llm.engine
    for p, f in zip(prompts, fast):
        engine.add_request(engine.make_request(p, plain, cumulative_logprob=False))
        outs = [o for _ in range(40) if engine.has_unfinished_requests() for o in engine.step()]
        assert outs[-1].outputs[0].token_ids == f.token_ids and outs[-1].outputs[0].cumulative_logprob is None
    assert taken and all(t is not None and t.token_ids is not None and t.logprobs is None for t in taken)
    kernel = llm.engine.runner.decode_kernel
    if model == "q8_0":  # the embedding rows dequantized by the kernel itself, as QuantEmbedding's would be
        assert kernel.embed_q is not None
        kernel.embed_q = None
        again = [llm.generate([p], plain, use_tqdm=False)[0].outputs[0] for p in prompts]
        assert [(o.token_ids, o.cumulative_logprob) for o in again] == [(o.token_ids, o.cumulative_logprob) for o in fast]
    llm.engine.kv.pool.check_idle()


@pytest.mark.parametrize("model", ["float32", "q8_0"])
def test_lm_head_in_the_step_equals_its_own_call(model: str, q8_file: Path, tiny_model_dir: Callable[..., Path]) -> None:
    """forward(head=...) runs the lm_head in the step's C call: the same hidden states, logits
    and greedy rows bit for bit as logits() called after it (1 and 3 rows), in every flavour."""
    path = q8_file if model == "q8_0" else tiny_model_dir("qwen2")
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, block_size=16, progress=False)
    runner = llm.engine.runner
    assert runner.decode_kernel is not None
    weights = torch.float32 if runner.decode_kernel.quant else runner.decode_kernel.weight_dtype
    for flavour in [f for f in platform.KERNEL_FLAVOURS if platform.current().can_run(f)]:
        lib = cpu_kernel.load_library(cpu_kernel.Variant(flavour, torch.float32, weights))
        kernel = cpu_kernel.DecodeKernel.build(runner.model, runner.kv_caches, 16, lib=lib)
        assert kernel is not None
        _fused_equals_apart(kernel)


def _fused_equals_apart(kernel: cpu_kernel.DecodeKernel) -> None:
    for m in (1, 3):
        ids, positions = [11, 12, 13][:m], [20, 21, 22][:m]
        table = torch.tensor([[1, 2]] * m, dtype=torch.int32)
        slots = torch.tensor([2 * 16 + p - 16 for p in positions])  # block 2 holds positions 16..31
        apart = GreedyRows(want_logprobs=True)
        hidden = kernel.forward(ids, positions, slots, table)
        logits = kernel.logits(hidden, apart)
        fused = GreedyRows(want_logprobs=True)
        hidden2 = kernel.forward(ids, positions, slots, table, fused)
        assert fused.token_ids is not None  # filled in by forward
        assert torch.equal(hidden2, hidden) and torch.equal(kernel.logits(hidden2, fused), logits)
        assert (fused.token_ids, fused.logprobs) == (apart.token_ids, apart.logprobs)
        assert apart.token_ids == logits.argmax(-1).tolist()
        plain = kernel.forward(ids, positions, slots, table, True)  # logits alone
        assert torch.equal(kernel.logits(plain), logits)
