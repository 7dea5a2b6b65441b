"""Session-wide offline checkpoints built from random weights (see inflight.testing)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inflight.testing import build_tiny_tokenizer, make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: tiny_model_dir(arch, **kwargs) -> checkpoint dir, built once per distinct arguments.

    kwargs go to make_tiny_checkpoint (seed, dtype, with_tokenizer, max_shard_size, config
    overrides).
    Tests must treat the returned directory as read-only: it is shared by the whole session.
    """
    cache: dict[tuple[str, tuple[tuple[str, str], ...]], Path] = {}

    def factory(arch: str = "llama", **kwargs: Any) -> Path:
        # repr() makes dicts (rope_scaling) and torch dtypes usable as cache keys.
        key = (arch, tuple(sorted((name, repr(value)) for name, value in kwargs.items())))
        if key not in cache:
            out_dir = tmp_path_factory.mktemp(f"tiny_{arch}")
            cache[key] = make_tiny_checkpoint(arch, out_dir, **kwargs)
        return cache[key]

    return factory
