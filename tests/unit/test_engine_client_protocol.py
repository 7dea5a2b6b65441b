"""`AsyncEngine` and `ReplicaRouter` are both an `EngineClient`: every member of the protocol, of
the same kind (property or method), with the same parameters (names, kinds, defaults)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.client import EngineClient
from inflight.engine.router import ReplicaRouter

MEMBERS = sorted(n for n in vars(EngineClient) if not n.startswith("_"))


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def mismatches(cls: type) -> list[str]:
    found = []
    for name in MEMBERS:
        want = inspect.getattr_static(EngineClient, name)
        try:
            got = inspect.getattr_static(cls, name)
        except AttributeError:
            found.append(f"{name}: missing")
            continue
        if isinstance(want, property) != isinstance(got, property):
            found.append(f"{name}: {'a property' if isinstance(want, property) else 'a method'} expected")
        elif not isinstance(want, property) and _params(want) != _params(got):
            found.append(f"{name}: {inspect.signature(got)} != {inspect.signature(want)}")
    return found


def test_the_protocol_is_the_whole_interface() -> None:
    assert {"make_request", "submit_all", "generate", "stats", "model_info", "load_lora_adapter"} <= set(MEMBERS)


@pytest.mark.parametrize("cls", [AsyncEngine, ReplicaRouter])
def test_clients_implement_the_protocol(cls: type) -> None:
    assert mismatches(cls) == []


def test_the_check_sees_a_difference() -> None:
    class Wrong:
        def make_request(self, prompt: Any, params: Any = None, *, request_id: str | None = None) -> Any: ...

        tokenizer = None  # not a property

    found = mismatches(Wrong)
    assert any(f.startswith("make_request: (") for f in found) and "tokenizer: a property expected" in found
    assert "submit_all: missing" in found
