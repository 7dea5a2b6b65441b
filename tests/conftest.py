"""Session-wide offline checkpoints built from random weights (see inflight.testing).

`--device cuda` (or INFLIGHT_TEST_DEVICE=cuda) runs the device-parametrised tests (the HF parity
suite, tests/model/test_gpu_paths.py) on the GPU; the default is the CPU. Without a GPU the Triton
kernels run in Triton's CPU interpreter, which must be chosen before anything imports triton.
"""

from __future__ import annotations

import os
import sys

if not os.environ.get("INFLIGHT_TEST_DEVICE", "cpu").startswith("cuda") and "--device=cuda" not in sys.argv and "cuda" not in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable  # noqa: E402
from pathlib import Path
from typing import Any

import pytest  # noqa: E402

from inflight.testing import build_tiny_tokenizer, make_tiny_checkpoint, make_tiny_vl_checkpoint


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


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: tiny_vl_dir(arch, **kwargs) -> a tiny random Qwen2-VL / Qwen2.5-VL checkpoint
    (inflight.testing.make_tiny_vl_checkpoint), built once per distinct arguments; read-only."""
    cache: dict[tuple[str, tuple[tuple[str, str], ...]], Path] = {}

    def factory(arch: str = "qwen2_vl", **kwargs: Any) -> Path:
        key = (arch, tuple(sorted((name, repr(value)) for name, value in kwargs.items())))
        if key not in cache:
            cache[key] = make_tiny_vl_checkpoint(arch, tmp_path_factory.mktemp(f"tiny_{arch}"), **kwargs)
        return cache[key]

    return factory


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default=os.environ.get("INFLIGHT_TEST_DEVICE", "cpu"),
        help="cpu | cuda: where the device-parametrised tests run the engine and HF",
    )


@pytest.fixture(scope="session")
def test_device(request: pytest.FixtureRequest) -> str:
    device = str(request.config.getoption("--device"))
    if device.startswith("cuda"):
        import torch

        assert torch.cuda.is_available(), "--device cuda: no CUDA device visible"
    return device
