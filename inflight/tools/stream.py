"""The incremental tool-call parser that every format shares.

One `ToolStreamParser` reads one generation. `feed()` appends text to a
buffer and runs a small state machine as far as the buffer allows; every
decision it takes depends only on text already seen, never on where the
pieces were split, so the streamed deltas always add up to the final
extraction (and `extract(text)` is just one feed plus `finish()`).

    content --trigger--> format states (markup) --> object / bare_args --> ... --> content
       |                                    \\--malformed--> error (rest swallowed)
       `-- holds back a possible trigger prefix and trailing whitespace

Content is the text outside call markup. Whitespace is held back until
non-whitespace content follows it, so whitespace-only content is never
emitted; trailing whitespace is dropped at the end when the output had call
markup (kept verbatim when it had none).

A call's first delta carries index, id and name; it is sent once the name
is known and the arguments have started (or the call object closed without
any: arguments "{}"). Argument fragments are raw slices of the model's text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from inflight.tools.calls import ExtractedToolCalls, ToolCall, ToolDelta, make_call_id
from inflight.tools.json_scan import JsonScanner, MalformedToolCall, skip_ws

_ARGS_KEYS = ("arguments", "parameters")  # Llama 3 writes "parameters", the others "arguments"
_SCALAR_START = set("-0123456789tfn")


@dataclass
class _Call:
    """The call being parsed."""

    id: str
    name: str | None = None
    args_start: int | None = None  # buffer index of the arguments value's first character
    args_is_string: bool = False  # arguments written as a JSON string holding the object
    args_text: str | None = None  # final arguments text, once known
    sent: int = 0  # characters of the arguments text already emitted
    header_sent: bool = False


def literal_partial(text: str, literal: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of literal."""
    for k in range(min(len(literal) - 1, len(text)), 0, -1):
        if text.endswith(literal[:k]):
            return k
    return 0


class ToolStreamParser:
    """Base: content scanning, the call-object reader and argument streaming.

    Subclasses (one per format, in formats.py) provide `_find_trigger`, `_partial_len`,
    `_on_trigger` and `_st_<state>` methods for their markup states.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._pos = 0  # buffer index of the first character not yet consumed
        self._state = "content"
        self._out: list[ToolDelta] = []
        self._content: list[str] = []
        self._pending_ws = ""  # trailing content whitespace held back
        self._markup_seen = False
        self._calls: list[ToolCall] = []
        self._error: str | None = None
        self._finished = False
        self._call: _Call | None = None
        # object reader (one {"name": ..., "arguments": ...} object at a time)
        self._obj_start = 0
        self._phase = "open"
        self._key = ""
        self._role = ""  # of the value being scanned: key / name / args / other
        self._value_start = 0
        self._scanner = JsonScanner()
        self._after_object = "content"
        self._tentative = False  # a call not yet certain: on malformed text, revert to content

    # ------------------------------------------------------------------ public
    def feed(self, text: str) -> list[ToolDelta]:
        """Take the next piece of generated text; return the deltas it completes."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._run(eof=False)
        return self._take()

    def finish(self, truncated: bool = False) -> tuple[list[ToolDelta], ExtractedToolCalls]:
        """End of generation: flush what was held back; return it and the whole extraction.

        `truncated`: the generation was cut (max_tokens): a call in progress is returned as far
        as it got (its arguments unfinished, as OpenAI returns a call cut by finish_reason
        "length"), not reported as malformed, and a trigger cut short is markup, not content."""
        if not self._finished:
            self._finished = True
            if truncated:
                self._cut()
            self._run(eof=True)
            if self._state not in ("content", "error"):  # a state that failed to resolve at eof
                self._error = "truncated tool call"
            if self._pending_ws and self._content and not self._markup_seen:
                self._content.append(self._pending_ws)  # plain text keeps its trailing whitespace
                self._out.append(ToolDelta(content=self._pending_ws))
            self._pending_ws = ""
        content = "".join(self._content) or None
        return self._take(), ExtractedToolCalls(content, list(self._calls), self._error)

    def _cut(self) -> None:
        """finish(truncated=True): end the call in progress (or the trigger) where it stopped."""
        if self._state == "content":
            tail = self._buf[self._pos :]
            if tail and self._partial_len(tail) == len(tail):  # the start of a trigger
                self._markup_seen = True
                self._buf = self._buf[: self._pos]
            return
        if self._state == "error":
            return
        call = self._call
        self._markup_seen = True
        if call is not None and call.name is not None and call.header_sent:
            self._sync_args()
            args = call.args_text if call.args_text is not None else self._buf[call.args_start : self._pos] if call.args_start is not None else ""
            self._calls.append(ToolCall(call.name, args, call.id))
        self._call = None
        self._buf, self._pos, self._state = "", 0, "content"

    # ------------------------------------------------------------------ format hooks
    def _find_trigger(self, text: str) -> tuple[int, int, str] | None:
        """First complete trigger in text: (start, end, kind)."""
        raise NotImplementedError

    def _partial_len(self, text: str) -> int:
        """Length of text's suffix that could still grow into a trigger."""
        raise NotImplementedError

    def _on_trigger(self, start: int, end: int, kind: str) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ machinery
    def _run(self, eof: bool) -> None:
        while self._error is None:
            try:
                if not getattr(self, "_st_" + self._state)(eof):
                    break
            except MalformedToolCall as exc:
                self._fail(exc)
        if self._state == "content" and self._pos:  # nothing refers to consumed text
            self._buf = self._buf[self._pos :]
            self._pos = 0

    def _fail(self, exc: MalformedToolCall) -> None:
        self._call = None
        if self._tentative:  # it was not a call after all: what was read is content
            self._tentative = False
            at = max(exc.at, self._obj_start + 1)
            self._emit_content(self._buf[self._obj_start : at])
            self._pos = at
            self._state = "content"
            return
        self._markup_seen = True
        self._error = str(exc)
        self._state = "error"

    def _st_error(self, eof: bool) -> bool:
        self._pos = len(self._buf)  # everything after broken markup is swallowed
        return False

    def _take(self) -> list[ToolDelta]:
        """The deltas produced since the last call, adjacent ones of one kind merged."""
        merged: list[ToolDelta] = []
        for d in self._out:
            prev = merged[-1] if merged else None
            if prev is not None and d.content is not None and prev.content is not None:
                prev.content += d.content
            elif (
                prev is not None and d.index is not None and d.id is None and prev.index == d.index
            ):
                prev.arguments = (prev.arguments or "") + (d.arguments or "")
            else:
                merged.append(d)
        self._out = []
        return merged

    def _emit_content(self, text: str) -> None:
        body = text.rstrip()
        if not body:
            self._pending_ws += text
            return
        out = self._pending_ws + body
        self._pending_ws = text[len(body) :]
        self._content.append(out)
        self._out.append(ToolDelta(content=out))

    def _next_char(self, eof: bool, what: str) -> int | None:
        """Skip (consume) whitespace; index of the next character, None to wait for more."""
        self._pos = skip_ws(self._buf, self._pos)
        if self._pos < len(self._buf):
            return self._pos
        if eof:
            raise MalformedToolCall(what, at=self._pos)
        return None

    def _st_content(self, eof: bool) -> bool:
        text = self._buf[self._pos :]
        hit = self._find_trigger(text)
        if hit is not None:
            start, end, kind = hit
            self._emit_content(text[:start])
            self._on_trigger(self._pos + start, self._pos + end, kind)
            return True
        keep = 0 if eof else self._partial_len(text)
        self._emit_content(text[: len(text) - keep])
        self._pos += len(text) - keep
        return False

    # ------------------------------------------------------------------ calls
    def _begin_object(self, at: int, after: str, tentative: bool = False) -> None:
        """Read a {"name": ..., "arguments": {...}} object whose '{' is at buffer index at."""
        self._call = _Call(make_call_id())
        self._obj_start = self._pos = at
        self._phase = "open"
        self._after_object = after
        self._tentative = tentative
        self._state = "object"

    def _begin_bare_args(self, at: int, name: str) -> None:
        """Stream an arguments object that starts at buffer index at (name known already)."""
        self._call = _Call(make_call_id(), name=name, args_start=at)
        self._pos = at
        self._scanner = JsonScanner()
        self._state = "bare_args"
        self._sync_args()

    def _sync_args(self) -> None:
        """Emit the call's header once possible, then any arguments text not yet sent."""
        call = self._call
        assert call is not None
        if call.name is None or (call.args_start is None and call.args_text is None):
            return
        if call.args_text is not None:
            new = call.args_text[call.sent :]
        elif call.args_is_string:
            new = ""  # a JSON string is decoded and sent whole once it ends
        else:
            assert call.args_start is not None
            new = self._buf[call.args_start + call.sent : self._pos]
        if not call.header_sent:
            call.header_sent = True
            self._tentative = False
            self._markup_seen = True
            self._out.append(
                ToolDelta(index=len(self._calls), id=call.id, name=call.name, arguments=new)
            )
        elif new:
            self._out.append(ToolDelta(index=len(self._calls), arguments=new))
        call.sent += len(new)

    def _end_call(self) -> None:
        call = self._call
        assert call is not None and call.name is not None and call.args_text is not None
        self._sync_args()
        self._calls.append(ToolCall(call.name, call.args_text, call.id))
        self._call = None

    def _scan_value(self, eof: bool) -> int | None:
        """Advance the value scanner over the buffer; the value's end index once it ended."""
        end = self._scanner.scan(self._buf, self._pos)
        if end is None:
            self._pos = len(self._buf)
            if not eof:
                return None
            if not self._scanner.is_scalar:
                raise MalformedToolCall("truncated JSON in tool call", at=self._pos)
            end = self._pos
        self._pos = end
        return end

    def _st_bare_args(self, eof: bool) -> bool:
        call = self._call
        assert call is not None and call.args_start is not None
        before = self._pos
        end = self._scan_value(eof)
        if end is None:
            self._sync_args()
            return self._pos != before
        call.args_text = self._buf[call.args_start : end]
        _check_object(call.args_text, at=end)
        self._end_call()
        self._state = "content"
        return True

    def _st_object(self, eof: bool) -> bool:
        if self._phase == "in_value":
            return self._object_value(eof)
        i = self._next_char(eof, "unterminated tool call object")
        if i is None:
            return False
        ch, phase = self._buf[i], self._phase
        if phase == "open":  # callers start objects at their '{'
            self._pos, self._phase = i + 1, "first_key"
        elif phase in ("first_key", "key") and ch == '"':
            self._start_value("key", i)
        elif phase == "first_key" and ch == "}":
            self._pos = i + 1
            self._close_object()
        elif phase == "colon" and ch == ":":
            self._pos, self._phase = i + 1, "value"
        elif phase == "value":
            role = "name" if self._key == "name" else "args" if self._key in _ARGS_KEYS else "other"
            self._start_value(role, i)
        elif phase == "after_value" and ch == ",":
            self._pos, self._phase = i + 1, "key"
        elif phase == "after_value" and ch == "}":
            self._pos = i + 1
            self._close_object()
        else:
            raise MalformedToolCall(f"unexpected {ch!r} in tool call object", at=i)
        return True

    def _start_value(self, role: str, i: int) -> None:
        call = self._call
        assert call is not None
        ch = self._buf[i]
        if role == "name" and (ch != '"' or call.name is not None):
            raise MalformedToolCall("tool call name must be one string", at=i)
        if role == "args":
            if ch not in '{"' or call.args_start is not None:
                raise MalformedToolCall("tool call arguments must be one JSON object", at=i)
            call.args_start, call.args_is_string = i, ch == '"'
        elif ch not in '{["' and ch not in _SCALAR_START:
            raise MalformedToolCall(f"unexpected {ch!r} in tool call object", at=i)
        self._role, self._value_start, self._pos = role, i, i
        self._phase = "in_value"
        self._scanner = JsonScanner()
        if role == "args":
            self._sync_args()

    def _object_value(self, eof: bool) -> bool:
        call = self._call
        assert call is not None
        before = self._pos
        end = self._scan_value(eof)
        if end is None:
            if self._role == "args":
                self._sync_args()
            return self._pos != before
        raw = self._buf[self._value_start : end]
        self._phase = "after_value"
        if self._role == "key":
            self._key = _loads(raw, at=end)
            self._phase = "colon"
        elif self._role == "name":
            name = _loads(raw, at=end)
            if not name:
                raise MalformedToolCall("empty tool call name", at=end)
            call.name = name
            self._sync_args()  # arguments written before the name: send them now
        elif self._role == "args":
            call.args_text = _loads(raw, at=end) if call.args_is_string else raw
            _check_object(call.args_text, at=end)
            self._sync_args()
        return True

    def _close_object(self) -> None:
        call = self._call
        assert call is not None
        if self._tentative and call.args_start is None:
            raise MalformedToolCall("not a tool call", at=self._pos)
        if call.name is None:
            raise MalformedToolCall("tool call without a name", at=self._pos)
        _loads(self._buf[self._obj_start : self._pos], at=self._pos)  # validates the whole object
        if call.args_text is None:
            call.args_text = "{}"  # a call with no arguments key: a function without parameters
        self._end_call()
        self._state = self._after_object


def _loads(raw: str, at: int) -> str:
    """Decode a JSON string (keys, names, string-encoded arguments) or validate other JSON."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise MalformedToolCall(f"invalid JSON in tool call: {exc}", at=at) from None
    return value if isinstance(value, str) else raw


def _check_object(text: str, at: int) -> None:
    try:
        ok = isinstance(json.loads(text), dict)
    except ValueError:
        ok = False
    if not ok:
        raise MalformedToolCall("tool call arguments are not a valid JSON object", at=at)
