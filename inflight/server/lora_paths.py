"""Where a runtime LoRA load (POST /v1/load_lora_adapter) may read from: the server reads files
a client names, so the path is confined. Allowed: a directory named at start-up
(`--lora-modules`, loaded again after an unload), or one under `--lora-root`; both checked on
the path with every symlink resolved (the directory and the two files in it), and the resolved
path is what the engine reads. A relative path is taken under the root. Off by default: without
`--lora-root` only the start-up directories load."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from inflight.errors import ParamError

FILES = ("adapter_config.json", "adapter_model.safetensors")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def runtime_adapter_path(name: str, path: str, served_names: Iterable[str], root: str | None, startup: set[str]) -> str:
    """The resolved directory to load `name` from, or a ParamError naming lora_name / lora_path."""
    if name in served_names:
        raise ParamError(f"lora_name: {name!r} is the base model's name; an adapter may not hide it", "lora_name")
    given = Path(path)
    if not given.is_absolute():
        if root is None:
            raise ParamError("lora_path: must be an absolute path (no --lora-root is set)", "lora_path")
        given = Path(root) / given
    real = os.path.realpath(given)
    real_root = os.path.realpath(root) if root is not None else None
    inside = [real_root] if real_root is not None else []
    allowed = real in startup or any(_under(real, r) for r in inside)
    files_ok = all(any(_under(os.path.realpath(os.path.join(real, f)), r) for r in [*inside, real]) for f in FILES)
    if not allowed or not files_ok:
        where = f"under --lora-root {root!r}" if root is not None else "named by --lora-modules at start-up (no --lora-root is set)"
        raise ParamError(f"lora_path: {path!r} is not an adapter directory {where}", "lora_path")
    return real


def startup_paths(adapters: Iterable[tuple[str, str]]) -> set[str]:
    return {os.path.realpath(p) for _, p in adapters}
