"""Chat pieces -> an Anthropic message and its stream events.

One `MessageBuilder` per message, streamed or not, so both give the same content blocks. One block
is open at a time:

    message_start
    content_block_start (thinking | text | tool_use), content_block_delta (thinking_delta |
    text_delta | input_json_delta) ..., content_block_stop      -- per block, in order
    message_delta (stop_reason, stop_sequence, usage.output_tokens), message_stop
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from inflight.server.openai.chat_run import Piece
from inflight.tools import ExtractedToolCalls

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class MessageBuilder:
    def __init__(self, model: str, input_tokens: int) -> None:
        self.id, self.model, self.input_tokens = new_id("msg"), model, input_tokens
        self.blocks: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.args: dict[int, str] = {}  # tool_use block index -> its input JSON text so far
        self.calls: dict[int, int] = {}  # tool-call index -> block index

    def message(self, stop_reason: str | None, stop_sequence: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": self.content(),
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}  # fmt: skip

    def content(self) -> list[dict[str, Any]]:
        out = []
        for i, b in enumerate(self.blocks):
            if b["type"] == "tool_use":
                b = b | {"input": _input(self.args.get(i, ""))}
            out.append(dict(b))
        return out

    def start(self) -> list[Event]:
        usage = {"input_tokens": self.input_tokens, "output_tokens": 0}
        return [{"type": "message_start", "message": self.message(None, None, usage)}]

    def feed(self, piece: Piece) -> list[Event]:
        events: list[Event] = []
        if piece.reasoning:
            events += self._text("thinking", piece.reasoning)
        if piece.content:
            events += self._text("text", piece.content)
        for d in piece.calls:
            index = d.index or 0
            if index not in self.calls:
                block = {"type": "tool_use", "id": (d.id or new_id("call")).replace("call_", "toolu_", 1), "name": d.name or "", "input": {}}
                events += self._begin(block)
                self.calls[index] = len(self.blocks) - 1
            at = self.calls[index]
            if d.arguments:
                self.args[at] = self.args.get(at, "") + d.arguments
                events.append({"type": "content_block_delta", "index": at, "delta": {"type": "input_json_delta", "partial_json": d.arguments}})
        return events

    def _begin(self, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self.blocks.append(block)
        self.open = block
        return events + [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)}]

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self.open is None or self.open["type"] != kind:
            events += self._begin({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""})
        assert self.open is not None
        self.open[kind] += text
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta", "text": text}
        return events + [{"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}]

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def finish(self, finish_reason: str | None, stop: int | str | None, extracted: ExtractedToolCalls | None,
               output_tokens: int) -> tuple[list[Event], str, str | None]:  # fmt: skip
        """(closing events, stop_reason, stop_sequence)."""
        if self.calls and finish_reason == "stop" and not (extracted and extracted.error):
            reason, seq = "tool_use", None
        elif finish_reason == "stop" and isinstance(stop, str):
            reason, seq = "stop_sequence", stop
        elif finish_reason == "stop":
            reason, seq = "end_turn", None
        else:  # length, or ended early (timeout, abort): cut short as by max_tokens
            reason, seq = "max_tokens", None
        events = self._close() + [
            {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": {"output_tokens": output_tokens}},
            {"type": "message_stop"},
        ]  # fmt: skip
        return events, reason, seq


def _input(text: str) -> Any:
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}  # cut by max_tokens: stop_reason says so
    return value if isinstance(value, dict) else {}
