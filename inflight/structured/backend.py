"""xgrammar behind one small interface: compile a constraint (cached), make per-request matchers,
and mask a batch of logits.

Compilation is the slow part (milliseconds to seconds for large schemas). The server compiles
in a worker thread before the request enters the engine (AsyncEngine.submit), so the step loop
never waits for a grammar; the offline LLM API compiles at add time. Results are cached by the
constraint's canonical text, CACHE_SIZE of them (xgrammar's own, unbounded cache is off).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import torch

from inflight.errors import ParamError
from inflight.structured.params import StructuredOutputsParams
from inflight.structured.schema_check import normalize_schema

_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
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
        # no xgrammar cache: it is unbounded by default (every distinct schema clients ever sent
        # would stay in memory for the server's life) and duplicates our LRU below
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        # xgrammar lets special tokens (e.g. <|im_start|>) into JSON strings: never allow them
        # in constrained output, except the stop tokens that end it
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        banned = special - set(stop_token_ids)
        # ... and it lets UTF-16 surrogates (ED A0..BF ..) through as characters, which decode to
        # U+FFFD: ban tokens that hold or start one (rarely needed: Hangul U+D000..D7FF split
        # across byte tokens; whole-character tokens stay allowed)
        banned |= {
            i
            for i, b in enumerate(self.info.decoded_vocab)
            if _SURROGATE.search(b) or b.endswith(b"\xed")
        }
        self.banned_ids = sorted(t for t in banned if t < vocab_size)
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
            return self.compiler.compile_structural_tag(
                value if isinstance(value, str) else json.dumps(value)
            )
        except ParamError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own types
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ParamError(f"{spec.source}: invalid {kind} constraint: {msg}", spec.source) from e

    def matcher(self, compiled: Any) -> Matcher:
        return Matcher(_xgr().GrammarMatcher(compiled), self.banned_ids)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return _xgr().allocate_token_bitmask(rows, self.vocab_size)


class Matcher:
    """One sequence's grammar state, plus the special tokens it may never emit."""

    def __init__(self, matcher: Any, banned_ids: list[int]) -> None:
        self.matcher = matcher
        self.banned_ids = banned_ids

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        return bool(self.matcher.accept_token(token_id))

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def rollback(self, num_tokens: int) -> None:
        """Take back the last tokens accepted (draft rows' masks: structured/runtime.py)."""
        self.matcher.rollback(num_tokens)


class GrammarRef:
    """A compiled grammar and the token ids constrained output never emits, as a request carries
    it to the runner (`NewRequestData.grammar`). It pickles as xgrammar's JSON (grammar and
    tokenizer info: ~60 KB for a tiny vocabulary, MBs for a 150k one) for the mp executor."""

    def __init__(self, compiled: Any, banned_ids: list[int]) -> None:
        self.compiled = compiled
        self.banned_ids = banned_ids

    def __reduce__(self) -> tuple[Any, tuple[str, str, list[int]]]:
        info = self.compiled.tokenizer_info.serialize_json()
        return (_grammar_from_json, (self.compiled.serialize_json(), info, self.banned_ids))


_INFOS: dict[str, Any] = {}  # tokenizer info JSON -> TokenizerInfo, per process


def _grammar_from_json(grammar: str, info: str, banned_ids: list[int]) -> GrammarRef:
    xgr = _xgr()
    if info not in _INFOS:
        _INFOS.clear()  # one model per process
        _INFOS[info] = xgr.TokenizerInfo.deserialize_json(info)
    return GrammarRef(xgr.CompiledGrammar.deserialize_json(grammar, _INFOS[info]), banned_ids)


def new_matcher(grammar: GrammarRef) -> Matcher:
    """A fresh matcher for one sequence."""
    return Matcher(_xgr().GrammarMatcher(grammar.compiled), grammar.banned_ids)


def choice_ebnf(choices: list[str]) -> str:
    """root ::= "a" | "b" ... (JSON string escapes are valid EBNF string escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
