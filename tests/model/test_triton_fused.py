"""The fused elementwise Triton kernels (models/triton_fused.py) against the torch ops they replace,
and a model run on them against Hugging Face.

Runs on the test device: compiled on a GPU (--device cuda), in Triton's CPU interpreter otherwise
(there INFLIGHT_TRITON_FUSED=1 puts CPU tensors on them). The kernels round where HF's modules
round, so bf16 / fp16 results equal torch's bit for bit but for the order of a norm's sum.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_hf_parity import _engine_run, _hf_run, _random_prompts, _vocab

from inflight.models import triton_fused
from inflight.models.layers import RMSNorm, RopePositions, RotaryEmbedding
from inflight.models.triton_attention import interpreted

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 37]


@pytest.fixture
def fused_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fused kernels on for CPU tensors too (the interpreter's; CUDA has them on anyway)."""
    monkeypatch.setenv("INFLIGHT_TRITON_FUSED", "1")
    triton_fused.reset()
    yield
    monkeypatch.undo()
    triton_fused.reset()


def _close(got: torch.Tensor, ref: torch.Tensor, exact: bool) -> None:
    """Bit-equal where nothing is summed; else within an ulp of the dtype (the sum's order moves
    rstd's last bit: bf16 rounds that away almost always, float32 keeps it)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if exact:
        assert torch.equal(got, ref)
        return
    tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[ref.dtype]
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)
    if ref.dtype != torch.float32:  # rstd off by an ulp flips a 16-bit rounding now and then, rarely
        assert (got != ref).float().mean() < 0.02


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm_matches_torch(rows: int, dtype: torch.dtype, test_device: str, fused_on: None) -> None:
    gen = torch.Generator().manual_seed(rows)
    hidden = 200  # not a power of 2: a masked tail
    x, r = (torch.randn(rows, hidden, generator=gen).to(dtype) for _ in range(2))
    norm = RMSNorm(hidden, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=gen))
    s_ref = x + r
    ref = norm.weight * F.rms_norm(s_ref, (hidden,), None, 1e-5)  # the torch path (== HF's)
    dev = torch.device(test_device)
    norm_d = norm.to(dev)
    assert triton_fused.use(x.to(dev))
    s, out = norm_d.add_forward(x.to(dev), r.to(dev))
    _close(s.cpu(), s_ref, exact=True)  # the residual stream: one rounding of an exact sum
    _close(out.cpu(), ref, exact=False)
    _close(norm_d(s_ref.to(dev)).cpu(), ref, exact=False)  # plain RMSNorm
    # a strided input (a (T, H, hd) head view, as Qwen3's q_norm gets) normalises each row
    heads = x.view(rows, 8, 25)[:, ::2]
    small = RMSNorm(25, 1e-6).to(dtype).to(dev)
    _close(small(heads.to(dev)).cpu(), small.weight.cpu() * F.rms_norm(heads, (25,), None, 1e-6), exact=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_mul_matches_torch(rows: int, dtype: torch.dtype, test_device: str, fused_on: None) -> None:
    gen = torch.Generator().manual_seed(rows)
    inter = 300  # not a multiple of the kernel's column block
    y = (3 * torch.randn(rows, 2 * inter, generator=gen)).to(dtype)
    gate, up = y.split(inter, dim=-1)
    ref = F.silu(gate) * up
    got = triton_fused.silu_mul(y.to(test_device), inter).cpu()
    # torch's SiLU and Triton's exp may differ in float32's last bit; rounding to bf16 / fp16 hides it
    _close(got, ref, exact=dtype != torch.float32)


def _rotary(head_dim: int, partial: float) -> RotaryEmbedding:
    """Llama-3 scaling on the whole head; YaRN (its attention factor scales the table) on half of it."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32}  # fmt: skip
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    hf = {"rope_theta": 500000.0, "partial_rotary_factor": partial, "max_position_embeddings": 128,
          "rope_scaling": llama3 if partial == 1.0 else yarn}  # fmt: skip
    return RotaryEmbedding(hf, head_dim, 128)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["rope", "qk_norm+rope"])
@pytest.mark.parametrize("partial", [1.0, 0.5], ids=["full", "rot_dim<head_dim"])
def test_rope_in_place_matches_torch(
    partial: float, qk_norm: bool, rows: int, dtype: torch.dtype, test_device: str, fused_on: None
) -> None:
    """q and k rotated in place inside the qkv GEMM's output (Llama-3 / YaRN tables), GQA 6 / 2
    heads of 24 dims; Qwen3's per-head q / k RMSNorm fused in front."""
    gen = torch.Generator().manual_seed(rows + int(qk_norm))
    h, kv, hd = 6, 2, 24
    rotary = _rotary(hd, partial)
    qkv = torch.randn(rows, (h + 2 * kv) * hd, generator=gen).to(dtype)
    positions = torch.randint(0, 128, (rows,), generator=gen)
    norms = None
    if qk_norm:
        norms = (RMSNorm(hd, 1e-6).to(dtype), RMSNorm(hd, 1e-6).to(dtype))
        with torch.no_grad():
            for n in norms:
                n.weight.copy_(1 + 0.3 * torch.randn(hd, generator=gen))
    qk = qkv[:, : (h + kv) * hd].view(rows, h + kv, hd)
    # the torch path: a (cos, sin) tuple, as lookup gives where the fused kernels are off
    cos_sin = rotary.cos[positions].unsqueeze(1).to(dtype), rotary.sin[positions].unsqueeze(1).to(dtype)
    q_ref, k_ref = qk[:, :h], qk[:, h:]
    if norms is not None:  # Qwen3's q_norm / k_norm, torch's ops (HF's roundings)
        q_ref, k_ref = (n.weight * F.rms_norm(part, (hd,), None, n.eps) for n, part in zip(norms, (q_ref, k_ref)))
    q_ref, k_ref = rotary.apply(cos_sin, q_ref), rotary.apply(cos_sin, k_ref)

    dev = torch.device(test_device)
    rotary_d, qkv_d = rotary.to(dev), qkv.clone().to(dev)
    rope = rotary_d.lookup(positions.to(dev), dtype)
    assert isinstance(rope, RopePositions)
    norms_d = None if norms is None else (norms[0].to(dev), norms[1].to(dev))
    qk_d = qkv_d[:, : (h + kv) * hd].view(rows, h + kv, hd)
    q, k = rotary_d.apply_qk(rope, qk_d, h, norms_d)
    assert q.data_ptr() == qkv_d.data_ptr()  # in place: q and k are views of the GEMM output
    _close(q.cpu(), q_ref, exact=not qk_norm)
    _close(k.cpu(), k_ref, exact=not qk_norm)
    assert torch.equal(qkv_d[:, (h + kv) * hd :].cpu(), qkv[:, (h + kv) * hd :])  # v untouched


def test_rope_reads_tables_kept_in_the_model_dtype(test_device: str, fused_on: None) -> None:
    """A table converted with its module (`.to(bfloat16)`, as a bare module.to does) rounds the same."""
    gen = torch.Generator().manual_seed(3)
    rotary = _rotary(32, 1.0).to(torch.bfloat16)
    qk = torch.randn(5, 3, 32, generator=gen).to(torch.bfloat16)
    positions = torch.tensor([0, 7, 64, 100, 127])
    ref = rotary.apply((rotary.cos[positions].unsqueeze(1), rotary.sin[positions].unsqueeze(1)), qk)
    dev = torch.device(test_device)
    rotary_d = rotary.to(dev)
    got = triton_fused.rope_(qk.clone().to(dev), positions.to(dev), rotary_d.cos, rotary_d.sin)
    assert torch.equal(got.cpu(), ref)


def test_switch_off_and_cpu_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """INFLIGHT_TRITON_FUSED=0 turns them off everywhere; CPU tensors never get them by default;
    a bad value is refused by name (at load on CUDA: the log line reads it)."""
    try:
        for value, on_cpu in (("0", False), ("auto", False), ("1", interpreted())):
            monkeypatch.setenv("INFLIGHT_TRITON_FUSED", value)
            triton_fused.reset()
            assert triton_fused.use(torch.zeros(1)) is on_cpu  # with 1: only under the interpreter
            assert triton_fused.summary() == ("fused elementwise: off (INFLIGHT_TRITON_FUSED=0)" if value == "0"
                                              else "fused elementwise: triton")  # the CUDA load log's note
        monkeypatch.setenv("INFLIGHT_TRITON_FUSED", "yes")
        triton_fused.reset()
        with pytest.raises(ValueError, match="INFLIGHT_TRITON_FUSED"):
            triton_fused.use(torch.zeros(1))
    finally:
        monkeypatch.undo()
        triton_fused.reset()


@pytest.mark.parametrize("arch", ["llama3", "qwen3"])
def test_model_on_fused_kernels_gives_hf_greedy_tokens(
    arch: str, tiny_model_dir: Callable[..., Path], test_device: str, fused_on: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """float32 engine on the fused kernels (Qwen3: q/k norm + RoPE in one) vs HF: tokens and
    logprobs, over mixed prefill + decode steps."""
    calls = dict.fromkeys(("rms_norm", "silu_mul", "rope_"), 0)

    def counting(name: str) -> Callable:
        fn = getattr(triton_fused, name)

        def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    for name in calls:
        monkeypatch.setattr(triton_fused, name, counting(name))
    path = tiny_model_dir(arch)
    prompts = _random_prompts(_vocab(path))[:3]  # 3, 7 and 17 tokens: the interpreter is slow
    # cpu_fast_path off: the CPU's C decode kernel and oneDNN's fused SiLU GEMM would bypass them
    run = _engine_run(path, prompts, max_tokens=5, device=test_device, cpu_fast_path=False)
    hf = _hf_run(path, prompts, max_tokens=5, device=test_device)
    for i, out in enumerate(run.outputs):
        o = out.outputs[0]
        assert o.token_ids == hf.tokens[i], f"{arch} prompt {i} diverged from HF"
        ours = torch.tensor([o.logprobs[s][t].logprob for s, t in enumerate(o.token_ids)], dtype=torch.float64)
        ref = hf.logprobs[i][torch.arange(5), torch.tensor(hf.tokens[i])].double()
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)
    assert min(calls.values()) > 0, calls  # every layer's norms, SiLU * up and RoPE ran fused


_COMPILE = """
import inspect
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from inflight.models import triton_fused_kernels as k

for dt in ("bf16", "fp16", "fp32"):
    for fn, consts in [(k.rms_norm, dict(HAS_RES=True, BLOCK=4096)), (k.rms_norm, dict(HAS_RES=False, BLOCK=128)),
                       (k.silu_mul, dict(BLOCK=1024)),
                       (k.rope, dict(HEAD_DIM=128, HD_PAD=128, ROT=128, BLOCK_H=16, HAS_NORM=False)),
                       (k.rope, dict(HEAD_DIM=80, HD_PAD=128, ROT=40, BLOCK_H=8, HAS_NORM=True))]:
        consts["EMULATE"] = False
        names = list(inspect.signature(fn.fn).parameters)
        types = {"COS": "*fp32", "SIN": "*fp32", "POS": "*i64", "eps": "fp32"}
        sig = {p: "constexpr" if p in consts else types.get(p, "*" + dt if p[0].isupper() else "i32") for p in names}
        src = ASTSource(fn, sig, {(names.index(p),): v for p, v in consts.items()})
        fusion = fn is not k.rope  # rope_ launches with enable_fp_fusion=False (triton_fused.py)
        asm = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": fusion}).asm
        assert asm["cubin"]
        if fn is k.rope:  # each product and the sum rounded (mul.rn, add.rn), as HF's ops round them
            assert "fma." not in asm["ptx"], (dt, consts)
print("compiled")
"""


def test_kernels_compile_for_an_h100(test_device: str) -> None:
    """The interpreter accepts more than Triton's compiler: every kernel (each dtype, with and without
    the residual / the q/k norm, a partial rot_dim) compiled for sm_90 down to a cubin with Triton's
    own ptxas, no GPU needed. In a fresh process: the interpreter, once on, patches Triton's math."""
    if test_device.startswith("cuda"):
        pytest.skip("on a GPU the other tests run them compiled")
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(triton_fused.__file__).parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
