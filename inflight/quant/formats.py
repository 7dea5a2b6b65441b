"""Which quantized format a checkpoint is in, and how the loader reads it.

`open_quantized(cfg)` returns None for a plain full-precision checkpoint (the loader's usual
safetensors path), else a `QuantizedCheckpoint`:

  quantized_names   the HF weight names kept quantized: their layers get `QuantLinear` before
                    the model leaves the meta device, so no float weight is ever allocated
  weights()         (HF name, source) pairs: float sources for norms / embeddings / float layers,
                    quantized ones (`read_quant`) for the rest
  rtn               "i8c" / "f8c": float layers quantized at load (`--quantization int8|fp8`)

Formats: GGUF (inflight/quant/gguf.py) and, with `--quantization`, any safetensors checkpoint.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from inflight.checkpoint import check_quantization
from inflight.models.linear import LinearBase, linear_layers
from inflight.quant.embedding import QuantEmbedding
from inflight.quant.linear import QuantLinear

logger = logging.getLogger(__name__)

RTN = {"int8": "i8c", "fp8": "f8c"}  # --quantization -> the layout a float weight becomes


class QuantizedCheckpoint:
    def __init__(self, names: set[str], weights: Any, rtn: str | None = None, what: str = "") -> None:
        self.quantized_names = names
        self._weights = weights  # () -> iterator of (HF name, source)
        self.rtn = rtn
        self.what = what  # for the log line: "GGUF", "int8 (quantized at load)"
        self._embedding: Any = None

    def weights(self) -> Iterator[tuple[str, Any]]:
        for name, src in self._weights():
            if name == "model.embed_tokens.weight" and getattr(src, "quantized", False):
                self._embedding = src  # a tied lm_head's quantized weight (see prepare)
            yield name, src

    def prepare(self, model: nn.Module) -> None:
        """Give the quantized layers `QuantLinear` and drop their (meta) float weights. Under
        `rtn` every decoder linear layer is quantized, never the lm_head (as vLLM does). A
        quantized token embedding stays quantized (`QuantEmbedding`: lookups dequantize their rows)."""
        if "model.embed_tokens.weight" in self.quantized_names:
            inner = model.model  # type: ignore[attr-defined]
            inner.embed_tokens = QuantEmbedding.replacing(inner.embed_tokens)
        for prefix, layer in model.named_modules():
            if isinstance(layer, LinearBase) and layer.tied and "model.embed_tokens.weight" in self.quantized_names:
                # llama.cpp multiplies a tied output by the file's blocks: so do we, with the
                # embedding's own QuantWeight (one copy of the bytes, see finish)
                layer.method = QuantLinear()
                continue
            if not isinstance(layer, LinearBase) or layer.tied:
                continue
            names = [n for n, param, _ in layer.checkpoint_tensors(prefix) if param == "weight"]
            rtn = self.rtn is not None and ".layers." in f".{prefix}"
            if rtn or any(n in self.quantized_names for n in names):
                layer.method = QuantLinear(self.rtn)
                layer.drop_weight()

    def finish(self, model: nn.Module, device: torch.device) -> None:
        """After loading: each quantized layer joins its parts (the fast paths skip these layers)
        and moves them to the model's device."""
        for layer in linear_layers(model):
            if isinstance(layer.method, QuantLinear):
                shared = None
                if layer.tied and self._embedding is not None:  # this rank's rows, as its embedding's
                    embed = model.model.embed_tokens  # type: ignore[attr-defined]
                    if isinstance(embed, QuantEmbedding) and embed.qweight is not None \
                            and embed.qweight.shape == (layer.out_features, layer.in_features):  # fmt: skip
                        layer.method.parts[None] = embed.qweight  # the same bytes, not a second copy
                        shared = embed
                    else:
                        layer.method.load_weight(layer, self._embedding, None)
                layer.method.process_weights_after_loading(layer, device)  # no regroup for a GPU
                if shared is not None:  # the layout it took at load (q5_0g, q4_0g), for the lookups too: one copy still
                    shared.qweight = layer.method.weights[0]
                if device.type != "cpu":
                    layer.method.to(device)

    def summary(self, model: nn.Module) -> str:
        """`GGUF: 14 q8_0, 2 q6_k (12.3 MiB)` for the load log line."""
        kinds: Counter[str] = Counter()
        nbytes = 0
        for layer in linear_layers(model):
            method = getattr(layer.method, "base", layer.method)  # under a LoRA wrapper
            if isinstance(method, QuantLinear):
                kinds.update(w.qtype + ("+a8" if w.act_int8 else "") for w in method.weights)
                nbytes += method.nbytes
        parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        return f"{self.what}: {parts} ({nbytes / 2**20:.1f} MiB)"


def open_quantized(path: str | Path, hf_config: dict[str, Any], quantization: str | None) -> QuantizedCheckpoint | None:
    """The checkpoint at `path` as a quantized one, or None (plain safetensors)."""
    from inflight.quant import gguf

    if gguf.is_gguf(path):
        check_quantization("GGUF", quantization, Path(path).name)
        ckpt = gguf.GGUFCheckpoint(path)
        return QuantizedCheckpoint(ckpt.quantized_names(), ckpt.weights, what="GGUF")
    qc = hf_config.get("quantization_config")
    if qc is not None:
        from inflight.quant.safetensors_formats import QuantConfig, SafetensorsQuantCheckpoint

        check_quantization(str(qc.get("quant_method")), quantization, Path(path).name)
        spec = QuantConfig(qc)
        st = SafetensorsQuantCheckpoint(Path(path), spec)
        return QuantizedCheckpoint(st.quantized_names(), st.weights, what=spec.method)
    if quantization is None:
        return None
    if quantization not in RTN:
        raise ValueError(f"quantization: {quantization!r}; use {' | '.join(RTN)}")
    from inflight.models.safetensors_io import iter_weights

    return QuantizedCheckpoint(set(), lambda: iter_weights(Path(path)), rtn=RTN[quantization],
                               what=f"{quantization} (quantized at load, per channel)")  # fmt: skip
