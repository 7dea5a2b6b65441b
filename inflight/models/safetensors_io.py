"""Safetensors checkpoints read lazily: the files of a checkpoint directory, one tensor as a
`TensorSource` that reads only the rows or columns asked for, and every (name, source) pair.

Apart from the loader so that quantized formats (inflight/quant/) read safetensors files through
the same code without importing the loader, which imports them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from inflight.models.linear import TensorSource


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model: no .safetensors weights in {path}")
    return files


class SafetensorsSlice:
    """A `TensorSource` over one tensor of an open safetensors file: reads only what is asked."""

    def __init__(self, sf: object, name: str) -> None:
        self.name = name
        self._slice = sf.get_slice(name)  # type: ignore[attr-defined]
        self.shape = tuple(self._slice.get_shape())

    def read(self, dim: int, start: int, size: int) -> torch.Tensor:
        if dim == 0:
            return self._slice[start : start + size]  # type: ignore[no-any-return]
        return self._slice[:, start : start + size]  # type: ignore[no-any-return]


def iter_weights(path: Path, progress: bool = True) -> Iterator[tuple[str, TensorSource]]:
    files = checkpoint_files(path)
    names = []
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            names.extend((f, k) for k in sf.keys())  # noqa: SIM118 (a safetensors handle, not a dict)
    bar = tqdm(total=len(names), desc="Loading weights", unit="tensor", disable=not progress)
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118
                yield name, SafetensorsSlice(sf, name)
                bar.update(1)
    bar.close()
