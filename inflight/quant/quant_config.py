"""`quantization_config` of a safetensors checkpoint, checked without torch (start-up checks run
before torch is imported: inflight/checkpoint.py); safetensors_formats.py reads the layers."""

from __future__ import annotations

from typing import Any


class QuantConfig:
    """`quantization_config`, checked: the method and what its layers hold."""

    def __init__(self, qc: dict[str, Any]) -> None:
        self.method = str(qc.get("quant_method", "")).lower()
        self.group_size = 0
        self.zero_plus_one = False
        self.desc_act = False
        self.act_int8 = False
        self.kind = ""  # i4g / i8c / f8c
        if self.method in ("awq", "gptq"):
            self._int4(qc)
        elif self.method == "compressed-tensors":
            self._compressed(qc)
        elif self.method == "fp8":
            if qc.get("weight_block_size"):
                raise ValueError("quantization_config.weight_block_size: block-wise FP8 is not supported (per channel / tensor only)")
            self.kind = "f8c"
        else:
            raise ValueError(f"quantization_config.quant_method: {self.method!r} is not supported "
                             "(awq, gptq, compressed-tensors, fp8; GGUF files by path)")  # fmt: skip

    def _int4(self, qc: dict[str, Any]) -> None:
        bits = qc.get("bits", qc.get("w_bit"))
        if bits != 4:
            raise ValueError(f"quantization_config.bits: {bits!r}; only 4-bit {self.method} is supported")
        group = int(qc.get("group_size", qc.get("q_group_size", 128)))
        self.group_size = group  # -1: one group per row, set per layer
        self.kind = "i4g"
        if self.method == "awq":
            version = str(qc.get("version", "gemm")).lower()
            if version != "gemm":
                raise ValueError(f"quantization_config.version: {version!r}; only AutoAWQ's GEMM packing is supported")
            if qc.get("zero_point", True) is False:
                raise ValueError("quantization_config.zero_point: false (symmetric AWQ) is not supported")
        else:
            fmt = str(qc.get("checkpoint_format", "gptq")).lower()
            if fmt not in ("gptq", "gptq_v2"):
                raise ValueError(f"quantization_config.checkpoint_format: {fmt!r}; use gptq or gptq_v2")
            self.zero_plus_one = fmt == "gptq"
            self.desc_act = bool(qc.get("desc_act", False))

    def _compressed(self, qc: dict[str, Any]) -> None:
        groups = list((qc.get("config_groups") or {}).values())
        if len(groups) != 1:
            raise ValueError(f"quantization_config.config_groups: {len(groups)} groups; exactly one is supported")
        w = groups[0].get("weights") or {}
        act = groups[0].get("input_activations")
        bits, typ, strategy = w.get("num_bits"), w.get("type"), w.get("strategy")
        if bits != 8 or typ not in ("int", "float") or strategy not in ("channel", "tensor"):
            raise ValueError(f"quantization_config.config_groups.weights: {bits}-bit {typ} per {strategy} is not "
                             "supported (8-bit int per channel, 8-bit float per channel or tensor)")  # fmt: skip
        if typ == "int" and (strategy != "channel" or not w.get("symmetric", True)):
            raise ValueError("quantization_config.config_groups.weights: int8 needs symmetric per-channel scales")
        self.kind = "i8c" if typ == "int" else "f8c"
        if typ == "int" and act is not None:
            if act.get("num_bits") != 8 or act.get("type") != "int" or not act.get("dynamic", False):
                raise ValueError("quantization_config.config_groups.input_activations: only dynamic per-token "
                                 "int8 activations are supported")  # fmt: skip
            self.act_int8 = True
        self.ignore = list(qc.get("ignore") or [])
