"""inflight/quant/kernels.py: every qtype x instruction-set path against `dequantize(w) @ x`.

The kernels round activations to int8 per block of 32 (llama.cpp's Q8_0 activations), so the
exact anchor is dequantize(w) @ q8(x), with q8 written here once (amax / 127, round to nearest):
equal up to float32 summation order (relative 1e-4 of sum |w| |x|). Against the float product
itself the error is the activation rounding's: < 2 % of |y| in norm (0.3-0.6 % measured).
Weights are built directly: gguf.quants.quantize for q8_0 / q4_0 / q4_1 / q5_0 / q5_1, random valid blocks for the
K-quants (random bits with finite float16 scales) and i4g / i8c.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from inflight import platform
from inflight.models.cpu_kernel import KernelUnavailable
from inflight.models.linear import GateUpLinear, Linear
from inflight.quant import kernels
from inflight.quant.linear import QuantLinear
from inflight.quant.weight import QTYPES, QuantWeight, dequantize, regroup, ungroup

FLAVOURS = tuple(platform.QUANT_FLAVOURS)
# (qtype, K at the block minimum, a larger K)
CASES = [("q8_0", 32, 320), ("q4_0", 32, 320), ("q4_1", 32, 96), ("q5_0", 32, 96), ("q5_1", 32, 96), ("q4_k", 256, 512), ("q5_k", 256, 512), ("q6_k", 256, 512),
         ("i4g", 32, 384), ("i8c", 32, 96), ("q5_0g", 128, 896), ("q4_0g", 128, 384)]  # fmt: skip
_HALF_SCALES = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}  # byte offsets of each block's f16 scales


def make_weight(qtype: str, n: int, k: int, gen: torch.Generator, **kw: object) -> QuantWeight:
    if qtype in ("q5_0g", "q4_0g"):  # regrouped per 4 blocks, as quant/linear.py does at load on AVX-512 VNNI
        return regroup(make_weight(qtype[:-1], n, k, gen))
    if qtype in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        import gguf

        w = torch.randn(n, k, generator=gen).numpy()
        data = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, qtype.upper()))
        return QuantWeight(qtype, (n, k), torch.from_numpy(np.ascontiguousarray(data)))
    if qtype in _HALF_SCALES:
        elems, nbytes = QTYPES[qtype]
        blocks = torch.randint(0, 256, (n, k // elems, nbytes), generator=gen, dtype=torch.uint8)
        for off in _HALF_SCALES[qtype]:  # finite scales of a realistic size
            half = (torch.rand(n, k // elems, generator=gen) * 0.02 + 0.001).half()
            blocks[:, :, off : off + 2] = half.view(torch.uint8).view(n, k // elems, 2)
        return QuantWeight(qtype, (n, k), blocks.reshape(n, -1).contiguous())
    if qtype == "i4g":
        g = int(kw.get("group", 32))  # type: ignore[call-overload]
        data = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
        scales = (torch.randn(n, k // g, generator=gen) * 0.02).half()
        zeros = None if kw.get("symmetric") else torch.randint(0, 16, (n, k // g), generator=gen, dtype=torch.uint8)
        perm = torch.randperm(k, generator=gen).to(torch.int32) if kw.get("perm") else None
        return QuantWeight(qtype, (n, k), data, scales, zeros, group_size=g, perm=perm)
    assert qtype == "i8c"
    data = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(1 if kw.get("per_tensor") else n, generator=gen) * 0.01 + 1e-3
    return QuantWeight(qtype, (n, k), data, scales.float(), act_int8=bool(kw.get("act_int8")))


def q8(x: torch.Tensor) -> torch.Tensor:
    """Activations as the kernels round them: per 32 elements, scale max|x| / 127."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // 32, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(blocks * inv) * d).reshape(m, k)


def check(qw: QuantWeight, x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    w = dequantize(qw)
    if qw.perm is not None:  # dequantize puts columns back in input order; the kernel permutes x
        xp = x.float().index_select(1, qw.perm.long())
        exact = q8(xp) @ dequantize(QuantWeight(qw.qtype, qw.shape, qw.data, qw.scales, qw.zeros, qw.group_size)).T
        scale = q8(xp).abs() @ w.abs()[:, qw.perm.long()].T
    else:
        exact = q8(x) @ w.T
        scale = q8(x).abs() @ w.abs().T
    if bias is not None:
        exact = exact + bias
    rtol = 2**-8 if y.dtype == torch.bfloat16 else 0  # the output's own rounding
    torch.testing.assert_close(y.float(), exact, rtol=rtol, atol=float(1e-4 * scale.max() + 1e-6))
    ref = x.float() @ w.T + (0 if bias is None else bias)
    assert (y.float() - ref).norm() <= 0.02 * ref.norm()


def _lib(flavour: str):  # noqa: ANN202
    if not platform.current().can_run_quant(flavour):
        pytest.skip(f"{flavour} not runnable on this CPU")
    return kernels.load(flavour)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_flavour_builds(flavour: str) -> None:
    assert kernels.build(flavour).exists()
    if not platform.current().can_run_quant(flavour):
        with pytest.raises(KernelUnavailable, match="not runnable"):
            kernels.load(flavour)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(("qtype", "kmin", "kbig"), CASES)
def test_matmul_matches_dequantized(flavour: str, qtype: str, kmin: int, kbig: int) -> None:
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(zlib.crc32(qtype.encode()) % 1000)
    for n, k, m in ((37, kmin, 1), (37, kmin, 5), (19, kbig, 1), (19, kbig, 9)):  # odd N and M
        qw = make_weight(qtype, n, k, gen)
        x = torch.randn(m, k, generator=gen)
        check(qw, x, kernels.matmul(qw, x, lib=lib))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_gemm_tile_edges(flavour: str) -> None:
    """The GEMM (quant_gemm.h: tiles of 16 weight rows; groups of 8 rows x 4 activation rows on VNNI,
    x 2 on AVX2; AVX2's q8_0 / i8c 2 groups x 4 rows, quant_gemm_s16.h) at every remainder of both: M 4..11, N = 16 +
    1..3 and 2 x 16, bias included; for each offset kind: constant per 32 (q8_0 signed, q5_0),
    constant per 16 (q6_k), float per 32 (q4_k) and per 16 (i4g groups of 16)."""
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(11)
    for qtype, k, kw in (("q8_0", 96, {}), ("q5_0", 160, {}), ("q6_k", 256, {}), ("q4_k", 256, {}),
                         ("i4g", 64, {"group": 16})):  # fmt: skip
        for n, m in ((17, 4), (18, 5), (19, 6), (32, 7), (19, 11)):
            qw = make_weight(qtype, n, k, gen, **kw)
            x = torch.randn(m, k, generator=gen)
            bias = torch.randn(n, generator=gen)
            check(qw, x, kernels.matmul(qw, x, bias, lib=lib), bias)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_batch1_gemv_from_blocks(flavour: str) -> None:
    """The GEMV straight from the blocks (quant_gemv.h: q4_k / q5_k / q6_k at 1-3 activation rows,
    q8_0 / q4_0 / q4_1 / q5_0 / q5_1 at 1-2) at each of its row counts, with bias, on K = 256
    and on a K >= 8192 row (the branch that prefetches ahead, past the last row's end too); the
    32-element formats also at 3 and 5 blocks (their loop takes 4 blocks at a time, then a tail), 9
    rows (two 8-row reductions) and K > 16384 (no per-call offset table on the stack)."""
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(12)
    for qtype in ("q4_k", "q5_k", "q6_k", "q8_0"):
        for n, k, m in ((5, 256, 2), (7, 256, 3), (3, 8448, 1), (2, 8448, 2)):
            qw = make_weight(qtype, n, k, gen)
            x = torch.randn(m, k, generator=gen)
            bias = torch.randn(n, generator=gen)
            check(qw, x, kernels.matmul(qw, x, bias, lib=lib), bias)
    for qtype in ("q4_0", "q4_1", "q5_0", "q5_1", "q5_0g", "q4_0g"):
        for n, k, m in ((5, 96, 2), (7, 160, 1), (9, 896, 2), (2, 8448, 1), (2, 16416, 1)):
            if k % 128 and qtype.endswith("g"):
                continue
            qw = make_weight(qtype, n, k, gen)
            x = torch.randn(m, k, generator=gen) * torch.rand(m, k // 32, 1, generator=gen).repeat(1, 1, 32).reshape(m, k)
            bias = torch.randn(n, generator=gen)
            check(qw, x, kernels.matmul(qw, x, bias, lib=lib), bias)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("qtype", ["q5_0", "q4_0"])
def test_regrouped_blocks_are_the_same_weight(flavour: str, qtype: str) -> None:
    """q5_0g / q4_0g hold the file's bytes (back and forth exactly, the same dequantized weight and
    rows), and their products equal the file layout's: bit for bit where both decode through the
    same path (the GEMM's 8-row groups, the row unpack), within float32 summation order in the 1-row
    dot (1-2 rows)."""
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(14)
    qw = make_weight(qtype, 19, 896, gen)
    g = regroup(qw)
    assert g.qtype == qtype + "g" and not torch.equal(g.data, qw.data) and torch.equal(ungroup(g).data, qw.data)
    assert torch.equal(dequantize(g), dequantize(qw))
    rows = torch.tensor([3, 0, 18])
    assert torch.equal(kernels.dequantize_rows(g, rows, lib=lib), kernels.dequantize_rows(qw, rows, lib=lib))
    for m in (1, 2, 3, 5, 17):
        x = torch.randn(m, 896, generator=gen)
        y, ref = kernels.matmul(g, x, lib=lib), kernels.matmul(qw, x, lib=lib)
        if m > 2:
            assert torch.equal(y, ref), m
        check(g, x, y)
    with pytest.raises(ValueError, match="multiple of 128"):
        regroup(make_weight(qtype, 4, 96, gen))
    direct = [lib.ifl_quant_gemv_direct(kernels.QTYPE_IDS.index(q), m) for q in (qtype, g.qtype) for m in (1, 2, 3)]
    # from the blocks at 1-2 rows (the row unpack gives the same numbers at half the speed); the
    # grouped layouts' own dot on VNNI only (elsewhere they are not made: kernels.regroups)
    assert direct == {"avx512vnni": [1, 1, 0, 1, 1, 0], "avxvnni": [1, 1, 0, 0, 0, 0], "avx2": [1, 1, 0, 0, 0, 0], "portable": [0] * 6}[flavour]
    method = QuantLinear()
    method.weights = [g]
    method.to(torch.device("meta"))  # off the CPU (CUDA's portable path): the file's blocks again
    assert method.weights[0].qtype == qtype and method.weights[0].data.device.type == "meta"


@pytest.mark.parametrize("qtype", ["q5_0", "q4_0"])
def test_weights_bound_off_the_cpu_keep_the_files_blocks(qtype: str) -> None:
    """QuantLinear.process_weights_after_loading(layer, device), `device` where the weights go next
    (the loader's finish: the model's device): regrouped (q5_0g / q4_0g) only for the CPU where the
    VNNI kernels run; for a GPU or meta target the file's blocks as read (one part: the very tensor),
    which `to` would have put back after a wasted regroup. No GPU needed: nothing moves here."""
    gen = torch.Generator().manual_seed(15)
    gate, up = make_weight(qtype, 64, 256, gen), make_weight(qtype, 64, 256, gen)
    for device in ("cpu", torch.device("cuda"), torch.device("cuda:1"), torch.device("meta")):
        grouped = torch.device(device).type == "cpu" and kernels.regroups()
        fused = GateUpLinear(256, 64, bias=False)
        fused.method = QuantLinear()
        fused.method.parts = {"gate_proj": gate, "up_proj": up}
        fused.method.process_weights_after_loading(fused, device)
        (w,) = fused.method.weights
        assert w.qtype == qtype + "g" * grouped, device
        assert torch.equal((ungroup(w) if grouped else w).data, torch.cat([gate.data, up.data]))
        single = Linear(256, 64, bias=False)
        single.method = QuantLinear()
        single.method.parts = {None: gate}
        single.method.process_weights_after_loading(single, device)
        assert (single.method.weights[0].qtype == qtype + "g") if grouped else single.method.weights[0] is gate


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_runs_in_one_product(flavour: str) -> None:
    """A fused layer of several layouts (a Q4_K_M file's q / k in q5_0, v in q8_0) in one call:
    every run's columns equal its own product bit for bit (the same int8 activations), at the row
    counts of the GEMV (1-3) and of the GEMM, with the bias split over the runs."""
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(13)
    ws = [make_weight("q5_0", 37, 256, gen), make_weight("q8_0", 9, 256, gen), make_weight("q6_k", 19, 256, gen),
          make_weight("i4g", 8, 256, gen, group=64)]  # fmt: skip
    bias = torch.randn(sum(w.shape[0] for w in ws), generator=gen)
    for m in (1, 2, 3, 5, 9):
        x = torch.randn(m, 256, generator=gen)
        y = kernels.matmul_runs(ws, x, bias, lib=lib)
        start = 0
        for w in ws:
            cols = slice(start, start + w.shape[0])
            assert torch.equal(y[:, cols], kernels.matmul(w, x, bias[cols], lib=lib))
            check(w, x, y[:, cols], bias[cols])
            start += w.shape[0]
    assert not kernels.runs_supported([ws[0], make_weight("q5_0", 4, 512, gen)])  # one K only
    assert not kernels.runs_supported([ws[0], make_weight("i4g", 4, 256, gen, perm=True)])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_variants_bias_dtype_and_leading_dims(flavour: str) -> None:
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(7)
    for qw in (make_weight("i4g", 11, 128, gen, group=64, symmetric=True, perm=True),
               make_weight("i4g", 11, 128, gen, group=128), make_weight("i8c", 11, 64, gen, per_tensor=True),
               make_weight("i8c", 11, 64, gen, act_int8=True)):  # fmt: skip
        x = torch.randn(2, 3, qw.shape[1], generator=gen)
        bias = torch.randn(qw.shape[0], generator=gen)
        y = kernels.matmul(qw, x, bias, lib=lib)
        assert y.shape == (2, 3, qw.shape[0])
        check(qw, x.reshape(6, -1), y.reshape(6, -1), bias)
    qw = make_weight("q4_k", 8, 256, gen)
    x = torch.randn(4, 256, generator=gen).bfloat16()
    y = kernels.matmul(qw, x, lib=lib)
    assert y.dtype == torch.bfloat16
    check(qw, x.float(), y)


def test_zero_rows_and_zero_activations() -> None:
    gen = torch.Generator().manual_seed(3)
    qw = make_weight("q6_k", 5, 256, gen)
    assert kernels.matmul(qw, torch.zeros(0, 256)).shape == (0, 5)
    assert not kernels.matmul(qw, torch.zeros(3, 256)).any()  # a zero block has scale 0, not NaN


def test_available_and_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    assert kernels.available(make_weight("q4_k", 4, 256, gen))
    half = QuantWeight("bf16", (4, 32), torch.zeros(4, 32, dtype=torch.bfloat16))
    assert not kernels.available(half)  # no C kernel: the caller's torch path
    assert not kernels.available(make_weight("i4g", 4, 64, gen, group=8))  # groups of 16 or more
    monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", "0")
    assert not kernels.available(make_weight("q8_0", 4, 32, gen))


def test_quantize_q8_0_matches_gguf() -> None:
    """The C Q8_0 quantizer (the fused kernel's lm_head of a float tied embedding) writes
    gguf-py's bytes (llama.cpp's reference rounding), also for a bf16 weight and zero rows."""
    import gguf

    gen = torch.Generator().manual_seed(4)
    w = torch.randn(37, 96, generator=gen) * 0.05
    w[3] = 0
    for src in (w, w.bfloat16()):
        got = kernels.quantize_q8_0(src, chunk_rows=8)
        ref = gguf.quants.quantize(src.float().numpy(), gguf.GGMLQuantizationType.Q8_0)
        assert torch.equal(got.data, torch.from_numpy(np.ascontiguousarray(ref)))


_F16_AT = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), **_HALF_SCALES}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_dequantize_rows_bit_exact_to_gguf(flavour: str) -> None:
    """The embedding's 1-row lookup in C equals gguf-py's dequantize bit for bit, for every GGML
    type: random block bytes, f16 scales of either sign down to subnormals, rows repeated."""
    from inflight.quant.embedding import take_rows
    from inflight.quant.weight import GGML_QTYPES

    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(5)
    for qtype in GGML_QTYPES:
        elems, nbytes = QTYPES[qtype]
        n, k = 9, 2 * max(elems, 256)
        blocks = torch.randint(0, 256, (n, k // elems, nbytes), generator=gen, dtype=torch.uint8)
        for off in _F16_AT[qtype]:
            mag = torch.pow(10.0, torch.empty(n, k // elems).uniform_(-7, 0, generator=gen))
            half = (torch.randn(n, k // elems, generator=gen).sign() * mag).half()
            blocks[:, :, off : off + 2] = half.view(torch.uint8).view(n, k // elems, 2)
        qw = QuantWeight(qtype, (n, k), blocks.reshape(n, -1).contiguous())
        rows = torch.tensor([8, 0, 3, 3, 5])
        got = kernels.dequantize_rows(qw, rows, lib)
        assert got is not None and torch.equal(got, dequantize(take_rows(qw, rows))), qtype
        # the decode kernel's bf16 rows (kernels.rows_dequantizer): rounded as torch's .to rounds (ties
        # to even: ~1 in 4096 of these products ends in 0x8000)
        bf = torch.empty(len(rows), k, dtype=torch.bfloat16)
        assert lib.ifl_quant_dequantize_rows_bf16(kernels.QTYPE_IDS.index(qtype), n, k, qw.data.data_ptr(),
                                                  rows.data_ptr(), len(rows), bf.data_ptr()) == 0  # fmt: skip
        assert torch.equal(bf.view(torch.int16), got.to(torch.bfloat16).view(torch.int16)), qtype
        with pytest.raises(RuntimeError):
            kernels.dequantize_rows(qw, torch.tensor([n]), lib)
    assert kernels.dequantize_rows(make_weight("i8c", 4, 32, gen), torch.tensor([0]), lib) is None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_row_argmax_every_flavour(flavour: str) -> None:
    """The sampler's C argmax (vector passes on AVX2 / AVX-512, scalar in the portable build) is
    torch's: the first maximum, the first NaN, the 8-lane tail, rows with a stride; its logprob
    is torch's float64 log-softmax of that token within 1e-5, NaN where torch's is."""
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(6)
    for n in (1, 7, 8, 9, 1003, 151936):
        x = torch.randint(-3, 3, (3, n + 5), generator=gen).float()[:, :n]  # ties, a row stride of n + 5
        x[1, n // 2] = float("nan")
        x[2] = float("-inf")
        assert torch.equal(kernels.row_argmax(x, lib), x.argmax(dim=-1)), n
        x[0, : n // 3] = torch.randn(n // 3, generator=gen) * 8  # a spread of logits, not only ties
        tokens, lps = kernels.row_stats(x, True, lib)  # with each token's log-softmax
        want = torch.log_softmax(x.double(), dim=-1).gather(1, x.argmax(dim=-1)[:, None])[:, 0]
        assert torch.equal(tokens, x.argmax(dim=-1)) and torch.equal(lps.isnan(), want.isnan()), n  # NaN and -inf rows
        torch.testing.assert_close(lps[~want.isnan()], want[~want.isnan()], rtol=0, atol=1e-5)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_silu_mul_every_flavour(flavour: str) -> None:
    """QuantLinear's fused MLP activation, SiLU(gate) * up of a [gate; up] product, against torch's
    in float64: 16- / 8-lane bodies and the scalar tail (I = 4864 and 13), the exp's saturation
    (|x| up to 120: SiLU 0 and x), leading dimensions kept; not taken for a strided or bf16 y."""
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(7)
    for rows, inter in ((3, 4864), (5, 13)):
        y = torch.randn(rows, 2 * inter, generator=gen) * 6
        y[0, :4] = torch.tensor([-120.0, 120.0, 0.0, -0.0])
        want = (torch.nn.functional.silu(y[:, :inter].double()) * y[:, inter:].double()).float()
        torch.testing.assert_close(kernels.silu_mul(y, lib), want, rtol=4e-7, atol=1e-30)
        assert kernels.silu_mul(y.view(1, rows, -1), lib).shape == (1, rows, inter)
    assert kernels.silu_mul(torch.randn(4, 20)[:, ::2], lib) is None
    assert kernels.silu_mul(torch.randn(4, 20).bfloat16(), lib) is None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_rms_norm_every_flavour(flavour: str) -> None:
    """The decoder layer's residual add + RMSNorm in C against Hugging Face's formula in float64:
    hidden sizes on and off the 16-float step, with and without the residual, the sum returned;
    not taken for bf16 or strided inputs."""
    lib = _lib(flavour)
    gen = torch.Generator().manual_seed(8)
    for rows, h in ((3, 896), (4, 37)):
        x, y = torch.randn(rows, h, generator=gen) * 3, torch.randn(rows, h, generator=gen)
        w = torch.randn(h, generator=gen)
        for res in (None, y):
            s = x.double() + (0 if res is None else res.double())
            want = w.double() * s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)
            got_sum, got = kernels.rms_norm(x, w, 1e-6, residual=res, lib=lib)
            torch.testing.assert_close(got_sum.double(), s, rtol=1e-7, atol=0)
            torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-6)
    assert kernels.rms_norm(x.bfloat16(), w, 1e-6, lib=lib) is None
    assert kernels.rms_norm(torch.randn(4, 20)[:, ::2], torch.ones(10), 1e-6, lib=lib) is None
