"""An EAGLE head's config.json checked against the target's, without torch (the CLI checks its
flags before torch loads: engine/args.py). Every error names the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIELD = "speculative_config.model"
_HEAD_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


def head_config(path: str, target_hf: dict[str, Any], eagle3: bool) -> dict[str, Any]:
    """The head's config.json, checked against the target's: one start-up error naming the field."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"{FIELD}: no config.json in {path}")
    hf = json.loads(file.read_text())
    arch = (hf.get("architectures") or ["LlamaForCausalLM"])[0]
    if not eagle3 and "eagle3" in arch.lower():
        raise ValueError(f"speculative_config.method: eagle, but {path} is an EAGLE-3 head ({arch}); use eagle3")
    hidden, want = hf.get("hidden_size"), int(target_hf["hidden_size"])
    if (hf.get("target_hidden_size") or hidden) != want or (not eagle3 and hidden != want):
        raise ValueError(f"{FIELD}: hidden_size {hidden} does not match the target's {want}")
    if hf.get("vocab_size") != target_hf.get("vocab_size"):
        raise ValueError(f"{FIELD}: vocab_size {hf.get('vocab_size')}, the target's is {target_hf.get('vocab_size')}")
    if hf.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"{FIELD}: num_hidden_layers {hf['num_hidden_layers']}; EAGLE heads have one layer")
    lacking = [k for k in _HEAD_FIELDS if not isinstance(hf.get(k), int)]
    if lacking:
        raise ValueError(f"{FIELD}: config.json lacks {lacking}")
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"{FIELD}: hidden_act {hf['hidden_act']!r} is not supported (silu only)")
    return {**hf, "num_hidden_layers": 1}


def aux_layers(hf: dict[str, Any], target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's target layers (their inputs: the residual stream after the layer before): the
    config's eagle_aux_hidden_state_layer_ids, else vLLM's (2, L // 2, L - 3)."""
    ids = hf.get("eagle_aux_hidden_state_layer_ids") or (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = tuple(ids) if ids else (2, target_layers // 2, target_layers - 3)
    if len(ids) != 3 or not all(isinstance(i, int) and 0 <= i < target_layers for i in ids):
        raise ValueError(f"{FIELD}: eagle_aux_hidden_state_layer_ids {list(ids)}: three layers of the target's {target_layers}")
    return ids


