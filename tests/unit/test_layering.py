"""The runner side never touches scheduler state: worker/, models/, sample/ and structured/
import nothing from request.py or core/ (the two messages of outputs.py are the contract)."""

from __future__ import annotations

import ast
from pathlib import Path

import inflight

ROOT = Path(inflight.__file__).parent
RUNNER_SIDE = ("worker", "models", "sample", "structured")
FORBIDDEN = ("inflight.request", "inflight.core", "inflight.engine")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_runner_side_imports_no_scheduler_state() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for folder in RUNNER_SIDE
        for path in sorted((ROOT / folder).glob("*.py"))
        for name in _imports(path)
        if name.startswith(FORBIDDEN)
    ]
    assert not offenders, offenders


def test_the_check_sees_imports() -> None:
    """The walker finds both import forms (a check that could never fail would prove nothing)."""
    sched = ROOT / "core" / "scheduler.py"
    assert "inflight.request" in _imports(sched) and "inflight.outputs" in _imports(sched)
