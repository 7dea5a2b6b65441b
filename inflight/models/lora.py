"""Multi-LoRA over one copy of the base weights: the `LoRALinear` method and the runner's slots.

Each linear layer of the decoder (q/k/v, o, gate/up, down; not the lm_head) gets a
`LoRALinear` that wraps whatever method it had (PlainLinear, OneDNNLinear, a tensor-parallel
one): the base GEMM runs unchanged and the adapters' delta is added to its output. The delta
of a whole step is two dense GEMMs per layer whatever mix of adapters the rows use (the
punica / BGMV idea, without gathering weights per row):

    A   (S, P, R, in)    every slot's A of each partition p, rank padded to R with zeros
    B_p (S, R, out_p)    partition p's B^T (scaled) of every slot
    h = x A[:m]^T                  (T, m*P*R)   every row against the step's slots
    h *= mask                      one-hot of each row's slot, repeated over R (zero: base rows)
    y[:, part p] += h_p B_p[:m]    (T, out_p)   only the row's own slot survives the mask

S is `max_loras`, m the highest slot the step uses + 1 (the scheduler fills slots from 0, so
one adapter costs one slot's work), R the largest rank resident (it grows when a larger
adapter is loaded), P the layer's partitions (3 for q/k/v, 2 for gate/up). Slot-major
layouts keep A[:m] and B_p[:m] contiguous. Rows without an adapter get exact zeros added; a
step where no row has one never runs the delta (and may take the fast paths). Measured
against a Python loop over the step's adapters and per-row gathered bmm:
`benchmarks/lora_throughput.py --micro`.

The step's row -> slot map is set once per step (`LoRASlotsState.step`), a scoped context
the runner opens around the forward; the methods read it, the model never knows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from inflight.models.linear import LinearBase, LinearMethod, MergedLinear, silu_mul

_LAYER = re.compile(r"\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


class LoRAStepState:
    """What every LoRALinear reads during one forward: the rows' slot mask, or None."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.rank = 0  # R: the slots' padded rank (the largest resident)
        self.num_active = 0  # m: slots [0, m) hold every adapter this step uses
        self.mask: torch.Tensor | None = None  # (T, m*R) in the model dtype

    @contextmanager
    def step(
        self, row_slots: list[int], dtype: torch.dtype, device: torch.device
    ) -> Iterator[None]:
        """row_slots: the slot of each row of the flat batch, -1 for the base model."""
        m = max(row_slots) + 1
        slots = torch.tensor(row_slots, dtype=torch.int64, device=device)
        onehot = F.one_hot(slots + 1, m + 1)[:, 1:]  # (T, m): column s is slot s
        self.num_active, self.mask = m, onehot.to(dtype).repeat_interleave(self.rank, dim=1)
        try:
            yield
        finally:
            self.mask = None


class LoRALinear(LinearMethod):
    """The base method's output plus the step's adapter deltas. Slots start empty (no tensors)."""

    def __init__(
        self,
        base: LinearMethod,
        state: LoRAStepState,
        layer_idx: int,
        layer: LinearBase,
        parts: list[str],
        **like: Any,
    ) -> None:
        super().__init__(base.plain)  # the decode kernel reads the base weight as before
        self.base = base
        self.state = state
        self.layer_idx = layer_idx
        self.parts = parts  # checkpoint projection of each output partition (q_proj, k_proj, ...)
        self.sizes = list(layer.output_sizes)
        self.in_features = layer.in_features
        self.like = like  # device and dtype of the slot tensors
        self.A: torch.Tensor | None = None  # (S, P, R, in)
        self.B: list[torch.Tensor] = []  # per partition (S, R, out_p)
        self.active = [False] * state.num_slots  # slot s has weights for this layer

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        self.base.process_weights_after_loading(layer)

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        y = self.base.apply(layer, x)
        return y if self._idle() else self._add_delta(y, x)

    def apply_silu_mul(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        if self._idle():
            return self.base.apply_silu_mul(layer, x)  # keeps the fused SiLU * up GEMM
        return silu_mul(self._add_delta(self.base.apply(layer, x), x), layer.output_sizes[0])

    def _idle(self) -> bool:
        return (
            self.state.mask is None
            or self.A is None
            or not any(self.active[: self.state.num_active])
        )

    def _add_delta(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        assert self.A is not None and self.state.mask is not None
        m, r = self.state.num_active, self.state.rank
        p, n_in = len(self.parts), self.in_features
        h = F.linear(x, self.A[:m].view(m * p * r, n_in)).view(-1, m, p, r)  # (T, m, P, R)
        h = h * self.state.mask.view(-1, m, 1, r)
        start = 0
        for i, (b, size) in enumerate(zip(self.B, self.sizes)):
            y[:, start : start + size].addmm_(
                h[:, :, i].reshape(-1, m * r), b[:m].view(m * r, size)
            )
            start += size
        return y

    # ------------------------------------------------------------ slots (the runner, between steps)
    def load(
        self,
        slot: int,
        weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        """Copy an adapter's matrices for this layer into `slot` (zeros where it has none)."""
        mine = [weights.get((self.layer_idx, part)) for part in self.parts]
        if self.A is None and all(w is None for w in mine):
            return  # no adapter has touched this layer: nothing to hold
        self._ensure()
        assert self.A is not None
        self.A[slot].zero_()
        for b in self.B:
            b[slot].zero_()
        for i, w in enumerate(mine):
            if w is not None:
                a, b = w  # (r, in), (out_p, r)
                self.A[slot, i, : a.shape[0]].copy_(a)
                self.B[i][slot, : a.shape[0]].copy_(b.t())
        self.active[slot] = any(w is not None for w in mine)

    def _ensure(self) -> None:
        """Slot tensors of the current padded rank (grown when a larger adapter came, contents kept)."""
        r = self.state.rank
        if self.A is not None and self.A.shape[2] == r:
            return
        s = self.state.num_slots
        new_a = torch.zeros(s, len(self.parts), r, self.in_features, **self.like)
        new_b = [torch.zeros(s, r, size, **self.like) for size in self.sizes]
        if self.A is not None:
            old = self.A.shape[2]
            new_a[:, :, :old].copy_(self.A)
            for nb, ob in zip(new_b, self.B):
                nb[:, :old].copy_(ob)
        self.A, self.B = new_a, new_b


class LoRASlots:
    """The runner's `max_loras` adapter slots over a loaded model (every decoder linear wrapped)."""

    def __init__(
        self, model: nn.Module, num_slots: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.state = LoRAStepState(num_slots)
        self.dtype = dtype
        self.device = device
        self.methods: list[LoRALinear] = []
        for name, layer in model.named_modules():
            m = _LAYER.search(name)
            if not isinstance(layer, LinearBase) or m is None:
                continue  # the lm_head (and anything outside the decoder layers) takes no adapter
            parts = list(layer.shards) if isinstance(layer, MergedLinear) else [m.group(2)]
            method = LoRALinear(
                layer.method, self.state, int(m.group(1)), layer, parts, device=device, dtype=dtype
            )
            layer.method = method
            self.methods.append(method)
        self.slot_uids: list[int | None] = [None] * num_slots

    def load(self, slot: int, adapter: Any) -> None:
        """Put `adapter` (lora.adapter.LoRAAdapter) into `slot`, replacing what was there."""
        if adapter.rank > self.state.rank:
            self.state.rank = adapter.rank
        weights = {
            k: (a.to(self.device, self.dtype), b.to(self.device, self.dtype))
            for k, (a, b) in adapter.weights.items()
        }
        for method in self.methods:
            method.load(slot, weights)
        self.slot_uids[slot] = adapter.uid

    def step(self, row_slots: list[int]) -> Any:
        """Context for one forward: row i uses slot row_slots[i] (-1: none)."""
        return self.state.step(row_slots, self.dtype, self.device)
