"""A PEFT adapter directory read as untrusted input: the config and the safetensors header are
checked before any tensor byte is read, so a malformed, over-rank or oversized adapter costs a
few kilobytes of reading and gives a ParamError naming what is wrong.

What the config may say (PEFT 0.21's `LoraConfig`): fields that describe plain LoRA
(y = x W^T + s * (x A^T) B^T, s = alpha / r or alpha / sqrt(r) with `use_rslora`, per-module
`rank_pattern` / `alpha_pattern`) are applied exactly. Fields that change that math are refused
by name: DoRA, the PEFT variants, base-weight-modifying initialisations (PiSSA, OLoRA, CorDA,
LoftQ, LoRA-GA: their adapters need the modified base; PEFT's
`save_pretrained(path_initial_model_for_weight_conversion=...)` converts them to plain LoRA,
which loads), and any field this reader does not know that is set.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.errors import ParamError

if TYPE_CHECKING:  # the config and header are read without torch (the CLI's start-up check)
    import torch

MAX_CONFIG_BYTES = 1 << 20  # real configs are ~1 KB
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header
DTYPES: dict[str, tuple[str, int]] = {  # safetensors name -> (torch's name, bytes)
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
}  # fmt: skip

# set (truthy) = the adapter is not plain LoRA: refused, naming the field
VARIANTS = {
    "use_dora": "DoRA (weight-decomposed) adapters are not supported",
    "use_qalora": "QA-LoRA adapters are not supported",
    "alora_invocation_tokens": "activated LoRA (aLoRA) adapters are not supported",
    "velora_config": "VeLoRA adapters are not supported",
    "monteclora_config": "MonteCLoRA adapters are not supported",
    "use_bdlora": "block-diagonal LoRA (BD-LoRA) adapters are not supported",
    "arrow_config": "Arrow adapter routing is not supported",
    "kasa_config": "KaSA adapters are not supported",
    "layer_replication": "adapters that replicate layers are not supported",
    "lora_bias": "adapters with a bias on lora_B are not supported",
    "target_parameters": "adapters on bare parameters (target_parameters) are not supported",
    "trainable_token_indices": "adapters that retrain token embeddings are not supported",
    "modules_to_save": "adapters that retrain whole modules (modules_to_save) are not supported",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D) adapters are not supported",
    "megatron_config": "Megatron-parallel adapters are not supported",
}
# describe the adapter without changing its math (or only matter with a refused init)
HARMLESS = {
    "task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
    "inference_mode", "target_modules", "exclude_modules", "lora_dropout", "layers_to_transform",
    "layers_pattern", "megatron_core", "eva_config", "corda_config", "lora_ga_config", "loftq_config",
    "runtime_config", "ensure_weight_tying", "qalora_group_size",
    "r", "lora_alpha", "use_rslora", "bias", "init_lora_weights", "rank_pattern", "alpha_pattern",
}  # fmt: skip
INITS_OK = ("gaussian", "eva", "orthogonal")  # leave the base weights as they are
_PREFIX = "base_model.model."


@dataclass(frozen=True)
class PeftConfig:
    r: int
    alpha: float
    rslora: bool
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    base_model: Any

    def rank_of(self, module: str) -> int:
        return int(_pattern(self.rank_pattern, module, self.r))

    def scale(self, module: str, r: int) -> float:
        """PEFT's scaling for the module: alpha / r, or alpha / sqrt(r) with rsLoRA."""
        alpha = _pattern(self.alpha_pattern, module, self.alpha)
        return alpha / math.sqrt(r) if self.rslora else alpha / r


def _pattern(patterns: dict[str, Any], module: str, default: float) -> float:
    """PEFT's get_pattern_key: the first key that matches the end of the module's name."""
    name = module.removeprefix(_PREFIX)
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def _number(cfg: dict[str, Any], key: str, default: float, param: str) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ParamError(f"{param}: adapter_config.json {key} must be a finite number; got {value!r}", param)
    return float(value)


def _rank(value: Any, where: str, max_rank: int, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParamError(f"{param}: adapter_config.json {where} must be a positive integer; got {value!r}", param)
    if value > max_rank:
        raise ParamError(
            f"{param}: adapter_config.json {where} is {value}; this server takes ranks 1..{max_rank} (max_lora_rank)",
            param,
        )
    return value


def _patterns(cfg: dict[str, Any], key: str, param: str) -> dict[str, Any]:
    value = cfg.get(key) or {}
    if not isinstance(value, dict):
        raise ParamError(f"{param}: adapter_config.json {key} must be an object (module pattern -> value)", param)
    for k in value:
        try:
            re.compile(k)
        except re.error as e:
            raise ParamError(f"{param}: adapter_config.json {key} key {k!r} is not a valid pattern ({e})", param) from e
    return value


def read_config(file: Path, max_rank: int, param: str) -> PeftConfig:
    """adapter_config.json, checked field by field (ParamError naming the field)."""
    try:
        with file.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ParamError(f"{param}: adapter_config.json is larger than {MAX_CONFIG_BYTES} bytes", param)
        cfg = json.loads(raw)
    except (OSError, ValueError) as e:
        if isinstance(e, ParamError):
            raise
        raise ParamError(f"{param}: adapter_config.json is not valid JSON ({e})", param) from e
    if not isinstance(cfg, dict):
        raise ParamError(f"{param}: adapter_config.json must be a JSON object, not {type(cfg).__name__}", param)
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ParamError(f"{param}: not a LoRA adapter (peft_type {cfg.get('peft_type')!r})", param)
    for key, why in VARIANTS.items():
        if cfg.get(key):
            raise ParamError(f"{param}: {why} (adapter_config.json {key})", param)
    unknown = sorted(k for k, v in cfg.items() if k not in HARMLESS and k not in VARIANTS and v)
    if unknown:
        raise ParamError(
            f"{param}: adapter_config.json sets {', '.join(unknown)}, which this server does not know; "
            "refused rather than served as plain LoRA",
            param,
        )
    if cfg.get("bias", "none") != "none":
        raise ParamError(f"{param}: adapters that train biases (bias={cfg['bias']!r}) are not supported", param)
    init = cfg.get("init_lora_weights", True)
    if not isinstance(init, bool) and init not in INITS_OK:
        raise ParamError(
            f"{param}: adapter_config.json init_lora_weights={init!r}: such adapters (PiSSA, OLoRA, CorDA, LoftQ, "
            "LoRA-GA, MiCA) change or need a modified base model; convert them to plain LoRA with PEFT's "
            "save_pretrained(path_initial_model_for_weight_conversion=...)",
            param,
        )
    rslora = cfg.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise ParamError(f"{param}: adapter_config.json use_rslora must be true or false", param)
    ranks = _patterns(cfg, "rank_pattern", param)
    alphas = _patterns(cfg, "alpha_pattern", param)
    return PeftConfig(
        r=_rank(cfg.get("r", 8), "r", max_rank, param),
        alpha=_number(cfg, "lora_alpha", 8, param),
        rslora=rslora,
        rank_pattern={k: _rank(v, f"rank_pattern[{k!r}]", max_rank, param) for k, v in ranks.items()},
        alpha_pattern={k: _number(alphas, k, 0, param) for k in alphas},
        base_model=cfg.get("base_model_name_or_path"),
    )


@dataclass(frozen=True)
class TensorEntry:
    dtype: str  # torch's name
    shape: tuple[int, ...]
    start: int  # absolute file offsets
    end: int


def read_header(file: Path, param: str) -> dict[str, TensorEntry]:
    """The safetensors header (8-byte little-endian length + JSON), every entry checked against
    the file: known float dtype, non-negative shape, offsets inside the file and the byte count
    the shape needs. Reads the header only."""
    bad = f"{param}: adapter_model.safetensors is not a valid safetensors file"
    try:
        with file.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            if size < 8:
                raise ParamError(f"{bad} ({size} bytes)", param)
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise ParamError(f"{bad} (header length {n} past the file's {size} bytes)", param)
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as e:
        if isinstance(e, ParamError):
            raise
        raise ParamError(f"{bad} ({e})", param) from e
    if not isinstance(header, dict):
        raise ParamError(f"{bad} (header is not an object)", param)
    header.pop("__metadata__", None)
    out: dict[str, TensorEntry] = {}
    for name, info in header.items():
        out[name] = _entry(name, info, 8 + n, size, bad, param)
    return out


def _entry(name: str, info: Any, base: int, size: int, bad: str, param: str) -> TensorEntry:
    if not isinstance(info, dict) or info.get("dtype") not in DTYPES:
        dtype = info.get("dtype") if isinstance(info, dict) else None
        raise ParamError(f"{param}: adapter tensor {name!r} has dtype {dtype!r}; LoRA weights are F16/BF16/F32/F64", param)
    shape, offsets = info.get("shape"), info.get("data_offsets")
    ints = lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)  # noqa: E731
    if not ints(shape) or not ints(offsets) or len(offsets) != 2:
        raise ParamError(f"{bad} (tensor {name!r}: bad shape or data_offsets)", param)
    dtype, itemsize = DTYPES[info["dtype"]]
    start, end = base + offsets[0], base + offsets[1]
    if not start <= end <= size or end - start != math.prod(shape) * itemsize:
        raise ParamError(f"{bad} (tensor {name!r}: its data_offsets do not fit its shape or the file)", param)
    return TensorEntry(dtype, tuple(shape), start, end)


def read_tensor(fh: Any, entry: TensorEntry) -> torch.Tensor:
    """One tensor's bytes (already checked against the file), as float32."""
    import torch

    fh.seek(entry.start)
    data = bytearray(fh.read(entry.end - entry.start))
    if not data:
        return torch.zeros(entry.shape, dtype=torch.float32)
    return torch.frombuffer(data, dtype=getattr(torch, entry.dtype)).reshape(entry.shape).float()
