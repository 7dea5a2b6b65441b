"""Structured output: grammar-constrained decoding with xgrammar (see docs/ARCHITECTURE.md)."""

from inflight.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
