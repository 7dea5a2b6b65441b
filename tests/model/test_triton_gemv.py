"""The Triton GEMV (models/triton_gemv.py) against a float64 reference, and a model decoding on it.

Runs on the test device: compiled on a GPU (--device cuda), in Triton's CPU interpreter otherwise
(there INFLIGHT_TRITON_GEMV=1 puts CPU tensors on it). Small shapes whose N and K are not multiples
of the blocks (the interpreter is slow); the 8B shapes are benchmarks/triton_gemv_bench.py's.

Tolerance: float32 sums rounded once, so each output is within half an ulp of the dtype of the
float64 result, plus float32's accumulation error (K * 2^-24 * sum |x w|); and it is within one ulp
of torch's F.linear (the same rounding of a float32 sum taken in another order).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_hf_parity import _engine_run, _hf_run, _random_prompts, _vocab

from inflight.models import triton_gemv
from inflight.models.linear import GateUpLinear, PlainLinear, RowParallelLinear, silu_down
from inflight.models.parallel import TensorParallel
from inflight.models.triton_attention import interpreted
from inflight.models.triton_gemv import Config

DTYPES = [torch.bfloat16, torch.float16]
MANTISSA = {torch.bfloat16: 7, torch.float16: 10}


@pytest.fixture
def gemv_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The GEMV on for CPU tensors too (the interpreter's; on CUDA `1` turns it on)."""
    monkeypatch.setenv("INFLIGHT_TRITON_GEMV", "1")
    triton_gemv.reset()
    yield
    monkeypatch.undo()
    triton_gemv.reset()


def _ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The dtype's ulp at |v| (float64), floored at its smallest normal's."""
    _, exp = torch.frexp(v.abs().clamp_min(torch.finfo(dtype).tiny))
    return torch.ldexp(torch.ones_like(v), exp - 1 - MANTISSA[dtype])


def _check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """got (on any device) against the float64 result and torch's F.linear on CPU."""
    got = got.cpu()
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    sum_abs = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    bound = 0.5 * _ulp(torch.maximum(ref.abs(), got.double().abs()), x.dtype) + 2 * x.shape[-1] * 2.0**-24 * sum_abs
    assert got.dtype == x.dtype and got.shape == ref.shape
    assert ((got.double() - ref).abs() <= bound).all(), float(((got.double() - ref).abs() / bound).max())
    torch_out = F.linear(x, w, b).double()
    assert ((got.double() - torch_out).abs() <= _ulp(torch_out, x.dtype)).all()


def _inputs(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    return x, w, (torch.randn(n, generator=gen).to(dtype) if bias else None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_default_tiling_matches_float64(m: int, bias: bool, dtype: torch.dtype, test_device: str, gemv_on: None) -> None:
    """The tiling `choose` picks (FMA for one row, tensor cores for more); N = 50 and K = 200 end
    mid-block; the output poisoned with NaN, written into a wider buffer: every element written,
    nothing past N."""
    x, w, b = _inputs(m, 50, 200, dtype, bias, seed=m)
    dev = torch.device(test_device)
    buf = torch.full((m, 64), float("nan"), dtype=dtype, device=dev)
    out = buf[:, :50]
    xd, wd, bd = x.to(dev), w.to(dev), None if b is None else b.to(dev)
    assert triton_gemv.use(xd, wd, bd)
    assert triton_gemv.linear(xd, wd, bd, out=out) is out
    _check(out, x, w, b)
    assert buf[:, 50:].isnan().all()
    _check(triton_gemv.linear(xd[None], wd, bd)[0], x, w, b)  # a leading batch dim: (1, m, K)


# (m, N, K, tiling): split-K with an empty last slice (K = 256 in 3 slices of 2 x 64), K not a
# multiple of the tile with and without splits, wider row blocks, one stage
TILINGS = [
    (1, 40, 256, Config(block_n=16, block_k=64, split_k=3)),
    (1, 50, 600, Config(block_n=8, block_k=128, split_k=2)),
    (1, 33, 72, Config(block_n=32, block_k=64, num_warps=8)),
    (3, 40, 256, Config(block_n=16, block_k=64, split_k=3, dot=True)),
    (8, 50, 600, Config(block_n=32, block_k=128, split_k=2, dot=True, num_stages=1)),
    (2, 20, 72, Config(block_n=16, block_k=32, dot=True)),
]


@pytest.mark.parametrize("case", range(len(TILINGS)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tilings_match_float64(case: int, dtype: torch.dtype, test_device: str, gemv_on: None) -> None:
    m, n, k, cfg = TILINGS[case]
    x, w, b = _inputs(m, n, k, dtype, bias=case % 2 == 0, seed=10 + case)
    dev = torch.device(test_device)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
    triton_gemv.linear(x.to(dev), w.to(dev), None if b is None else b.to(dev), config=cfg, out=out)
    _check(out, x, w, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", [None, Config(block_n=16, block_k=64, split_k=2, dot=True)], ids=["default", "split-dot"])
@pytest.mark.parametrize("m", [1, 3])
def test_silu_linear_rounds_as_silu_mul_then_linear(m: int, cfg: Config | None, dtype: torch.dtype, test_device: str,
                                                     gemv_on: None) -> None:  # fmt: skip
    """down(SiLU(gate) * up) from the (M, 2I) gate_up output: the product rounded as torch rounds
    F.silu(gate) * up, then within the GEMV's bound of that product's float64 GEMV."""
    inter, n = 136, 40
    gen = torch.Generator().manual_seed(m)
    gate_up = (2 * torch.randn(m, 2 * inter, generator=gen)).to(dtype)
    w = (torch.randn(n, inter, generator=gen) / inter**0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    gate, up = gate_up.split(inter, dim=-1)
    act = F.silu(gate) * up  # HF's MLP (two roundings)
    dev = torch.device(test_device)
    got = triton_gemv.silu_linear(gate_up.to(dev), w.to(dev), b.to(dev), config=cfg)
    _check(got, act, w, b)


def test_switch_default_off_and_cpu_untouched(test_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off unless INFLIGHT_TRITON_GEMV says so; CUDA tensors with auto or 1, CPU tensors only with 1
    under the interpreter; more than 8 rows, float32, a dtype mismatch: F.linear; a bad value refused."""
    dev = torch.device(test_device)
    x, w = torch.zeros(2, 16, dtype=torch.bfloat16, device=dev), torch.zeros(8, 16, dtype=torch.bfloat16, device=dev)
    try:
        for value, on in (("", False), ("0", False), ("auto", dev.type == "cuda"), ("1", dev.type == "cuda" or interpreted())):
            monkeypatch.setenv("INFLIGHT_TRITON_GEMV", value)
            triton_gemv.reset()
            assert triton_gemv.use(x, w) is on
            assert triton_gemv.use(x.cpu(), w.cpu()) is (value == "1" and interpreted())
            assert triton_gemv.summary() == ("GEMV: cuBLAS (INFLIGHT_TRITON_GEMV=0)" if value in ("", "0")
                                             else "GEMV (<= 8 rows): triton")  # fmt: skip
        assert triton_gemv.use(x, w)  # 1, on the test device: the rest falls back
        assert not triton_gemv.use(torch.zeros(9, 16, dtype=torch.bfloat16, device=dev), w)
        assert not triton_gemv.use(x.float(), w.float())
        assert not triton_gemv.use(x, w.half())
        assert not triton_gemv.use(x, w, torch.zeros(8, device=dev))  # a float32 bias
        assert not triton_gemv.use(x, w, silu=True)  # the fused down: its own switch, off by default
        monkeypatch.setenv("INFLIGHT_TRITON_GEMV_SILU", "1")
        triton_gemv.reset()
        assert triton_gemv.use(x, w, silu=True)
        assert triton_gemv.summary() == "GEMV (<= 8 rows): triton, down fused with SiLU * up"
        for name, value in (("INFLIGHT_TRITON_GEMV_SILU", "auto"), ("INFLIGHT_TRITON_GEMV", "yes")):
            monkeypatch.setenv(name, value)
            triton_gemv.reset()
            with pytest.raises(ValueError, match=name):
                triton_gemv.use(x, w)
    finally:
        monkeypatch.undo()
        triton_gemv.reset()


@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_silu_down_fuses_plain_layers_only(bias: bool, test_device: str, gemv_on: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """linear.silu_down (the MLP's forward): with INFLIGHT_TRITON_GEMV_SILU=1, down(SiLU(gate) * up) in
    one launch, within an ulp of the two layers run apart; None (the caller's two layers) for a
    wrapped method (LoRA's) or with the switch off."""
    hidden, inter = 48, 72
    dev = torch.device(test_device)
    gate_up = GateUpLinear(hidden, inter, bias=bias).to(torch.bfloat16)
    down = RowParallelLinear(inter, hidden, bias=bias, tp=TensorParallel.single()).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in (*gate_up.parameters(), *down.parameters()):
            p.copy_(torch.randn(p.shape, generator=gen) / 4)
    gate_up, down = gate_up.to(dev), down.to(dev)
    x = torch.randn(3, hidden, generator=gen).to(torch.bfloat16).to(dev)
    with torch.no_grad():
        assert silu_down(gate_up, down, x) is None  # INFLIGHT_TRITON_GEMV_SILU unset
        apart = down(gate_up(x)).cpu()
        monkeypatch.setenv("INFLIGHT_TRITON_GEMV_SILU", "1")
        triton_gemv.reset()
        fused = silu_down(gate_up, down, x)
        assert fused is not None
        assert ((fused.cpu().double() - apart.double()).abs() <= _ulp(apart.double(), torch.bfloat16)).all()

        class Wrapped(PlainLinear):  # a method that adds to the product (LoRA): the layers stay apart
            pass

        down.method = Wrapped()
        assert silu_down(gate_up, down, x) is None


@pytest.mark.parametrize("arch", ["qwen2"])
def test_model_on_the_gemv_gives_hf_greedy_tokens(
    arch: str, tiny_model_dir: Callable[..., Path], test_device: str, gemv_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float16 engine whose decode steps (3 rows, the MLP's down fused with SiLU * up; then 1 row,
    unfused; a GPU's graphs pad 3 to 4) run every linear layer on the GEMV (qwen2: qkv with a bias)
    against HF float16: the same greedy tokens, logprobs within float16's noise."""
    rows: list[int] = []
    fused: list[int] = []
    linear, silu_linear = triton_gemv.linear, triton_gemv.silu_linear

    def counted(x, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        rows.append(x.numel() // x.shape[-1])
        return linear(x, *args, **kwargs)

    def counted_silu(x, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        fused.append(x.numel() // x.shape[-1])
        return silu_linear(x, *args, **kwargs)

    monkeypatch.setattr(triton_gemv, "linear", counted)
    monkeypatch.setattr(triton_gemv, "silu_linear", counted_silu)
    choose = triton_gemv.choose  # wider row blocks: the interpreter's time goes by programs (tilings: above)
    monkeypatch.setattr(triton_gemv, "choose", lambda m, n, k, sms: replace(choose(m, n, k, sms), block_n=128))
    path = tiny_model_dir(arch)
    prompts = _random_prompts(_vocab(path))[:3]
    for batch, silu in ((prompts, "1"), (prompts[:1], "0")):  # decode steps of 3 rows (tensor cores), then of 1 (FMA)
        monkeypatch.setenv("INFLIGHT_TRITON_GEMV_SILU", silu)
        triton_gemv.reset()
        run = _engine_run(path, batch, dtype="float16", max_tokens=5, device=test_device, cpu_fast_path=False)
        hf = _hf_run(path, batch, dtype=torch.float16, max_tokens=5, device=test_device)
        for i, out in enumerate(run.outputs):
            o = out.outputs[0]
            assert o.token_ids == hf.tokens[i], f"{arch} prompt {i} diverged from HF"
            ours = torch.tensor([o.logprobs[s][t].logprob for s, t in enumerate(o.token_ids)], dtype=torch.float64)
            ref = hf.logprobs[i][torch.arange(5), torch.tensor(hf.tokens[i])].double()
            torch.testing.assert_close(ours, ref, atol=2e-2, rtol=0)
    assert 1 in rows and {3, 4} & set(rows), sorted(set(rows))
    assert fused and set(fused) <= {3, 4}, fused  # the fused down in the first run's decode steps only


_COMPILE = """
import inspect
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from inflight.models import triton_gemv_kernels as k

def compiled(fn, consts, dt, options):
    names = list(inspect.signature(fn.fn).parameters)
    sig = {p: "constexpr" if p in consts else "*fp32" if p == "P" else "*" + dt if p[0].isupper() else "i32" for p in names}
    # what a launch specialises on: 16-byte aligned pointers, sizes and strides multiples of 16
    attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in names if p not in consts and p != "size_m"}
    src = ASTSource(fn, sig, {(names.index(p),): v for p, v in consts.items()}, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm

for dt in ("bf16", "fp16"):
    for dot, silu, split, even in [(False, False, 1, True), (False, True, 2, False), (True, False, 1, True), (True, True, 2, False)]:
        consts = dict(BLOCK_M=16 if dot else 1, BLOCK_N=16 if dot else 8, BLOCK_K=256 if dot else 512, SPLIT_K=split,
                      EVEN_K=even, HAS_BIAS=True, DOT=dot, SILU=silu, EMULATE=False)
        asm = compiled(k.gemv, consts, dt, {"num_warps": 4, "num_stages": 4 if dot else 3})
        assert asm["cubin"]
        loop = asm["ptx"].split("Loop Header")[1]
        if dot:  # W's tiles streamed into shared memory ahead of the mma (Triton's pipeliner)
            assert "cp.async" in loop and "mma.sync" in loop, (dt, consts)
        else:  # W's rows read with 16-byte loads; without SiLU no barrier in the loop (x read in W's layout)
            assert "ld.global.v4" in loop and (silu or "bar.sync" not in loop.split("bra")[0]), (dt, consts)
    assert compiled(k.reduce, dict(SPLIT_K=3, BLOCK=1024, HAS_BIAS=True, EMULATE=False), dt, {"num_warps": 4})["cubin"]
print("compiled")
"""


def test_kernels_compile_for_an_h100(test_device: str) -> None:
    """Each variant (FMA / tensor cores, SiLU * up or not, split-K or not, each dtype) compiled for
    sm_90 to a cubin with Triton's own ptxas, no GPU needed, with the loads the design relies on.
    In a fresh process: the interpreter, once on, patches Triton's math."""
    if test_device.startswith("cuda"):
        pytest.skip("on a GPU the other tests run them compiled")
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(triton_gemv.__file__).parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
