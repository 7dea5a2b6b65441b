"""`QuantWeight`: one linear layer's quantized (N out, K in) weight, in the layout its kernels read.

Layouts (`qtype`):

  q8_0 q4_0 q4_1 q5_0 q5_1  GGML blocks, bytes exactly as in the GGUF file (llama.cpp's ggml-common.h):
                             `data` uint8 (N, K // block_elems * block_bytes), row n = the blocks of row n
  q4_k q5_k q6_k             in K order. q8_0/q4_*/q5_*: 32 elements a block; K-quants: 256 (a super-block).
                             (q4_1 q5_0 q5_1: llama-quantize's fallbacks where a row is not a multiple of
                             256, e.g. Qwen2.5-0.5B's 896 columns in a Q4_K_M / Q5_K_M file.)
  q5_0g q4_0g                q5_0 / q4_0 regrouped at load for the AVX-512 VNNI kernels (`regroup`; K a
                             multiple of 128): per 4 blocks, the same bytes as 4 x 16 quant bytes, (q5_0) the
                             4 qh's low 16 bits, their high 16 bits, then the 4 f16 d.
  f16 bf16                   weight-only half precision kept as is: `data` (N, K) of that dtype.
  i4g                        AWQ / GPTQ int4, group-wise asymmetric: `data` uint8 (N, K // 2), element k of a
                             row in byte k // 2, low nibble for even k; `scales` (N, K // group_size) float16;
                             `zeros` uint8 (N, K // group_size) (None: 8, symmetric GPTQ); w = (q - z) * s.
                             `perm` (GPTQ act-order): the stored column j multiplies input feature perm[j].
  i8c                        int8 per output channel: `data` int8 (N, K), `scales` float32 (N,); w = q * s.
                             `act_int8`: W8A8 (activations quantized per token at run time, as the
                             checkpoint was calibrated); else weight-only.
  f8c                        FP8 e4m3fn weight-only: `data` uint8 (N, K) (e4m3 bits), `scales` float32 (N,)
                             or (1,) per tensor; w = fp8(q) * s.

`dequantize` is the reference (float32, exact per the format's formula): tests compare kernels and
loaders against it, and the portable fallback multiplies through it tile by tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# qtype -> (elements per block, bytes per block) of its `data` along K
QTYPES: dict[str, tuple[int, int]] = {
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_0g": (32, 22),
    "q4_0g": (32, 18),
    "q5_1": (32, 24),
    "q4_k": (256, 144),
    "q5_k": (256, 176),
    "q6_k": (256, 210),
    "f16": (1, 2),
    "bf16": (1, 2),
    "i4g": (2, 1),
    "i8c": (1, 1),
    "f8c": (1, 1),
}
GGML_QTYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")


def block_info(qtype: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a qtype's `data` along K."""
    try:
        return QTYPES[qtype]
    except KeyError:
        raise ValueError(f"unknown quantization type {qtype!r} (known: {', '.join(QTYPES)})") from None


@dataclass
class QuantWeight:
    """A quantized (N, K) weight; see the module docstring for each layout."""

    qtype: str
    shape: tuple[int, int]
    data: torch.Tensor
    scales: torch.Tensor | None = None
    zeros: torch.Tensor | None = None
    group_size: int = 0
    perm: torch.Tensor | None = None
    act_int8: bool = False

    def __post_init__(self) -> None:
        elems, nbytes = block_info(self.qtype)
        n, k = self.shape
        if k % elems:
            raise ValueError(f"{self.qtype}: K={k} is not a multiple of its block of {elems}")
        if self.qtype == "i4g" and (self.group_size <= 0 or k % self.group_size):
            raise ValueError(f"i4g: group size {self.group_size} does not divide K={k}")

    @property
    def nbytes(self) -> int:
        """Bytes a product reads (the quantized data and its scales): the roofline's numerator."""
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales, self.zeros) if t is not None)

    def rows(self, start: int, size: int) -> QuantWeight:
        """Output rows [start, start + size) (a column-parallel shard, a fused layer's partition)."""
        pick = lambda t: None if t is None or t.shape[0] == 1 else t[start : start + size]  # noqa: E731
        scales = self.scales if self.scales is not None and self.scales.shape[0] == 1 else pick(self.scales)
        return QuantWeight(self.qtype, (size, self.shape[1]), self.data[start : start + size], scales,
                           pick(self.zeros), self.group_size, self.perm, self.act_int8)  # fmt: skip


# the layouts regrouped at load for the AVX-512 VNNI kernels, per 4 blocks (K a multiple of 128):
# file qtype -> (grouped qtype, block bytes, where each block field goes: (its bytes in a block, its
# offset in the group)); q5_0: the quants, qh's low 16 bits, its high 16 bits, d; q4_0: the quants, d
GROUPED = {"q5_0": ("q5_0g", 22, ((slice(6, 22), 0), (slice(2, 4), 64), (slice(4, 6), 72), (slice(0, 2), 80))),
           "q4_0": ("q4_0g", 18, ((slice(2, 18), 0), (slice(0, 2), 64)))}  # fmt: skip
FILE_QTYPE = {grouped: qtype for qtype, (grouped, _, _) in GROUPED.items()}


def regroup(w: QuantWeight, out: torch.Tensor | None = None) -> QuantWeight:
    """q5_0 / q4_0 -> q5_0g / q4_0g (the same bytes, grouped per 4 blocks), into `out` (uint8, the
    weight's bytes) or a new tensor: never in place (a tied embedding may share the old one)."""
    n, k = w.shape
    if w.qtype not in GROUPED or k % 128:
        raise ValueError(f"regroup: {w.qtype} with K={k} (q5_0 or q4_0, K a multiple of 128)")
    qtype, bb, fields = GROUPED[w.qtype]
    src = w.data.reshape(n, k // 128, 4, bb)
    out = (torch.empty(n * k // 32 * bb, dtype=torch.uint8, device=w.data.device) if out is None else out)
    grouped = out.view(n, k // 128, 4 * bb)
    for field, at in fields:
        width = field.stop - field.start
        grouped[:, :, at : at + 4 * width] = src[:, :, :, field].reshape(n, k // 128, 4 * width)
    return QuantWeight(qtype, w.shape, out.view(n, k // 32 * bb), w.scales, w.zeros, w.group_size, w.perm,
                       w.act_int8)  # fmt: skip


def ungroup(w: QuantWeight) -> QuantWeight:
    """q5_0g / q4_0g -> the file's blocks."""
    n, k = w.shape
    qtype = FILE_QTYPE[w.qtype]
    _, bb, fields = GROUPED[qtype]
    src = w.data.reshape(n, k // 128, 4 * bb)
    out = torch.empty(n, k // 128, 4, bb, dtype=torch.uint8, device=w.data.device)
    for field, at in fields:
        width = field.stop - field.start
        out[:, :, :, field] = src[:, :, at : at + 4 * width].reshape(n, k // 128, 4, width)
    return QuantWeight(qtype, w.shape, out.reshape(n, k // 32 * bb), w.scales, w.zeros, w.group_size, w.perm,
                       w.act_int8)  # fmt: skip


def dequantize(w: QuantWeight) -> torch.Tensor:
    """The float32 (N, K) weight `w` stands for, by the format's own formula."""
    n, k = w.shape
    if w.qtype in FILE_QTYPE:
        return dequantize(ungroup(w))
    if w.qtype in GGML_QTYPES:
        import numpy as np
        from gguf import GGMLQuantizationType, quants

        t = getattr(GGMLQuantizationType, w.qtype.upper())
        out = quants.dequantize(w.data.cpu().numpy().view(np.uint8), t)
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(n, k)
    if w.qtype in ("f16", "bf16"):
        return w.data.float()
    if w.qtype == "i4g":
        assert w.scales is not None
        q = torch.stack([w.data & 0xF, w.data >> 4], dim=-1).reshape(n, k).float()  # (N, K)
        g = w.group_size
        z = w.zeros.float() if w.zeros is not None else torch.full_like(w.scales, 8, dtype=torch.float32)
        out = (q.view(n, k // g, g) - z[..., None]) * w.scales.float()[..., None]
        out = out.reshape(n, k)
        if w.perm is not None:  # stored column j is input feature perm[j]
            full = torch.empty_like(out)
            full[:, w.perm.long()] = out
            out = full
        return out
    assert w.scales is not None
    s = w.scales.float().reshape(-1, 1)
    if w.qtype == "i8c":
        return w.data.float() * s
    if w.qtype == "f8c":
        return w.data.view(torch.float8_e4m3fn).float() * s
    raise ValueError(f"unknown quantization type {w.qtype!r}")


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """x rounded per token to int8 and scaled back (W8A8's dynamic per-token activation scale):
    the reference of what an `act_int8` layout's kernels do to their input."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / 127.0
    return (torch.round(x.float() / scale).clamp_(-127, 127) * scale).to(x.dtype)
