"""Strict readers for JSON request fields: wrong types are errors, never coerced.

Every reader raises `ParamError(param=name)`, which the app turns into a 400 with the
OpenAI error body. JSON booleans are not numbers here (`"stream": 0` and `"n": true`
are both rejected), and absent or null fields give the default.
"""

from __future__ import annotations

import json
import re
from typing import Any

from inflight.sampling_params import ParamError

_MISSING = object()
MAX_TOKENS = 2**31 - 1  # an int32, as OpenAI's and Anthropic's schemas: 1e308 is a 400, not a number echoed back
_TOKEN_ID_KEY = re.compile(r"-?[0-9]{1,10}", re.ASCII)  # "²" is a digit to str.isdigit, not to int()
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how a lone surrogate reaches a JSON body
# serde_json's default limit. Deeper bodies passed json.loads but failed later: a tool schema of
# 600 levels in copy.deepcopy (RecursionError), a Responses text.format of 300 echoed back in
# pydantic's serializer (PydanticSerializationError): 500s
MAX_DEPTH = 128
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_EMPTY_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; anything Python's parser or our tokenizers can't take is a
    400: invalid JSON or UTF-8, integers over 4300 digits, nesting deeper than MAX_DEPTH,
    lone UTF-16 surrogates (`"\\ud800"`: the tokenizers raise on them) in any field."""
    try:
        body = json.loads(raw)
    except RecursionError as e:
        raise ParamError("body: JSON nested too deeply", "body") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise ParamError(f"body: invalid JSON ({e})", "body") from e
    if not isinstance(body, dict):
        raise ParamError("body: must be a JSON object", "body")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _too_deep(raw, body):  # the count: most bodies skip the walk
        raise ParamError(f"body: JSON nested deeper than {MAX_DEPTH} levels", "body")
    if _SURROGATE_ESCAPE.search(raw):  # rare: only then pay for a check of the whole body
        _check_surrogates(body)
    return body


def _too_deep(raw: bytes, body: dict[str, Any]) -> bool:
    """Nested deeper than MAX_DEPTH. Whichever check is cheaper for this body: a walk over the
    parsed body costs per element (as long as json.loads on 2,048 x 512 token ids), the bracket
    scan per byte (twice json.loads on a 50 MB base64 string); one comma per 30 bytes is about even."""
    if raw.count(b",") * 30 < len(raw):
        level: list[Any] = [body]
        for _ in range(MAX_DEPTH):  # level by level, no recursion
            level = [c for x in level for c in (x.values() if isinstance(x, dict) else x) if isinstance(c, (dict, list))]
            if not level:
                return False
        return True
    # the brackets outside strings; each pass drops the innermost pairs, so MAX_DEPTH passes empty
    # any body that deep or less
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        brackets = _EMPTY_PAIR.sub(b"", brackets)  # one scan: "{[]}" loses one level per pass, not two
        if not brackets:
            return False
    return True


def _check_surrogates(body: dict[str, Any]) -> None:
    for key, value in body.items():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as e:  # the key can't be echoed in the (UTF-8) error body either
            raise ParamError("body: a field name contains a lone UTF-16 surrogate", "body") from e
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ParamError(f"{key}: contains a lone UTF-16 surrogate (not valid Unicode text)", key) from e


def _get(body: dict[str, Any], name: str) -> Any:
    value = body.get(name, _MISSING)
    return _MISSING if value is None else value


def _fail(name: str, what: str) -> ParamError:
    return ParamError(f"{name}: must be {what}", name)


def get_bool(body: dict[str, Any], name: str, default: bool | None = None) -> bool | None:
    v = _get(body, name)
    if v is _MISSING:
        return default
    if not isinstance(v, bool):
        raise _fail(name, "a boolean")
    return v


def get_int(
    body: dict[str, Any], name: str, default: int | None = None, lo: int | None = None, hi: int | None = None
) -> int | None:
    v = _get(body, name)
    if v is _MISSING:
        return default
    if isinstance(v, float) and v.is_integer():  # 3.0: JSON Schema's integer, as pydantic reads it
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(name, "an integer")
    _check_range(name, v, lo, hi)
    return v


def get_float(
    body: dict[str, Any],
    name: str,
    default: float | None = None,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> float | None:
    v = _get(body, name)
    if v is _MISSING:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(name, "a number")
    try:
        v = float(v)
    except OverflowError as e:  # an integer literal beyond the float range
        raise _fail(name, "a finite number") from e
    if v != v or v in (float("inf"), float("-inf")):
        raise _fail(name, "a finite number")
    if lo_open and lo is not None and (v <= lo or (hi is not None and v > hi)):
        bound = f"> {number(lo)}" if hi is None else f"in ({number(lo)}, {number(hi)}]"
        raise ParamError(f"{name}: must be {bound}, got {number(v)}", name)
    _check_range(name, v, None if lo_open else lo, hi)
    return v


def _check_range(name: str, v: float, lo: float | None, hi: float | None) -> None:
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        if lo is None:
            bound = f"<= {number(hi)}"  # type: ignore[arg-type]
        elif hi is None:
            bound = f">= {number(lo)}"
        else:
            bound = f"in [{number(lo)}, {number(hi)}]"
        raise ParamError(f"{name}: must be {bound}, got {number(v)}", name)


def number(v: float) -> str:
    """A number as a person writes it: integers in full (2**64 - 1, not 1.84467e+19), floats short."""
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 2**63):
        return str(int(v))
    return repr(float(v))


def get_str(body: dict[str, Any], name: str, default: str | None = None) -> str | None:
    v = _get(body, name)
    if v is _MISSING:
        return default
    if not isinstance(v, str):
        raise _fail(name, "a string")
    return v


def get_dict(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    v = _get(body, name)
    if v is _MISSING:
        return None
    if not isinstance(v, dict):
        raise _fail(name, "an object")
    return v


def get_list(body: dict[str, Any], name: str) -> list[Any] | None:
    v = _get(body, name)
    if v is _MISSING:
        return None
    if not isinstance(v, list):
        raise _fail(name, "an array")
    return v


def integers(v: Any) -> list[int] | None:
    """`v` as ints if it is an array of JSON integers (3.0 counts, as in get_int), else None."""
    if not isinstance(v, list):
        return None
    out = []
    for t in v:
        if isinstance(t, float) and t.is_integer() and abs(t) < 2**63:
            t = int(t)
        if isinstance(t, bool) or not isinstance(t, int):
            return None
        out.append(t)
    return out


def get_int_list(body: dict[str, Any], name: str) -> list[int] | None:
    v = get_list(body, name)
    if v is None:
        return None
    ids = integers(v)
    if ids is None or any(t < 0 for t in ids):
        raise _fail(name, "an array of non-negative integers")
    return ids


def get_stop(body: dict[str, Any], name: str = "stop") -> list[str]:
    """A string or an array of strings; each non-empty, 32768 characters in all at most."""
    v = _get(body, name)
    if v is _MISSING:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _fail(name, "a string or an array of strings")
    if any(s == "" for s in stops):
        raise ParamError(f"{name}: stop strings must be non-empty", name)
    if sum(len(s) for s in stops) > 32768:
        raise ParamError(f"{name}: total length must be <= 32768 characters", name)
    return stops


def get_bad_words(body: dict[str, Any], name: str = "bad_words") -> list[str | list[int]] | None:
    """Words never generated: a string, or an array of strings and token-id arrays (SPEC §1)."""
    v = _get(body, name)
    if v is _MISSING:
        return None
    words = [v] if isinstance(v, str) else v
    ok = isinstance(words, list) and all(
        (isinstance(w, str) and w)
        or (isinstance(w, list) and w and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in w))
        for w in words
    )
    if not ok:
        raise _fail(name, "a string or an array of non-empty strings and token-id arrays")
    return words or None


def get_logit_bias(body: dict[str, Any], name: str = "logit_bias") -> dict[int, float] | None:
    v = get_dict(body, name)
    if v is None:
        return None
    out = {}
    for k, bias in v.items():
        if not (isinstance(k, str) and _TOKEN_ID_KEY.fullmatch(k)) or isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise _fail(name, "an object mapping token ids to numbers")
        if not -100 <= bias <= 100:
            raise ParamError(f"{name}: biases must be in [-100, 100]", name)
        out[int(k)] = float(bias)
    return out


class ModelNotFound(Exception):
    """A model name the server does not serve (404, param "model")."""
