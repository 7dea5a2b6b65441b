"""The markup of each tool-call format, as states around the shared reader in stream.py.

hermes       text <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call> ...
llama3_json  text <|python_tag|>{"name": "f", "parameters": {...}}; {...}
             (or without the tag: a {"name": ...} object starts a call)
mistral      text [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]      (tokenizer < v11)
             text [TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}         (v11+; [ARGS]
             may be missing when decoding skipped it; an optional [CALL_ID]id is ignored)
"""

from __future__ import annotations

import re

from inflight.tools.json_scan import MalformedToolCall, skip_ws
from inflight.tools.stream import ToolStreamParser, literal_partial

# ---------------------------------------------------------------------- hermes
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


class HermesStreamParser(ToolStreamParser):
    def _find_trigger(self, text: str) -> tuple[int, int, str] | None:
        i = text.find(HERMES_OPEN)
        return None if i < 0 else (i, i + len(HERMES_OPEN), "open")

    def _partial_len(self, text: str) -> int:
        return literal_partial(text, HERMES_OPEN)

    def _on_trigger(self, start: int, end: int, kind: str) -> None:
        self._markup_seen = True
        self._pos, self._state = end, "hermes_open"

    def _st_hermes_open(self, eof: bool) -> bool:
        i = self._next_char(eof, "unclosed <tool_call>")
        if i is None:
            return False
        if self._buf[i] != "{":
            raise MalformedToolCall("expected a JSON object after <tool_call>", at=i)
        self._begin_object(i, after="hermes_close")
        return True

    def _st_hermes_close(self, eof: bool) -> bool:
        i = skip_ws(self._buf, self._pos)
        rest = self._buf[i:]
        if rest.startswith(HERMES_CLOSE):
            self._pos, self._state = i + len(HERMES_CLOSE), "content"
            return True
        if not HERMES_CLOSE.startswith(rest):
            raise MalformedToolCall("expected </tool_call>", at=i)
        if eof:  # the object is complete and only the closing tag is cut off: keep the call
            self._pos, self._state = len(self._buf), "content"
            return True
        self._pos = i
        return False


# ---------------------------------------------------------------------- llama3_json
PYTHON_TAG = "<|python_tag|>"
# A bare object opening with "name" (or "type": Llama 3.2 often writes "type": "function" first).
_LLAMA_TRIGGER = re.compile(r'<\|python_tag\|>|\{\s*"(?:name|type)"')
_LLAMA_PARTIAL = re.compile(r'\{\s*(?:"(?:n(?:a(?:m(?:e)?)?)?|t(?:y(?:p(?:e)?)?)?)?)?\Z')


class Llama3JsonStreamParser(ToolStreamParser):
    """A bare object is only tentatively a call: until its name and arguments have
    started it may still turn out to be ordinary JSON, which then stays content."""

    def __init__(self) -> None:
        super().__init__()
        self._tagged = False  # the open state follows <|python_tag|> (not ';')

    def _find_trigger(self, text: str) -> tuple[int, int, str] | None:
        m = _LLAMA_TRIGGER.search(text)
        if m is None:
            return None
        return m.start(), m.end(), "tag" if m.group() == PYTHON_TAG else "object"

    def _partial_len(self, text: str) -> int:
        m = _LLAMA_PARTIAL.search(text)
        return max(len(text) - m.start() if m else 0, literal_partial(text, PYTHON_TAG))

    def _on_trigger(self, start: int, end: int, kind: str) -> None:
        if kind == "tag":
            self._markup_seen, self._tagged = True, True
            self._pos, self._state = end, "llama_open"
        else:
            self._begin_object(start, after="llama_after", tentative=True)

    def _st_llama_open(self, eof: bool) -> bool:
        if eof and not self._tagged and skip_ws(self._buf, self._pos) == len(self._buf):
            self._pos, self._state = len(self._buf), "content"  # a trailing ';' is harmless
            return True
        i = self._next_char(eof, f"no tool call after {PYTHON_TAG}")
        if i is None:
            return False
        if self._buf[i] != "{":
            raise MalformedToolCall("expected a JSON object", at=i)
        self._begin_object(i, after="llama_after")
        return True

    def _st_llama_after(self, eof: bool) -> bool:
        i = skip_ws(self._buf, self._pos)
        if i == len(self._buf) and not eof:
            return False
        if i < len(self._buf) and self._buf[i] == ";":  # parallel calls: {...}; {...}
            self._pos, self._state, self._tagged = i + 1, "llama_open", False
        else:
            self._state = "content"  # whitespace stays with the content (dropped at the end)
        return True


# ---------------------------------------------------------------------- mistral
TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_MISTRAL_NAME = re.compile(r'[^\s\[\]{}"]*')  # v11+ function name (or call id)


class MistralStreamParser(ToolStreamParser):
    def __init__(self) -> None:
        super().__init__()
        self._fn_name = ""
        self._first_item = True

    def _find_trigger(self, text: str) -> tuple[int, int, str] | None:
        i = text.find(TOOL_CALLS)
        return None if i < 0 else (i, i + len(TOOL_CALLS), "calls")

    def _partial_len(self, text: str) -> int:
        return literal_partial(text, TOOL_CALLS)

    def _on_trigger(self, start: int, end: int, kind: str) -> None:
        self._markup_seen = True
        self._pos, self._state = end, "mistral_start"

    def _st_mistral_start(self, eof: bool) -> bool:
        i = self._next_char(eof, f"no tool call after {TOOL_CALLS}")
        if i is None:
            return False
        if self._buf[i] == "[":  # pre-v11: a JSON list of call objects
            self._pos, self._state, self._first_item = i + 1, "list_item", True
        else:
            self._state = "mistral_name"
        return True

    def _read_word(self, eof: bool) -> str | None:
        """A run of name characters at pos; None while it may still grow."""
        m = _MISTRAL_NAME.match(self._buf, self._pos)
        end = m.end() if m else self._pos  # (the pattern matches the empty string too)
        if end == len(self._buf) and not eof:
            return None
        word, self._pos = self._buf[self._pos : end], end
        return word

    def _st_mistral_name(self, eof: bool) -> bool:
        name = self._read_word(eof)
        if name is None:
            return False
        if not name:
            raise MalformedToolCall(f"no function name after {TOOL_CALLS}", at=self._pos)
        self._fn_name, self._state = name, "mistral_marker"
        return True

    def _st_mistral_marker(self, eof: bool) -> bool:
        """After the name (or call id): [CALL_ID], [ARGS] or straight to the arguments."""
        i = self._next_char(eof, "truncated tool call")
        if i is None:
            return False
        rest = self._buf[i:]
        if rest.startswith("{"):
            self._begin_bare_args(i, self._fn_name)
        elif rest.startswith(ARGS):
            self._pos = i + len(ARGS)
        elif rest.startswith(CALL_ID):
            self._pos, self._state = i + len(CALL_ID), "mistral_call_id"
        elif not eof and (ARGS.startswith(rest) or CALL_ID.startswith(rest)):
            return False
        else:
            raise MalformedToolCall("expected the arguments object", at=i)
        return True

    def _st_mistral_call_id(self, eof: bool) -> bool:
        if self._next_char(eof, "truncated tool call") is None or self._read_word(eof) is None:
            return False
        self._state = "mistral_marker"  # the model's call id is ignored: ids are ours
        return True

    def _st_list_item(self, eof: bool) -> bool:
        i = self._next_char(eof, f"unterminated {TOOL_CALLS} list")
        if i is None:
            return False
        ch = self._buf[i]
        if ch == "{":
            self._begin_object(i, after="list_after")
        elif ch == "]" and self._first_item:
            self._pos, self._state = i + 1, "content"
        else:
            raise MalformedToolCall(f"expected a call object in the {TOOL_CALLS} list", at=i)
        self._first_item = False
        return True

    def _st_list_after(self, eof: bool) -> bool:
        i = skip_ws(self._buf, self._pos)
        if i == len(self._buf):
            if eof:  # only the closing ']' is cut off: keep the calls
                self._pos, self._state = i, "content"
                return True
            return False
        if self._buf[i] not in ",]":
            raise MalformedToolCall(f"expected ',' or ']' in the {TOOL_CALLS} list", at=i)
        self._pos = i + 1
        self._state = "list_item" if self._buf[i] == "," else "content"
        return True
