"""Linear layers that own their weight and delegate the math to a linear method.

A layer (`Linear`, `MergedLinear`, `GateUpLinear`) creates its (out, in) weight and optional
bias, knows its output partitions and the checkpoint tensors they come from, and copies each
one in (`load`). How the weight is kept and multiplied is its `method`, one `LinearMethod`
object per layer, chosen after loading (models/cpu_paths.py asks the platform module):

  PlainLinear   F.linear on the weight as loaded (CUDA, float16, CPUs oneDNN cannot pack for,
                cpu_fast_path=False); on CUDA, 1-8 rows optionally through models/triton_gemv.py
  OneDNNLinear  the weight reordered once into oneDNN's blocked layout, the plain one dropped;
                the MLP's SiLU(gate) * up as GEMM post-ops (models/cpu_linear.py)

A method may keep a plain (N, K) copy of the weight for the C decode kernel's GEMVs
(`plain_weight()`), in the kernel's dtype. A method per layer carries per-layer state, and a
layer's `output_sizes` says where each partition's rows are: `LoRALinear` (models/lora.py) wraps
a layer's method and adds the adapters' deltas per partition. For a [gate; up] layer, `apply`
returns the unfused [gate; up] output (what LoRA adds its delta to before SiLU * up).

Tensor parallelism (models/parallel.py) is the layer's business, not the method's: a layer
holds this rank's rows (column-parallel: `MergedLinear` / `GateUpLinear` with per-shard
checkpoint offsets, `Linear(row_start=)` for the vocab-parallel lm_head) or input columns
(`RowParallelLinear`, which all-reduces the method's output), and `load` reads only that part
of each checkpoint tensor (`checkpoint_part`), straight from safetensors without a full copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from inflight.models import triton_fused, triton_gemv
from inflight.models.parallel import TensorParallel


class TensorSource(Protocol):
    """A checkpoint tensor that is read piecewise (a safetensors slice, or a tensor in memory):
    `read` returns `size` rows (dim 0) or columns (dim 1) from `start`, in the checkpoint's
    float dtype (the caller's `copy_` converts it to the model's)."""

    shape: tuple[int, ...]

    def read(self, dim: int, start: int, size: int) -> torch.Tensor: ...


class InMemory:
    """A `TensorSource` over a tensor already loaded (tests, state dicts)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.shape = tuple(tensor.shape)

    def read(self, dim: int, start: int, size: int) -> torch.Tensor:
        return self.tensor.narrow(dim, start, size)


class LinearMethod:
    """How one layer keeps its weight and multiplies by it. One instance per layer.

    `plain` is the (N, K) weight a GEMV reader (the decode kernel) gets through
    `LinearBase.plain_weight()`: a copy in that reader's dtype, or the layer's weight itself;
    None when nothing reads it.

    `quantized`: the layer holds no float weight; the loader hands each checkpoint part to
    `load_weight(layer, source, shard)` (inflight/quant/linear.py's `QuantLinear`), and the
    fast paths that read `layer.weight` (oneDNN packing, the decode kernel) leave the layer be.
    """

    quantized = False

    def __init__(self, plain: torch.Tensor | None = None) -> None:
        self.plain = plain

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        """Turn the loaded weight into the form `apply` uses (called once, after loading)."""

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        """x @ weight^T + bias: (T, in) -> (T, out)."""
        raise NotImplementedError

    def apply_silu_mul(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        """SiLU(x gate^T) * (x up^T) of a [gate; up] layer: (T, in) -> (T, out / 2)."""
        return silu_mul(self.apply(layer, x), layer.output_sizes[0])


def silu_mul(y: torch.Tensor, inter: int) -> torch.Tensor:
    """SiLU(y[..., :inter]) * y[..., inter:]: one Triton pass on CUDA (models/triton_fused.py: the
    8B MLP's 2 launches over (T, 14,336) each), torch's two ops elsewhere."""
    if triton_fused.use(y):
        return triton_fused.silu_mul(y, inter)
    gate, up = y.split(inter, dim=-1)
    return F.silu(gate) * up


class PlainLinear(LinearMethod):
    """F.linear on the weight as loaded; decode steps of 1-8 rows on CUDA through Triton's GEMV
    when INFLIGHT_TRITON_GEMV turns it on (models/triton_gemv.py; off by default)."""

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        if triton_gemv.use(x, layer.weight, layer.bias):
            return triton_gemv.linear(x, layer.weight, layer.bias)
        return F.linear(x, layer.weight, layer.bias)


def silu_down(gate_up: LinearBase, down: RowParallelLinear, x: torch.Tensor) -> torch.Tensor | None:
    """down(SiLU(gate) * up) of x with the (M, I) product never written: Triton's GEMV reads the gate_up
    output (models/triton_gemv.py's silu_linear) when INFLIGHT_TRITON_GEMV_SILU=1 turns it on and both
    layers multiply plainly (PlainLinear: no LoRA, oneDNN or quantized weight). None: the caller runs
    the two layers."""
    if type(gate_up.method) is not PlainLinear or type(down.method) is not PlainLinear:
        return None
    if not triton_gemv.use(x, down.weight, down.bias, silu=True):
        return None
    y = gate_up.method.apply(gate_up, x)
    return down.tp.all_reduce(triton_gemv.silu_linear(y, down.weight, down.bias))


class LinearBase(nn.Module):
    """A linear layer: its (out, in) weight and bias (HF's names, so checkpoints and state dicts
    line up) in `output_sizes` partitions, and the method that multiplies by them.

    `tied`: the weight is another module's (a tied lm_head's is the embedding): the layer holds
    no parameter of its own until `tie` gives it one, loads nothing and never drops it.
    """

    silu_mul = False  # forward is SiLU(first partition) * second partition (see GateUpLinear)
    partial = False  # holds only a part of its checkpoint tensors (tensor parallel: set by the model)

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, tied: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.output_sizes = output_sizes
        self.out_features = sum(output_sizes)
        self.tied = tied
        weight = None if tied else nn.Parameter(torch.empty(self.out_features, in_features))
        self.register_parameter("weight", weight)
        self.register_parameter("bias", nn.Parameter(torch.empty(self.out_features)) if bias else None)
        self.method: LinearMethod = PlainLinear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def tie(self, weight: nn.Parameter) -> None:
        """Multiply by another module's weight (a tied layer; call once its weight is real)."""
        if self.method.quantized:
            return  # multiplies by the quantized table instead (a GGUF's token_embd; quant/formats.py)
        assert self.tied and weight.shape == (self.out_features, self.in_features)
        self.weight = weight

    def drop_weight(self) -> None:
        """A method that keeps the weight in another form frees the plain one (a tied layer's is
        its owner's, which still needs it)."""
        if not self.tied:
            self.weight = None

    def plain_weight(self) -> torch.Tensor | None:
        """The (N, K) weight kept for GEMV readers (the decode kernel); None when none was kept."""
        return self.method.plain

    def checkpoint_tensors(self, prefix: str) -> Iterator[tuple[str, str, str | None]]:
        """(checkpoint name, "weight" | "bias", shard) of every tensor this layer loads."""
        raise NotImplementedError

    def load(self, param: str, tensor: torch.Tensor | TensorSource, shard: str | None = None) -> None:
        """Copy this rank's part of one checkpoint tensor into `param` ("weight" / "bias"), or
        into its shard's rows. Rows past the checkpoint's end (vocab padding) are zeros."""
        if param == "weight" and self.method.quantized:
            src = InMemory(tensor) if isinstance(tensor, torch.Tensor) else tensor
            return self.method.load_weight(self, src, shard)  # type: ignore[attr-defined,no-any-return]
        target = getattr(self, param)
        if shard is not None:
            start, size = self.shard_rows(shard)
            target = target.narrow(0, start, size)
        src = InMemory(tensor) if isinstance(tensor, torch.Tensor) else tensor
        dim, begin, size = self.checkpoint_part(param, shard)
        other = [n for d, n in enumerate(src.shape) if d != dim]
        if other != [n for d, n in enumerate(target.shape) if d != dim] or (not self.partial and src.shape[dim] != size):
            raise ValueError(f"shape {list(src.shape)} does not fit {param} part {list(target.shape)}")
        size = max(0, min(size, src.shape[dim] - begin))
        if size < target.shape[dim]:
            target.zero_()
        if size:
            target.narrow(dim, 0, size).copy_(src.read(dim, begin, size))

    def checkpoint_part(self, param: str, shard: str | None) -> tuple[int, int, int]:
        """(dim, start, size): the part of the checkpoint tensor this rank loads into `param`
        (unsharded: all of it)."""
        return 0, 0, getattr(self, param).shape[0] if shard is None else self.shard_rows(shard)[1]

    def shard_rows(self, shard: str) -> tuple[int, int]:
        raise KeyError(shard)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.output_sizes}, bias={self.bias is not None}, {type(self.method).__name__}"


class Linear(LinearBase):
    """One checkpoint tensor (and bias) under the layer's own name. `row_start`: the layer holds
    checkpoint rows [row_start, row_start + out_features) (column-parallel, the lm_head)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tied: bool = False, row_start: int = 0) -> None:
        super().__init__(in_features, [out_features], bias, tied)
        self.row_start = row_start

    def checkpoint_part(self, param: str, shard: str | None) -> tuple[int, int, int]:
        return 0, self.row_start, self.out_features

    def checkpoint_tensors(self, prefix: str) -> Iterator[tuple[str, str, str | None]]:
        if self.tied:
            return
        yield f"{prefix}.weight", "weight", None
        if self.bias is not None:
            yield f"{prefix}.bias", "bias", None


class RowParallelLinear(Linear):
    """Row-parallel (o_proj, down_proj): this rank holds input columns [col_start, col_start +
    in_features) of the checkpoint's weight (default: the rank's even share) and its output is a
    partial sum, all-reduced over the ranks; the bias is added once (rank 0 holds it, the others
    hold zeros)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel,
                 col_start: int | None = None) -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias)
        self.tp = tp
        self.col_start = tp.rank * in_features if col_start is None else col_start
        self.partial = tp.size > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.method.apply(self, x))

    def checkpoint_part(self, param: str, shard: str | None) -> tuple[int, int, int]:
        if param == "weight":
            return 1, self.col_start, self.in_features
        return 0, 0, self.out_features if self.tp.rank == 0 else 0  # size 0: zeros


class MergedLinear(LinearBase):
    """Several checkpoint projections of the same input fused into one GEMM: `shards` maps each
    checkpoint module name (a sibling of this layer: q_proj, k_proj, v_proj) to its row count,
    in row order. `offsets`: the checkpoint row each shard's part starts at (column-parallel:
    this rank's heads or intermediate rows; default 0, the whole projection)."""

    def __init__(
        self, in_features: int, shards: dict[str, int], bias: bool, offsets: dict[str, int] | None = None
    ) -> None:
        super().__init__(in_features, list(shards.values()), bias)
        self.shards = dict(shards)
        self.offsets = dict(offsets or {})

    def checkpoint_part(self, param: str, shard: str | None) -> tuple[int, int, int]:
        assert shard is not None
        return 0, self.offsets.get(shard, 0), self.shards[shard]

    def shard_rows(self, shard: str) -> tuple[int, int]:
        """(first row, row count) of a checkpoint shard."""
        start = 0
        for name, size in self.shards.items():
            if name == shard:
                return start, size
            start += size
        raise KeyError(shard)

    def checkpoint_tensors(self, prefix: str) -> Iterator[tuple[str, str, str | None]]:
        parent = prefix.rpartition(".")[0]
        for shard in self.shards:
            name = f"{parent}.{shard}" if parent else shard
            yield f"{name}.weight", "weight", shard
            if self.bias is not None:
                yield f"{name}.bias", "bias", shard


class GateUpLinear(MergedLinear):
    """The MLP's [gate; up] projection; its output is SiLU(gate) * up, which a method may fuse."""

    silu_mul = True

    def __init__(self, in_features: int, intermediate: int, bias: bool, row_start: int = 0) -> None:
        shards = {"gate_proj": intermediate, "up_proj": intermediate}
        super().__init__(in_features, shards, bias, offsets=dict.fromkeys(shards, row_start))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply_silu_mul(self, x)


def linear_layers(model: nn.Module) -> list[LinearBase]:
    """The model's linear layers in module order (the lm_head, registered last, last)."""
    return [m for m in model.modules() if isinstance(m, LinearBase)]


def set_methods(
    model: nn.Module,
    method: Callable[[torch.Tensor | None], LinearMethod],
    plain: list[torch.Tensor | None] | None = None,
) -> list[LinearMethod]:
    """Give each linear layer its own `method(plain weight)` and let it process its weight.

    `plain`: one GEMV weight per layer of `linear_layers(model)` (see cpu_linear.plain_copies).
    Called once, after loading; returns the methods in layer order. A quantized layer keeps its
    method (inflight/quant/linear.py).
    """
    layers = linear_layers(model)
    plains = plain if plain is not None else [None] * len(layers)
    for layer, kept in zip(layers, plains, strict=True):
        if layer.method.quantized:
            continue
        layer.method = method(kept)
        layer.method.process_weights_after_loading(layer)
    return [layer.method for layer in layers]
