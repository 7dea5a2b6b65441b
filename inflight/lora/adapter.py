"""LoRA adapters: a PEFT directory or TensorRT-LLM's tensors -> one `LoRAAdapter`.

An adapter holds, per (layer, projection), A (r, in) and B (out, r) in the base model's dtype
with its scaling folded into B, so that a layer computes y = x W^T + (x A^T) B^T. Projections
are the checkpoint's: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; a PEFT
adapter of a fused checkpoint (qkv_proj, gate_up_proj) is split into them (the partitions share
its A). Every shape is checked against the base model before anything runs: an adapter that
does not fit is a ParamError naming the field it came from.

Scaling (PEFT): lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; `alpha_pattern` /
`rank_pattern` override it per module. TensorRT-LLM's layout carries B already scaled
(examples/hf_lora_convert.py multiplies the out weights by the scale), so it is used as is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.errors import ParamError
from inflight.lora.peft_files import PeftConfig, TensorEntry, read_config, read_header, read_tensor

if TYPE_CHECKING:  # torch loads with the weights: `check_peft` runs before it (`inflight serve --lora-modules`)
    import torch

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

# TensorRT-LLM's LoraManager.LORA_MODULE_IDS for the Llama family, mapped as its
# hf_lora_convert.py maps HF names: mlp_h_to_4h is gate_proj, mlp_gate is up_proj
TRT_MODULES: dict[int, tuple[str, ...]] = {
    0: ("q_proj", "k_proj", "v_proj"),  # attn_qkv
    1: ("q_proj",),  # attn_q
    2: ("k_proj",),  # attn_k
    3: ("v_proj",),  # attn_v
    4: ("o_proj",),  # attn_dense
    5: ("gate_proj",),  # mlp_h_to_4h
    6: ("down_proj",),  # mlp_4h_to_h
    7: ("up_proj",),  # mlp_gate
}

_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class LoRAShapes:
    """What an adapter must fit: the base model's layers and each projection's (in, out)."""

    num_layers: int
    sizes: dict[str, tuple[int, int]]

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> LoRAShapes:
        hidden = int(hf["hidden_size"])
        heads = int(hf["num_attention_heads"])
        kv_heads = int(hf.get("num_key_value_heads") or heads)
        head_dim = int(hf.get("head_dim") or hidden // heads)
        inter = int(hf["intermediate_size"])
        q, kv = heads * head_dim, kv_heads * head_dim
        sizes = {
            "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden),
        }  # fmt: skip
        return cls(int(hf["num_hidden_layers"]), sizes)


@dataclass(eq=False)
class LoRAAdapter:
    """One adapter's weights; `uid` (set by the registry) is unique per loaded adapter, never reused."""

    name: str
    # (layer, projection) -> (A (r, in), B (out, r) scaled), in the base model's dtype, on the CPU
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    uid: int = 0
    path: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return max((a.shape[0] for a, _ in self.weights.values()), default=0)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())

    def same_weights(self, other: LoRAAdapter) -> bool:
        import torch

        if self.weights.keys() != other.weights.keys():
            return False
        return all(
            torch.equal(a, other.weights[k][0]) and torch.equal(b, other.weights[k][1])
            for k, (a, b) in self.weights.items()
        )


def _check_fit(
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
    shapes: LoRAShapes,
    max_rank: int,
    param: str,
    where: str,
) -> None:
    for (layer, module), (a, b) in weights.items():
        label = f"{where}layer {layer} {module}"
        if not 0 <= layer < shapes.num_layers:
            raise ParamError(f"{param}: {label}: the model has {shapes.num_layers} layers", param)
        n_in, n_out = shapes.sizes[module]
        r = a.shape[0]
        if r < 1 or r > max_rank:
            raise ParamError(
                f"{param}: {label} has rank {r}; this server takes ranks 1..{max_rank} (max_lora_rank)",
                param,
            )
        if a.shape != (r, n_in) or b.shape != (n_out, r):
            raise ParamError(
                f"{param}: {label}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit the model "
                f"(expected ({r}, {n_in}) / ({n_out}, {r}))",
                param,
            )


def _plan(
    entries: dict[str, TensorEntry], cfg: PeftConfig, shapes: LoRAShapes, max_rank: int, param: str
) -> dict[tuple[int, str], tuple[str, TensorEntry, TensorEntry]]:
    """(layer, module) -> (module path, A entry, B entry), every shape checked from the header:
    the keys, the pairs, the rank (1..max_rank, as the config says) and the model's sizes."""
    parts: dict[tuple[int, str], dict[str, TensorEntry]] = {}
    paths: dict[tuple[int, str], str] = {}
    for key, entry in entries.items():
        m = _KEY.search(key)
        if m is None or (m.group(2) not in TARGETS and m.group(2) not in FUSED):
            raise ParamError(f"{param}: adapter tensor {key!r} is not a LoRA A/B of q/k/v/o/gate/up/down_proj", param)
        layer, module = int(m.group(1)), m.group(2)
        parts.setdefault((layer, module), {})[m.group(3)] = entry
        paths[(layer, module)] = key.rsplit(".lora_", 1)[0]
    if not parts:
        raise ParamError(f"{param}: adapter_model.safetensors holds no LoRA weights", param)
    plan = {}
    for (layer, module), ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise ParamError(f"{param}: layer {layer} {module} lacks lora_{'B' if 'A' in ab else 'A'}", param)
        a, b = ab["A"].shape, ab["B"].shape
        if len(a) != 2 or len(b) != 2:
            raise ParamError(f"{param}: layer {layer} {module}: lora_A / lora_B must be matrices", param)
        if not 0 <= layer < shapes.num_layers:
            raise ParamError(f"{param}: layer {layer} {module}: the model has {shapes.num_layers} layers", param)
        r = a[0]
        if r < 1 or r > max_rank:
            raise ParamError(
                f"{param}: layer {layer} {module} has rank {r}; this server takes ranks 1..{max_rank} (max_lora_rank)",
                param,
            )
        if r != cfg.rank_of(paths[(layer, module)]):
            raise ParamError(
                f"{param}: layer {layer} {module} has rank {r}; adapter_config.json says "
                f"{cfg.rank_of(paths[(layer, module)])} (r / rank_pattern), which sets its scale",
                param,
            )
        n_in = shapes.sizes[FUSED.get(module, (module,))[0]][0]
        n_out = sum(shapes.sizes[t][1] for t in FUSED.get(module, (module,)))
        if a != (r, n_in) or b != (n_out, r):
            raise ParamError(
                f"{param}: layer {layer} {module}: lora_A {a} / lora_B {b} do not fit the model "
                f"(expected ({r}, {n_in}) / ({n_out}, {r}))",
                param,
            )
        plan[(layer, module)] = (paths[(layer, module)], ab["A"], ab["B"])
    return plan


def check_peft(
    path: str | Path, shapes: LoRAShapes, max_rank: int, param: str = "lora_path"
) -> tuple[PeftConfig, dict[tuple[int, str], tuple[str, TensorEntry, TensorEntry]]]:
    """A PEFT LoRA directory's config and tensor headers checked against the model's shapes
    (`LoRAShapes.from_hf(config.json)`): everything but the weights' values, without torch."""
    root = Path(path)
    cfg_file, weights_file = root / "adapter_config.json", root / "adapter_model.safetensors"
    if not cfg_file.is_file():
        raise ParamError(f"{param}: no adapter_config.json in {str(path)!r}", param)
    if not weights_file.is_file():
        raise ParamError(f"{param}: no adapter_model.safetensors in {str(path)!r}", param)
    cfg = read_config(cfg_file, max_rank, param)
    return cfg, _plan(read_header(weights_file, param), cfg, shapes, max_rank, param)


def load_peft(
    path: str | Path,
    shapes: LoRAShapes,
    max_rank: int,
    dtype: torch.dtype,
    name: str,
    param: str = "lora_path",
) -> LoRAAdapter:
    """Read a PEFT LoRA directory (adapter_config.json + adapter_model.safetensors): config and
    tensor headers are checked first (peft_files.py), then only the checked bytes are read; the
    scaled weights must be finite in the model's dtype."""
    import torch

    cfg, plan = check_peft(path, shapes, max_rank, param)
    weights_file = Path(path) / "adapter_model.safetensors"
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    try:
        with weights_file.open("rb") as fh:
            for (layer, module), (module_path, a_entry, b_entry) in plan.items():
                a, b = read_tensor(fh, a_entry), read_tensor(fh, b_entry)
                scale = cfg.scale(module_path, a.shape[0])
                targets = FUSED.get(module, (module,))
                outs = [shapes.sizes[t][1] for t in targets]
                for t, b_part in zip(targets, b.split(outs), strict=True):
                    if (layer, t) in weights:
                        raise ParamError(f"{param}: layer {layer} {t} is given twice", param)
                    pair = (a.to(dtype).contiguous(), (b_part * scale).to(dtype).contiguous())
                    if not (torch.isfinite(pair[0]).all() and torch.isfinite(pair[1]).all()):
                        raise ParamError(
                            f"{param}: layer {layer} {module}: weights or scale (lora_alpha {cfg.alpha:g}) are not "
                            f"finite in {dtype}",
                            param,
                        )
                    weights[(layer, t)] = pair
    except OSError as e:
        raise ParamError(f"{param}: adapter_model.safetensors is unreadable ({e})", param) from e
    _check_fit(weights, shapes, max_rank, param, "")
    meta = {"r": cfg.r, "lora_alpha": cfg.alpha, "use_rslora": cfg.rslora, "base_model": cfg.base_model}
    return LoRAAdapter(name=name, weights=weights, path=str(path), meta=meta)


def _tensor(value: Any, param: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    import torch

    try:
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ParamError(f"{param}: must be a numeric tensor or nested list ({e})", param) from e
    if t.dim() == 3 and t.shape[0] == 1:  # TensorRT-LLM's tensors carry a batch dimension of 1
        t = t[0]
    if t.dim() != 2:
        raise ParamError(
            f"{param}: must be 2-D ([rows, values]) or [1, rows, values]; got shape {tuple(t.shape)}",
            param,
        )
    return t


def from_trt(
    weights: Any, config: Any, shapes: LoRAShapes, max_rank: int, dtype: torch.dtype, name: str
) -> LoRAAdapter:
    """TensorRT-LLM's layout: `lora_config` [N, 3] rows of (module id, layer, rank D) and
    `lora_weights` [N, W] rows of A (D x in, row-major) then B (out x D), zero-padded to W."""
    import torch

    cfg = _tensor(config, "lora_config", torch.int64)
    if cfg.shape[1] != 3 or cfg.is_floating_point():
        raise ParamError("lora_config: rows of 3 integers (module id, layer, rank)", "lora_config")
    w = _tensor(weights, "lora_weights", torch.float32)
    if not w.is_floating_point():
        w = w.float()
    if w.shape[0] != cfg.shape[0]:
        raise ParamError(
            f"lora_weights: {w.shape[0]} rows for {cfg.shape[0]} lora_config rows", "lora_weights"
        )
    out: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for i, (module_id, layer, rank) in enumerate(cfg.tolist()):
        if module_id not in TRT_MODULES:
            raise ParamError(
                f"lora_config: row {i}: module id {module_id} is not one of {sorted(TRT_MODULES)}",
                "lora_config",
            )
        if not 0 <= layer < shapes.num_layers:
            raise ParamError(
                f"lora_config: row {i}: layer {layer}; the model has {shapes.num_layers}",
                "lora_config",
            )
        if not 1 <= rank <= max_rank:
            raise ParamError(
                f"lora_config: row {i}: rank {rank}; this server takes ranks 1..{max_rank} (max_lora_rank)",
                "lora_config",
            )
        targets = TRT_MODULES[module_id]
        n_in = shapes.sizes[targets[0]][0]
        outs = [shapes.sizes[t][1] for t in targets]
        need = rank * n_in + sum(outs) * rank
        if need > w.shape[1]:
            raise ParamError(
                f"lora_weights: row {i} ({'+'.join(targets)}, layer {layer}, rank {rank}) needs {need} values; rows hold {w.shape[1]}",
                "lora_weights",
            )
        a = w[i, : rank * n_in].reshape(rank, n_in)
        b = w[i, rank * n_in : need].reshape(sum(outs), rank)
        for t, b_part in zip(targets, b.split(outs), strict=True):
            if (layer, t) in out:
                raise ParamError(f"lora_config: layer {layer} {t} is given twice", "lora_config")
            out[(layer, t)] = (a.to(dtype).contiguous(), b_part.to(dtype).contiguous())
    if not out:
        raise ParamError("lora_config: no rows", "lora_config")
    if not all(torch.isfinite(a).all() and torch.isfinite(b).all() for a, b in out.values()):
        raise ParamError("lora_weights: values must be finite", "lora_weights")
    return LoRAAdapter(name=name, weights=out)


def to_trt(
    adapter: LoRAAdapter, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """An adapter in TensorRT-LLM's layout (weights [N, W], config [N, 3]), one row per projection
    (`dtype`: float32 unless given)."""
    import torch

    dtype = dtype or torch.float32
    ids = {mods[0]: i for i, mods in TRT_MODULES.items() if len(mods) == 1}
    rows, cfg = [], []
    for (layer, module), (a, b) in sorted(adapter.weights.items()):
        rows.append(torch.cat([a.flatten(), b.flatten()]).to(dtype))
        cfg.append([ids[module], layer, a.shape[0]])
    width = max(r.numel() for r in rows)
    return torch.stack(
        [torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows]
    ), torch.tensor(cfg, dtype=torch.int32)
