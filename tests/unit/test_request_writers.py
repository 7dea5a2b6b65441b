"""Who writes `Request`: core/ (the scheduler's state) and the engine's step and output path, nowhere
else; what the client asked for is a frozen `RequestInputs`, built once by the input processor.

The scan is by attribute name: assignments to (and in-place changes of) `x.attr` where attr is one
of Request's, outside the modules allowed to make them; writes to other types' attributes of the
same name are listed in OTHER_TYPES."""

from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

import inflight
from inflight.request import Request
from inflight.request_inputs import RequestInputs
from inflight.sampling_params import SamplingParams

ROOT = Path(inflight.__file__).parent
WRITERS = (
    "request.py",  # its own methods
    "core/",  # scheduler state: computed tokens, blocks, status, drafts, stop checks
    "engine/step_loop.py",  # the step loop
    "engine/sequences.py",  # its output path: a failed request's error, on every sequence of it
    "engine/input_processor.py",  # builds the inputs (the grammar is compiled last)
    "spec_decode/proposer.py",  # the step's own drafts, set before it schedules (scheduler state)
)
# writes to attributes of other types that share a name with one of Request's
OTHER_TYPES = {
    "bench/client.py: result.error",  # a benchmark's RequestResult
    "bench/client.py: result.finish_reason",
    "worker/sampling.py: result.grammar_terminated",  # ModelRunnerOutput
    "worker/input_batch.py: req.all_token_ids",  # the runner's own RunnerRequest
    "worker/one_decode.py: req.all_token_ids",  # the same (append_sampled's, for a lone greedy stream)
    "worker/model_runner.py: result.draft_token_ids",  # ModelRunnerOutput: the draft model's proposals
}
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "__setitem__", "sort"}


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = []
        for t in node.targets:
            found += t.elts if isinstance(t, ast.Tuple) else [t]
        return found
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
        return [node.func.value]  # request.output_token_ids.append(...)
    return []


def request_attrs() -> set[str]:
    """What Request sets on self, and its properties (the inputs' fields it reads through)."""
    tree = ast.parse((ROOT / "request.py").read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Request")
    names = {f.name for f in cls.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
    for node in ast.walk(cls):
        for t in _targets(node):
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)
    return names - {"from_inputs", "sort_key", "append_token", "finish"}


def _modules() -> list[tuple[str, ast.AST]]:
    return [(str(p.relative_to(ROOT)), ast.parse(p.read_text())) for p in sorted(ROOT.rglob("*.py"))]


def writes_outside(attrs: set[str]) -> list[str]:
    """`name.attr = ...` (or name.attr[i] = ..., name.attr.append(...)) outside the writers, for a
    Request attribute name; `self.attr` is a class's own state, never a Request's."""
    found = []
    for path, tree in _modules():
        if path.startswith(WRITERS):
            continue
        for node in ast.walk(tree):
            for t in _targets(node):
                while isinstance(t, ast.Subscript):
                    t = t.value
                if isinstance(t, ast.Attribute) and t.attr in attrs and isinstance(t.value, ast.Name):
                    where = f"{path}: {ast.unparse(t)}"
                    if t.value.id != "self" and where not in OTHER_TYPES:
                        found.append(f"{path}:{node.lineno}: {ast.unparse(t)}")
    return found


def test_only_core_and_the_engine_step_write_requests() -> None:
    attrs = request_attrs()
    assert {"inputs", "num_computed_tokens", "output_token_ids", "held", "params", "cache_salt", "lora"} <= attrs
    assert sorted(writes_outside(attrs)) == []


def test_the_scan_sees_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write from the server would be found (a check that can't fail proves nothing)."""
    attrs = request_attrs()
    tree = ast.parse("def f(r):\n    r.inputs = None\n    r.output_token_ids.append(3)\n    r.block_ids[0] = 1\n")
    monkeypatch.setattr(__import__(__name__), "_modules", lambda: [("server/x.py", tree)])
    assert sorted(writes_outside(attrs)) == [
        "server/x.py:2: r.inputs",
        "server/x.py:3: r.output_token_ids",
        "server/x.py:4: r.block_ids",
    ]


def test_inputs_are_frozen_shared_and_pickle() -> None:
    params = SamplingParams(max_tokens=4, bad_words_ids=[[7]])
    inputs = RequestInputs([1, 2, 3], params, cache_salt=b"s", draft_token_ids=(4,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.priority = 1  # type: ignore[misc]
    a = Request.from_inputs("a#0", inputs)
    b = Request.from_inputs("a#1", inputs, seq_index=1, parent_id="a#0")
    assert a.inputs is b.inputs and b.held and a.bad_words_ids == [[7]]
    with pytest.raises(AttributeError):
        a.cache_salt = b"x"  # type: ignore[misc]  # read-only: it belongs to the inputs
    a.append_token(9)
    assert b.all_token_ids == [1, 2, 3] and a.draft_token_ids == [4]  # state is each sequence's own
    back = pickle.loads(pickle.dumps(inputs))
    assert (back.prompt_token_ids, back.cache_salt, back.bad_words_ids, back.draft_token_ids) == ([1, 2, 3], b"s", [[7]], (4,))
    assert inputs.sequence_seed(1) is None and RequestInputs([1], SamplingParams(seed=2**64 - 1)).sequence_seed(1) == 0
