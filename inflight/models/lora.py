"""Multi-LoRA over one copy of the base weights: the `LoRALinear` method and the runner's slots.

Each linear layer of the decoder (q/k/v, o, gate/up, down; not the lm_head) gets a
`LoRALinear` that wraps whatever method it had (PlainLinear, OneDNNLinear, a tensor-parallel
one): the base GEMM runs unchanged and the adapters' delta is added to its output. The delta
of a whole step is two dense GEMMs per layer whatever mix of adapters the rows use (the
punica / BGMV idea, without gathering weights per row):

    A  (P, S, R, in)    each partition p's A of every slot s, rank padded to R with zeros
    B_p (out_p, S, R)   partition p's B (scaled) of every slot
    h = x A^T                      (T, P*S*R)   every row against every slot
    h *= mask                      one-hot of each row's slot, repeated over R (zero: base rows)
    y[:, part p] += h_p B_p^T      (T, out_p)   only the row's own slot survives the mask

S is `max_loras`, R the largest rank resident (it grows when a larger adapter is loaded), P
the layer's partitions (3 for q/k/v, 2 for gate/up). Rows without an adapter get exact zeros
added; a step where no row has one never runs the delta (and may take the fast paths).

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

from inflight.models.linear import LinearBase, LinearMethod, MergedLinear

_LAYER = re.compile(r"\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


class LoRAStepState:
    """What every LoRALinear reads during one forward: each row's slot mask, or None."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.rank = 0  # R: the slots' padded rank (the largest resident)
        self.mask: torch.Tensor | None = None  # (T, S*R) in the model dtype

    @contextmanager
    def step(self, row_slots: torch.Tensor, dtype: torch.dtype) -> Iterator[None]:
        """row_slots: (T,) int64 slot per row, -1 for the base model."""
        onehot = F.one_hot((row_slots + 1).clamp(min=0), self.num_slots + 1)[:, 1:]  # (T, S)
        self.mask = onehot.to(dtype).repeat_interleave(self.rank, dim=1)  # (T, S*R)
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
        self.A: torch.Tensor | None = None  # (P, S, R, in)
        self.B: list[torch.Tensor] = []  # per partition (out_p, S, R)
        self.active = [False] * state.num_slots  # slot s has weights for this layer

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        self.base.process_weights_after_loading(layer)

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        y = self.base.apply(layer, x)
        return y if self._idle() else self._add_delta(y, x)

    def apply_silu_mul(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        if self._idle():
            return self.base.apply_silu_mul(layer, x)  # keeps the fused SiLU * up GEMM
        gate, up = self._add_delta(self.base.apply(layer, x), x).split(
            layer.output_sizes[0], dim=-1
        )
        return F.silu(gate) * up

    def _idle(self) -> bool:
        return self.state.mask is None or self.A is None or not any(self.active)

    def _add_delta(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        assert self.A is not None and self.state.mask is not None
        p, s, r, n_in = self.A.shape
        h = F.linear(x, self.A.view(p * s * r, n_in))  # (T, P*S*R)
        h = h.view(-1, p, s * r) * self.state.mask[:, None, :]
        start = 0
        for i, (b, size) in enumerate(zip(self.B, self.sizes)):
            y[:, start : start + size].addmm_(h[:, i], b.view(size, s * r).t())
            start += size
        return y

    # ------------------------------------------------------------ slots (the runner, between steps)
    def load(
        self,
        slot: int,
        weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
        rank: int,
    ) -> None:
        """Copy an adapter's matrices for this layer into `slot` (zeros where it has none)."""
        mine = [weights.get((self.layer_idx, part)) for part in self.parts]
        if self.A is None and all(m is None for m in mine):
            return  # no adapter has touched this layer: nothing to hold
        self._ensure(rank)
        assert self.A is not None
        self.A[:, slot].zero_()
        for b in self.B:
            b[:, slot].zero_()
        for i, m in enumerate(mine):
            if m is not None:
                a, b = m
                self.A[i, slot, : a.shape[0]].copy_(a)
                self.B[i][:, slot, : a.shape[0]].copy_(b)
        self.active[slot] = any(m is not None for m in mine)

    def _ensure(self, rank: int) -> None:
        """Slot tensors of padded rank >= `rank` (grown once a larger adapter comes, contents kept)."""
        r = self.state.rank
        if self.A is not None and self.A.shape[2] == r:
            return
        n_in, s = self.in_features, self.state.num_slots
        new_a = torch.zeros(len(self.parts), s, r, n_in, **self.like)
        new_b = [torch.zeros(size, s, r, **self.like) for size in self.sizes]
        if self.A is not None:
            old = self.A.shape[2]
            new_a[:, :, :old].copy_(self.A)
            for nb, ob in zip(new_b, self.B):
                nb[:, :, :old].copy_(ob)
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
            method.load(slot, weights, adapter.rank)
        self.slot_uids[slot] = adapter.uid

    def step(self, row_slots: list[int]) -> Any:
        """Context for one forward: row i uses slot row_slots[i] (-1: none)."""
        return self.state.step(
            torch.tensor(row_slots, dtype=torch.int64, device=self.device), self.dtype
        )
