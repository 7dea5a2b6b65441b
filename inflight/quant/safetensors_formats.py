"""Quantized safetensors checkpoints (`quantization_config` in config.json) as `QuantWeight`s.

  awq                AutoAWQ GEMM: `qweight` int32 (K, N/8) packed along N in AutoAWQ's order
                     (nibble i of word c holds column c*8 + [0, 2, 4, 6, 1, 3, 5, 7][i]), `qzeros`
                     int32 (K/g, N/8) packed the same way, `scales` fp16 (K/g, N);
                     w[n, k] = (q - z) * s                                           -> i4g
  gptq               AutoGPTQ / GPTQModel: `qweight` int32 (K/8, N) packed along K (nibble i of
                     row r = input feature r*8 + i), `qzeros` int32 (K/g, N/8) packed along N in
                     order, stored as zero - 1 (checkpoint_format "gptq"; "gptq_v2" stores the
                     zero itself), `scales` fp16 (K/g, N), `g_idx` int32 (K,) (desc_act / act-order:
                     any order; the columns are sorted by group and `perm` remembers where) -> i4g
  compressed-tensors int8 W8A8 (`weight` int8 (N, K), `weight_scale` (N, 1), dynamic per-token
                     int8 activations) -> i8c act_int8; FP8 e4m3 (`weight` float8_e4m3fn,
                     `weight_scale` per channel or per tensor) -> f8c (weight-only)
  fp8                (transformers' / vLLM's fp8 checkpoints without weight_block_size) -> f8c

Anything else in `quantization_config` is refused at start-up naming the field; so is a group
size that does not divide a layer's input (naming the tensor). vLLM's awq / gptq / compressed-
tensors loaders are the reference for the bit orders.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from inflight.quant.quant_config import QuantConfig
from inflight.quant.weight import QuantWeight

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # column c*8 + AWQ_ORDER[i] sits in nibble i
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def _unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 (R, C/8) -> uint8 (R, C): nibble i of word c -> column c*8 + i."""
    q = (packed.to(torch.int32)[:, :, None] >> _SHIFTS) & 0xF  # (R, C/8, 8)
    return q.to(torch.uint8).reshape(packed.shape[0], -1)


def _awq_order(q: torch.Tensor) -> torch.Tensor:
    """Columns unpacked in nibble order -> natural order (AutoAWQ's packing undone)."""
    r, c = q.shape
    out = torch.empty_like(q).view(r, c // 8, 8)
    out[:, :, AWQ_ORDER] = q.view(r, c // 8, 8)
    return out.view(r, c)


def _pack_k(q: torch.Tensor) -> torch.Tensor:
    """uint8 values (N, K) -> i4g bytes (N, K/2): element k in byte k/2, low nibble for even k."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


class QuantSafetensor:
    """A `QuantWeight` source over one layer's tensors in a quantized safetensors checkpoint."""

    quantized = True

    def __init__(self, cfg: QuantConfig, name: str, get: Any) -> None:
        self.cfg, self.name, self._get = cfg, name, get
        if cfg.kind == "i4g":
            scales = get(f"{name}.scales")
            n = scales.get_shape()[1]
            k = get(f"{name}.qweight").get_shape()[0] * (8 if cfg.method == "gptq" else 1)
        else:
            n, k = get(f"{name}.weight").get_shape()
        self.shape = (int(n), int(k))
        if cfg.kind == "i4g" and cfg.group_size > 0 and k % cfg.group_size:  # checked before reading
            raise ValueError(f"{name}: group size {cfg.group_size} does not divide its {k} input features")

    def _t(self, suffix: str) -> torch.Tensor:
        return self._get(f"{self.name}.{suffix}")[:]  # type: ignore[no-any-return]

    def read_quant(self, dim: int, start: int, size: int) -> QuantWeight:
        w = self._whole()
        if dim == 1 and (start, size) == (0, self.shape[1]):
            return w  # a row-parallel layer's whole input (unsharded)
        if dim == 0:
            return w.rows(start, size)
        return _cols(w, start, size, self.name)

    def _whole(self) -> QuantWeight:
        n, k = self.shape
        cfg = self.cfg
        if cfg.kind != "i4g":
            scales = self._t("weight_scale").float().reshape(-1)
            data = self._t("weight")
            data = data.view(torch.uint8) if cfg.kind == "f8c" else data.to(torch.int8)
            return QuantWeight(cfg.kind, (n, k), data.contiguous(), scales.contiguous(), act_int8=cfg.act_int8)
        g = k if cfg.group_size in (-1, 0) else cfg.group_size
        scales = self._t("scales").to(torch.float16).t().contiguous()  # (N, K/g)
        zeros = _unpack_cols(self._t("qzeros"))  # (K/g, N) in nibble order
        if cfg.method == "awq":
            q = _awq_order(_unpack_cols(self._t("qweight"))).t()  # (K, N) -> (N, K)
            zeros = _awq_order(zeros)
        else:
            qw = self._t("qweight")  # (K/8, N): nibble i of row r = feature r*8 + i
            q = ((qw.to(torch.int32)[:, None, :] >> _SHIFTS[None, :, None]) & 0xF).to(torch.uint8).reshape(k, n).t()
        if cfg.zero_plus_one:
            zeros = (zeros + 1) & 0xF  # AutoGPTQ stored zero - 1 (a 16 wraps to 0 in its kernels too)
        zeros = zeros.t().contiguous()
        perm = None
        if cfg.method == "gptq" and cfg.desc_act:
            g_idx = self._t("g_idx").long()
            perm = torch.argsort(g_idx, stable=True)
            if not torch.equal(g_idx[perm], torch.arange(k) // g):
                raise ValueError(f"{self.name}.g_idx: groups are not {g} features each")
            if torch.equal(perm, torch.arange(k)):
                perm = None
            else:
                q = q[:, perm]
        return QuantWeight("i4g", (n, k), _pack_k(q.contiguous()), scales, zeros, g,
                           None if perm is None else perm.to(torch.int32))  # fmt: skip


def _cols(w: QuantWeight, start: int, size: int, name: str) -> QuantWeight:
    """Input columns [start, start + size) (a row-parallel shard), on group boundaries."""
    n, _ = w.shape
    if w.qtype == "i4g":
        if w.perm is not None:
            raise ValueError(f"{name}: an act-order (desc_act) GPTQ layer cannot be split by input columns")
        g = w.group_size
        whole_row = g == w.shape[1]  # group_size -1: a row's one scale and zero hold for any of its columns
        if not whole_row and (start % g or size % g):
            raise ValueError(f"{name}: input columns [{start}, {start + size}) do not fall on its group "
                             f"boundaries ({g}); use a tensor_parallel_size that keeps whole groups")  # fmt: skip
        assert w.scales is not None and w.zeros is not None
        groups = slice(None) if whole_row else slice(start // g, (start + size) // g)
        return QuantWeight("i4g", (n, size), w.data[:, start // 2 : (start + size) // 2].contiguous(),
                           w.scales[:, groups].contiguous(), w.zeros[:, groups].contiguous(),
                           size if whole_row else g)  # fmt: skip
    return QuantWeight(w.qtype, (n, size), w.data[:, start : start + size].contiguous(), w.scales,
                       act_int8=w.act_int8)  # fmt: skip


_AUX = (".qweight", ".qzeros", ".scales", ".g_idx", ".weight_scale", ".input_scale", ".weight_zero_point")


def quantized_layers(names: list[str], cfg: QuantConfig) -> set[str]:
    """Layer prefixes (`model.layers.0.self_attn.q_proj`) whose weight is quantized."""
    key = ".qweight" if cfg.kind == "i4g" else ".weight_scale"
    return {n[: -len(key)] for n in names if n.endswith(key)}


class SafetensorsQuantCheckpoint:
    """Every tensor of the checkpoint's files by name; quantized layers as one source each."""

    def __init__(self, path: Path, cfg: QuantConfig) -> None:
        from inflight.models.safetensors_io import checkpoint_files

        self.cfg = cfg
        self._stack = contextlib.ExitStack()
        self.where: dict[str, Any] = {}
        for f in checkpoint_files(path):
            sf = self._stack.enter_context(safe_open(str(f), framework="pt"))
            self.where.update(dict.fromkeys(sf.keys(), sf))  # noqa: SIM118
        self.layers = quantized_layers(list(self.where), cfg)

    def get_slice(self, name: str) -> Any:
        if name not in self.where:
            raise ValueError(f"model: quantized checkpoint lacks tensor {name!r}")
        return self.where[name].get_slice(name)

    def quantized_names(self) -> set[str]:
        return {f"{p}.weight" for p in self.layers}

    def weights(self) -> Iterator[tuple[str, Any]]:
        from inflight.models.safetensors_io import SafetensorsSlice

        try:
            for prefix in sorted(self.layers):
                yield f"{prefix}.weight", QuantSafetensor(self.cfg, prefix, self.get_slice)
            for name, sf in self.where.items():
                prefix = name.rsplit(".", 1)[0]
                if prefix in self.layers and (name.endswith(_AUX) or name == f"{prefix}.weight"):
                    continue
                if name.endswith((".input_scale", ".weight_zero_point")):
                    continue  # compressed-tensors' unused parts of an ignored / dynamic layer
                yield name, SafetensorsSlice(sf, name)
        finally:
            self._stack.close()
