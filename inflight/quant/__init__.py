"""Quantized weights: GGUF, AWQ / GPTQ int4, int8 (W8A8) and FP8 checkpoints, one record per weight.

`QuantWeight` (weight.py) is the seam between the format loaders (what is on disk -> records) and
the kernels (records -> products). See docs/QUANTIZATION.md.
"""

from inflight.quant.weight import QTYPES, QuantWeight, block_info, dequantize

__all__ = ["QTYPES", "QuantWeight", "block_info", "dequantize"]
