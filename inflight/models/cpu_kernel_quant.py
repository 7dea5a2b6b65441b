"""The decode kernel's quantized weights: which layers it multiplies from their `QuantWeight`s, and
the descriptors C reads them through (inflight/csrc/decode_kernel.c, `qgemv`).

Integer layouts (GGML blocks, i4g, i8c) multiply as inflight/quant/kernels.py does (int8
activations per 32); the narrow float layouts of inflight/quant/float_kernels.py (f16, bf16, f8c:
FP8 e4m3 per channel, `--quantization fp8`) are widened in registers against float32
activations, as float_kernels.c does, so a fused step equals the eager per-layer products up to
summation order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch import nn

from inflight.models.cbuild import KernelUnavailable
from inflight.models.linear import linear_layers
from inflight.quant.weight import QuantWeight

logger = logging.getLogger(__name__)

MAX_QUANT_PARTS = 4  # IFLQ_MAX_PARTS in the C source: QuantWeights of one fused layer
# the C ids FT_* of the float layouts (64 up: past quant_kernels.h's QT_*); "f32": a float lm_head's rows
FLOAT_QTYPES = {"f16": 64, "bf16": 65, "f8c": 66, "f32": 67}
_HEAD_TYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _takes(w: QuantWeight) -> bool:
    from inflight.quant import float_kernels, kernels

    return kernels.supports(w) or float_kernels.supports(w)


def layer_quant(layer: nn.Module) -> list[QuantWeight] | None:
    """A layer's QuantWeights in row order (a quantized method's `weights`, inflight/quant/
    linear.py) when the fused kernel multiplies them all (inflight/quant/kernels.py and
    float_kernels.py layouts of one K; act-order GPTQ, whose input columns are permuted,
    excepted); None otherwise."""
    method = layer.method  # type: ignore[union-attr]
    weights = getattr(method, "weights", None) if getattr(method, "quantized", False) else None
    if not weights or len(weights) > MAX_QUANT_PARTS:
        return None
    if any(not _takes(w) or w.perm is not None or w.shape[1] != weights[0].shape[1] for w in weights):
        return None
    return list(weights)


def quant_weights(model: nn.Module) -> list[list[QuantWeight]] | None:
    """Every decoder linear layer's QuantWeights when the fused kernel runs them all; else None
    (the plain-weight kernel, or none). The lm_head may be quantized or not (see DecodeKernel)."""
    lm_head = getattr(model, "lm_head", None)
    layers = [layer_quant(layer) for layer in linear_layers(model) if layer is not lm_head]
    if not layers or any(w is None for w in layers):
        return None
    return layers  # type: ignore[return-value]


def integer_layers(layers: list[list[QuantWeight]]) -> bool:
    """Whether any decoder layer has an integer layout (int8 activations: the Q8_0 lm_head fits)."""
    return any(w.qtype not in FLOAT_QTYPES for ws in layers for w in ws)


def q8_head(layer: nn.Module) -> list[QuantWeight] | None:
    """A float lm_head of a quantized model (a GGUF's tied embedding, loaded as floats) as Q8_0
    blocks for the kernel's logits GEMV, as llama.cpp multiplies by the file's quantized
    token_embd: Qwen2.5-0.5B's reads 145 MB per token instead of 545 MB (float32). Lossless
    for a Q8_0 file's embedding (its blocks come back); otherwise the int8 rounding of
    activations again. INFLIGHT_QUANT_LM_HEAD=0: the model's own float lm_head."""
    if os.environ.get("INFLIGHT_QUANT_LM_HEAD", "1").lower() in ("0", "false", "no", "off"):
        return None
    weight = getattr(layer, "weight", None)
    if weight is None or weight.shape[1] % 32:
        return None
    from inflight.quant.kernels import quantize_q8_0

    try:
        return [quantize_q8_0(weight)]
    except KernelUnavailable as e:
        logger.info("lm_head stays float: %s", e)
        return None


def qtype_id(qtype: str) -> int:
    """The C id of a layout: quant_kernels.h's QT_* for the integer ones, FT_* for the float ones."""
    from inflight.quant.kernels import QTYPE_IDS

    return QTYPE_IDS.index(qtype) if qtype in QTYPE_IDS else FLOAT_QTYPES[qtype]


def float_head(layer: nn.Module, keep: list[torch.Tensor]) -> torch.Tensor | None:
    """The descriptor of a float lm_head's own weight (f32 / bf16 / f16 rows, no copy) for a model
    whose decoder layers are all float layouts (f8c, f16, bf16): its logits then stay those of the
    eager lm_head (float activations, no int8 rounding); None without a plain weight (packed)."""
    w = getattr(layer, "weight", None)
    if w is None or w.dtype not in _HEAD_TYPES or w.device.type != "cpu":
        return None
    w = w.detach().contiguous()
    n, k = w.shape
    t = torch.tensor([1, FLOAT_QTYPES[_HEAD_TYPES[w.dtype]], n, k, 0, w.data_ptr(), 0, 0, 0], dtype=torch.int64)
    keep += [w, t]
    return t


def descriptor(weights: list[QuantWeight], keep: list[torch.Tensor]) -> torch.Tensor:
    """[parts, then per part: qtype id, N, K, group, data, scales, zeros, scales_per_row] (the C
    qgemv); every tensor whose pointer it holds is appended to `keep`."""
    desc = [len(weights)]
    for qw in weights:
        n, k = qw.shape
        data, scales, zeros = (None if t is None else t.contiguous() for t in (qw.data, qw.scales, qw.zeros))
        keep += [t for t in (data, scales, zeros) if t is not None]
        per_row = int(qw.qtype in ("i8c", "f8c") and scales is not None and scales.numel() == n)
        desc += [qtype_id(qw.qtype), n, k, qw.group_size, _ptr(data), _ptr(scales), _ptr(zeros), per_row]
    t = torch.tensor(desc, dtype=torch.int64)
    keep.append(t)
    return t


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def quant_head(model: nn.Module, describe: Callable[[list[QuantWeight]], torch.Tensor], keep: list[torch.Tensor]) -> int | None:
    """The decode kernel's lm_head beside quantized layers: its own blocks, or a float lm_head as
    Q8_0 blocks beside integer layers (llama.cpp's), else its own float rows; None: not in C."""
    ints = integer_layers(quant_weights(model) or [])
    head = layer_quant(model.lm_head) or (q8_head(model.lm_head) if ints else None)  # type: ignore[arg-type]
    desc = describe(head) if head else None if ints else float_head(model.lm_head, keep)  # type: ignore[arg-type]
    return None if desc is None else desc.data_ptr()


def embed_dequantizer(embed: nn.Module, dtype: torch.dtype) -> Callable[..., object] | None:
    """A float32 or bf16 model's quantized embedding: the step's rows dequantized in C straight
    into the kernel's own rows (bf16: rounded as lookup_rows' `.to` rounds), no torch op a step
    (worker/one_decode.py's one C call); else None (forward embeds through lookup_rows)."""
    if getattr(embed, "qweight", None) is None:
        return None
    from inflight.quant import kernels

    return kernels.rows_dequantizer(embed.qweight, dtype)

