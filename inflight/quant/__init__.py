"""Quantized weights: GGUF, AWQ / GPTQ int4, int8 (W8A8) and FP8 checkpoints, one record per weight.

`QuantWeight` (weight.py) is the seam between the format loaders (what is on disk -> records) and
the kernels (records -> products). See docs/QUANTIZATION.md.

The names below load on first use: the start-up checks read a GGUF header (gguf.py) and a
`quantization_config` (quant_config.py) before torch is imported (inflight/checkpoint.py).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["QTYPES", "QuantWeight", "block_info", "dequantize"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("inflight.quant.weight"), name)
    raise AttributeError(f"module 'inflight.quant' has no attribute {name!r}")
