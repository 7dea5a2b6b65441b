"""Finding where a JSON value ends while its text arrives in pieces.

Streaming a tool call's arguments needs to know where the arguments object
ends long before the whole output is there. `JsonScanner` tracks only what
that takes: whether we are inside a string (and just after a backslash), and
the stack of open `{` / `[`. It does not validate numbers or literals; callers
`json.loads` the finished slice for that.
"""

from __future__ import annotations

import re

_STRUCTURAL = re.compile(r'["{}\[\]]')  # the characters that change state outside strings
_STRING_STOP = re.compile(r'["\\]')  # inside a string only a quote or a backslash matters
_SCALAR_END = re.compile(r'[\s,:\[\]{}"]')  # numbers / true / false / null end at these
_NON_WS = re.compile(r"\S")


class MalformedToolCall(ValueError):
    """Call markup started but the text cannot be a well-formed call.

    `at` is the index in the parser's buffer of the character that broke it
    (or the buffer's end when the text stopped too early).
    """

    def __init__(self, message: str, at: int) -> None:
        super().__init__(message)
        self.at = at


def skip_ws(text: str, i: int) -> int:
    """Index of the first non-whitespace character at or after i (len(text) if none)."""
    m = _NON_WS.search(text, i)
    return m.start() if m else len(text)


class JsonScanner:
    """Consumes one JSON value, fed as a growing string; says where it ends."""

    __slots__ = ("_escape", "_in_string", "_scalar", "_stack", "_started")

    def __init__(self) -> None:
        self._stack: list[str] = []  # open '{' / '['
        self._in_string = False
        self._escape = False  # the previous character was a backslash inside a string
        self._scalar = False  # a bare number / true / false / null
        self._started = False

    @property
    def is_scalar(self) -> bool:
        return self._scalar

    def scan(self, text: str, i: int) -> int | None:
        """Consume text[i:], the value's next characters.

        Returns the index just past the value's last character, or None when
        the value goes on beyond len(text) (call again with the same text
        grown and i = the old len(text)). A scalar ends at the first
        character that cannot belong to it, which is not consumed.
        Raises MalformedToolCall on a closing bracket that does not match.
        """
        n = len(text)
        if not self._started and i < n:
            self._started = True
            c = text[i]
            if c == '"':
                self._in_string = True
                i += 1
            elif c in "{[":
                self._stack.append(c)
                i += 1
            else:
                self._scalar = True
        while i < n:
            if self._scalar:
                m = _SCALAR_END.search(text, i)
                return m.start() if m else None
            if self._in_string:
                if self._escape:
                    self._escape = False
                    i += 1
                    continue
                m = _STRING_STOP.search(text, i)
                if m is None:
                    return None
                i = m.end()
                if m.group() == "\\":
                    self._escape = True
                    continue
                self._in_string = False
                if not self._stack:
                    return i  # a top-level string
                continue
            m = _STRUCTURAL.search(text, i)
            if m is None:
                return None
            i = m.end()
            c = m.group()
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._stack.append(c)
            else:
                if self._stack[-1] != ("{" if c == "}" else "["):
                    raise MalformedToolCall(f"mismatched {c!r} in JSON", at=i - 1)
                self._stack.pop()
                if not self._stack:
                    return i
        return None
