"""The draft side's ModelConfig, built from the target's once the option is parsed and checked.

Its own module so that `spec_decode/config.py` (parsed and checked before torch, imported by
`inflight/config.py`) never needs `ModelConfig` back: this one imports both, neither imports it.
"""

from __future__ import annotations

from dataclasses import replace

from inflight.checkpoint import Checkpoint
from inflight.config import ModelConfig
from inflight.spec_decode.config import SpeculativeConfig


def resolve(spec: SpeculativeConfig, target: ModelConfig) -> SpeculativeConfig:
    """`spec` with the draft's ModelConfig (a draft model: same dtype, device and length as the
    target; an EAGLE head: its config checked against the target's, and the aux layers), after
    `check_draft`; n-gram needs none."""
    if spec.method in ("eagle", "eagle3"):
        return _resolve_eagle(spec, target)
    if spec.method != "draft_model":
        return spec
    spec.check_draft(Checkpoint(target.path, target.hf_config), target.max_model_len)
    draft = ModelConfig.from_path(spec.model, dtype=target.dtype, device=str(target.device),  # type: ignore[arg-type]
                                  max_model_len=target.max_model_len, cpu_fast_path=target.cpu_fast_path,
                                  attention_backend=target.attention_backend, enforce_eager=True)  # fmt: skip
    return replace(spec, draft=draft)


def _resolve_eagle(spec: SpeculativeConfig, target: ModelConfig) -> SpeculativeConfig:
    hf, aux = spec.eagle_head(target, 1)
    head = ModelConfig(path=str(spec.model), hf_config=hf, dtype=target.dtype, device=target.device,
                       max_model_len=target.max_model_len, eos_token_ids=target.eos_token_ids,
                       attention_backend=target.attention_backend, enforce_eager=True)  # fmt: skip
    return replace(spec, draft=head, aux_layers=aux, target_path=str(target.path))
