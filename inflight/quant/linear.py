"""`QuantLinear`: the linear method of a layer whose weight is quantized (models/linear.py's seam).

The layer holds no float weight (`LinearBase.weight` is None): the loader gives each checkpoint
part (q / k / v of a fused layer, this rank's rows or input columns) to `load_weight` as a
`QuantWeight` (inflight/quant/weight.py), read by the format's source (`read_quant`): GGUF
blocks, AWQ / GPTQ groups, int8 / FP8 channels, or a float tensor quantized here at load
(`--quantization int8|fp8`, round to nearest per output channel). After loading, adjacent
parts of the same layout are concatenated, so a fused layer usually multiplies once.

`apply` multiplies through `inflight.quant.kernels.matmul` (the C kernels of the integer layouts)
or `inflight.quant.float_kernels.matmul` (f16 / bf16 / f8c, widened in registers) where their
`available(w)` says they can, else `reference_matmul`: the weight dequantized a few MB of
rows at a time into a scratch tile and F.linear per tile, never a float copy of the whole
weight. W8A8 (`act_int8`) rounds the activations per token to int8 first, as its kernels do.
On CUDA, i4g / i8c / f8c multiply in Triton (quant/triton_kernels.py); GGML blocks take the
portable path there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from inflight import memory
from inflight.models.linear import LinearBase, LinearMethod, silu_mul
from inflight.quant import float_kernels as _float_kernels
from inflight.quant import kernels as _kernels
from inflight.quant.weight import (
    FILE_QTYPE,
    GROUPED,
    QuantWeight,
    dequantize,
    quantize_activations,
    regroup,
    ungroup,
)

TILE_BYTES = 4 << 20  # float32 scratch per dequantized tile: 4 MiB stays in L2/L3-sized chunks


def quantize_rtn(w: torch.Tensor, qtype: str) -> QuantWeight:
    """A float (N, K) weight quantized per output channel, round to nearest: i8c (int8,
    scale = max|row| / 127) or f8c (FP8 e4m3, scale = max|row| / 448)."""
    w = w.float()
    amax = w.abs().amax(dim=1).clamp_min(1e-12)  # (N,)
    if qtype == "i8c":
        scales = amax / 127.0
        data = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    elif qtype == "f8c":
        scales = amax / 448.0
        data = (w / scales[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        raise ValueError(f"quantization: cannot quantize to {qtype!r} at load")
    return QuantWeight(qtype, tuple(w.shape), data.contiguous(), scales.contiguous())  # type: ignore[arg-type]


def concat_rows(parts: list[QuantWeight]) -> QuantWeight:
    """Weights of one layout stacked along N (a fused layer's q / k / v)."""
    first = parts[0]
    if len(parts) == 1:
        return first

    def cat(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
        if ts[0] is None:
            return None
        if all(t.shape[0] == 1 for t in ts) and first.qtype == "f8c":  # per-tensor scales
            return torch.cat([t.expand(p.shape[0]) for t, p in zip(ts, parts)])  # type: ignore[union-attr]
        return torch.cat(ts)  # type: ignore[arg-type]

    n = sum(p.shape[0] for p in parts)
    data = memory.ARENA.empty(sum(p.data.nbytes for p in parts)).view(first.data.dtype).view(n, *first.data.shape[1:])
    torch.cat([p.data for p in parts], out=data)  # in huge pages where the kernel has them (inflight/memory.py)
    return QuantWeight(first.qtype, (n, first.shape[1]), data,  # type: ignore[arg-type]
                       cat([p.scales for p in parts]), cat([p.zeros for p in parts]),
                       first.group_size, first.perm, first.act_int8)  # fmt: skip


def kernel_layout(w: QuantWeight, own: bool, device: torch.device | str = "cpu") -> QuantWeight:
    """`w` in the layout the C kernels here read fastest: q5_0 / q4_0 regrouped per 4 blocks (q5_0g /
    q4_0g) where the AVX-512 VNNI flavour runs (its 1-row dot ~1.4x faster: csrc/quant_gemv_q5g.h),
    else as read. `own`: w's bytes are concat_rows' fresh buffer, regrouped where they lie (a second
    arena slice would leave the first one's space held: memory.WeightArena); else into a new one (a
    tied embedding may share them). `device`: where the weight goes (the model's device): off the
    CPU no C kernel reads it, and `QuantLinear.to` would put the file's blocks back: left as read."""
    if w.qtype not in GROUPED or w.shape[1] % 128 or w.data.device.type != "cpu" or torch.device(device).type != "cpu":
        return w
    if not _kernels.regroups():
        return w
    if own:
        return regroup(dataclasses.replace(w, data=w.data.clone()), w.data.view(-1))
    return regroup(w, memory.ARENA.empty(w.data.nbytes))  # in huge pages, as concat_rows'


def _same_layout(a: QuantWeight, b: QuantWeight) -> bool:
    if (a.qtype, a.group_size, a.act_int8) != (b.qtype, b.group_size, b.act_int8):
        return False
    if (a.zeros is None) != (b.zeros is None) or (a.perm is None) != (b.perm is None):
        return False
    return a.perm is None or bool(torch.equal(a.perm, b.perm))  # type: ignore[arg-type]


def reference_matmul(w: QuantWeight, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ dequantize(w)^T + bias, a tile of rows at a time (portable; no full float copy)."""
    n, k = w.shape
    if w.act_int8:
        x = quantize_activations(x)
    rows = max(1, TILE_BYTES // (4 * k))
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    for start in range(0, n, rows):
        size = min(rows, n - start)
        tile = dequantize(w.rows(start, size)).to(device=x.device, dtype=x.dtype)
        b = None if bias is None else bias[start : start + size]
        out[..., start : start + size] = F.linear(x, tile, b)
    return out


def matmul(w: QuantWeight, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernels' product where they take `w` (C on CPU, Triton on CUDA), else the reference."""
    if x.is_cuda:
        from inflight.quant import triton_kernels

        if triton_kernels.supports(w, x):
            return triton_kernels.matmul(w, x, bias)
        return reference_matmul(w, x, bias)
    if _kernels.available(w):
        return _kernels.matmul(w, x, bias)
    if _float_kernels.available(w):  # f16 / bf16 / f8c
        return _float_kernels.matmul(w, x, bias)
    return reference_matmul(w, x, bias)


class QuantLinear(LinearMethod):
    """A layer's quantized weight, one `QuantWeight` per run of same-layout partitions.

    `quantize`: "i8c" / "f8c" quantizes float checkpoint parts at load (`--quantization`)."""

    quantized = True

    def __init__(self, quantize: str | None = None) -> None:
        super().__init__(None)
        self.quantize = quantize
        self.parts: dict[str | None, QuantWeight] = {}
        self.weights: list[QuantWeight] = []  # after loading: in row order

    def load_weight(self, layer: LinearBase, src: Any, shard: str | None) -> None:
        """This rank's part of one checkpoint weight (a quantized source, or a float one to
        quantize), checked against the layer's shape."""
        dim, start, size = layer.checkpoint_part("weight", shard)
        rows = size if dim == 0 else layer.out_features
        cols = layer.in_features
        full = src.shape[dim]
        take = max(0, min(size, full - start))  # rows past the checkpoint's end (vocab padding): zeros
        if not layer.partial and full != size:
            raise ValueError(f"shape {list(src.shape)} does not fit weight part [{rows}, {cols}]")
        if self.quantize is not None and not getattr(src, "quantized", False):
            w = quantize_rtn(src.read(dim, start, take), self.quantize)
        else:
            w = src.read_quant(dim, start, take)
        if dim == 0 and take < size:
            w = pad_rows(w, size)
        if w.shape != (rows, cols):
            raise ValueError(f"quantized shape {list(w.shape)} does not fit weight part [{rows}, {cols}]")
        self.parts[shard] = w

    def process_weights_after_loading(self, layer: LinearBase, device: torch.device | str = "cpu") -> None:
        """Join the parts into runs of one layout, in the layout the kernels of `device` (where
        the weights go next: `to`) read (`kernel_layout`)."""
        order = list(getattr(layer, "shards", None) or [None])
        missing = [s for s in order if s not in self.parts]
        if missing:
            raise ValueError(f"quantized layer lacks its parts {missing}")
        runs: list[list[QuantWeight]] = []
        for shard in order:
            w = self.parts[shard]
            if runs and _same_layout(runs[-1][-1], w):
                runs[-1].append(w)
            else:
                runs.append([w])
        self.weights = [kernel_layout(concat_rows(run), len(run) > 1, device) for run in runs]
        self.parts = {}
        layer.drop_weight()

    def to(self, device: torch.device) -> None:
        """Move the weights to the model's device (CUDA: the Triton kernels read them there; q5_0
        back in the file's blocks, which its portable path reads)."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        ws = [ungroup(w) if w.qtype in FILE_QTYPE and torch.device(device).type != "cpu" else w for w in self.weights]
        self.weights = [QuantWeight(w.qtype, w.shape, move(w.data), move(w.scales), move(w.zeros), w.group_size,
                                    move(w.perm), w.act_int8) for w in ws]  # fmt: skip

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        bias = layer.bias
        if len(self.weights) == 1:
            return matmul(self.weights[0], x, bias)
        if not x.is_cuda and _kernels.runs_supported(self.weights) and all(map(_kernels.available, self.weights)):
            return _kernels.matmul_runs(self.weights, x, bias)  # x quantized once for every run
        outs, start = [], 0
        for w in self.weights:
            n = w.shape[0]
            outs.append(matmul(w, x, None if bias is None else bias[start : start + n]))
            start += n
        return torch.cat(outs, dim=-1)

    def apply_silu_mul(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        y = self.apply(layer, x)
        if y.shape[-1] == 2 * layer.output_sizes[0] and (fused := _kernels.silu_mul(y)) is not None:
            return fused  # one C pass instead of torch's silu of the strided gate and a multiply
        return silu_mul(y, layer.output_sizes[0])  # a Triton pass on CUDA

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.weights)


def pad_rows(w: QuantWeight, rows: int) -> QuantWeight:
    """`w` with zero rows appended up to `rows` (all-zero blocks / scales dequantize to 0)."""
    extra = rows - w.shape[0]
    if extra == 0:
        return w

    def pad(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or t.shape[0] == 1:
            return t
        return torch.cat([t, t.new_zeros(extra, *t.shape[1:])])

    return QuantWeight(w.qtype, (rows, w.shape[1]), pad(w.data), pad(w.scales), pad(w.zeros),  # type: ignore[arg-type]
                       w.group_size, w.perm, w.act_int8)  # fmt: skip


_WIDENED = {torch.bfloat16: "bf16", torch.float16: "f16"}


class WidenedLinear(LinearMethod):
    """A float32 model's layer whose weight stays bf16 / f16 (`ModelConfig.weight_dtype`, dtype
    auto on an AVX2 CPU): multiplied by inflight/quant/float_kernels.py (widened in registers;
    without them a tile at a time, `reference_matmul`). The weight stays the layer's
    own, and is `plain` too (the decode kernel reads 16-bit GEMV weights): one copy. A tied lm_head
    multiplies by the (16-bit) embedding; were it float32 (a vision-language model's), by the decode
    kernel's 16-bit copy where there is one, else by F.linear."""

    def __init__(self, plain: torch.Tensor | None = None) -> None:
        super().__init__(plain)
        self.qweight: QuantWeight | None = None

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        w = layer.weight if layer.weight is not None and layer.weight.dtype in _WIDENED else self.plain
        if w is not None and w.dtype in _WIDENED:  # a tied lm_head: the decode kernel's 16-bit copy
            self.qweight = QuantWeight(_WIDENED[w.dtype], (w.shape[0], w.shape[1]), w.detach())

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is None:
            return F.linear(x, layer.weight, layer.bias)
        return matmul(self.qweight, x, layer.bias)
