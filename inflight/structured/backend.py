"""xgrammar behind one small interface: compile a constraint (cached), make per-request matchers,
and mask a batch of logits.

Compilation is the slow part (milliseconds to seconds for large schemas). The server compiles
in a worker thread before the request enters the engine (AsyncEngine.submit), so the step loop
never waits for a grammar; the offline LLM API compiles at add time. Results are cached by the
constraint's canonical text (xgrammar's compiler keeps its own cache as well).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import torch

from inflight.errors import ParamError
from inflight.structured.params import StructuredOutputsParams
from inflight.structured.schema_check import normalize_schema

CACHE_SIZE = 256  # compiled grammars kept (LRU)


def _xgr() -> Any:
    import xgrammar

    return xgrammar


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        xgr = _xgr()
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=True)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The CompiledGrammar for `spec`; ParamError (naming spec.source) when it is invalid."""
        key = spec.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        compiled = self._compile(spec)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: StructuredOutputsParams) -> Any:
        kind, value = spec.kind, getattr(spec, spec.kind)
        try:
            if kind == "json":
                schema = json.loads(value) if isinstance(value, str) else value
                schema = normalize_schema(schema, spec.source)
                return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            if kind == "json_object":
                return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return self.compiler.compile_regex(value)
            if kind == "choice":
                return self.compiler.compile_grammar(choice_ebnf(value))
            if kind == "grammar":
                return self.compiler.compile_grammar(value)
            return self.compiler.compile_structural_tag(value if isinstance(value, str) else json.dumps(value))
        except ParamError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own types
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ParamError(f"{spec.source}: invalid {kind} constraint: {msg}", spec.source) from e

    def matcher(self, compiled: Any) -> Any:
        return _xgr().GrammarMatcher(compiled)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return _xgr().allocate_token_bitmask(rows, self.vocab_size)


def choice_ebnf(choices: list[str]) -> str:
    """root ::= "a" | "b" ... (JSON string escapes are valid EBNF string escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set the logits of disallowed tokens to -inf in `rows` (bitmask has one row per logits row)."""
    _xgr().apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=logits.shape[-1], indices=rows)
