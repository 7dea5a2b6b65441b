"""Chat pieces -> a Responses API response object and its stream events, in OpenAI's order.

One `ResponseBuilder` per response, streamed or not (non-streamed: the events are dropped), so
both give the same output items. One item is open at a time:

    response.created, response.in_progress
    reasoning item:  output_item.added, content_part.added (reasoning_text), reasoning_text.delta ...,
                     reasoning_text.done, content_part.done, output_item.done
    message item:    output_item.added, content_part.added (output_text), output_text.delta ...,
                     output_text.done, content_part.done, output_item.done
    function_call:   output_item.added, function_call_arguments.delta ..., function_call_arguments.done,
                     output_item.done
    response.completed | response.incomplete (max_output_tokens, timeout) | response.failed
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from inflight.server.openai.chat_run import Piece
from inflight.tools import ExtractedToolCalls

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    def __init__(self, rid: str, model: str, echo: dict[str, Any]) -> None:
        self.head = {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
                     "background": False, "error": None, "incomplete_details": None, **echo}  # fmt: skip
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written
        self.calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its item
        self.seq = 0
        self.status = "in_progress"

    def _event(self, kind: str, **fields: Any) -> Event:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def response(self, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.head | {"status": self.status, "output": [dict(i) for i in self.items], "usage": usage}

    def start(self) -> list[Event]:
        snapshot = self.response()
        return [self._event("response.created", response=snapshot), self._event("response.in_progress", response=snapshot)]

    def feed(self, piece: Piece) -> list[Event]:
        events: list[Event] = []
        if piece.reasoning:
            events += self._text("reasoning", piece.reasoning)
        if piece.content:
            events += self._text("message", piece.content)
        for d in piece.calls:
            events += self._call(d.index or 0, d.id, d.name, d.arguments or "")
        return events

    def _begin(self, item: dict[str, Any]) -> list[Event]:
        events = self._close("completed")
        self.items.append(item)
        self.open = item
        return events + [self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item))]

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self.open is None or self.open["type"] != kind:
            if kind == "reasoning":
                item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events += self._begin(item)
            item["content"].append(part)
            events.append(self._event("response.content_part.added", item_id=item["id"], output_index=len(self.items) - 1,
                                      content_index=0, part=dict(part)))  # fmt: skip
        item = self.open
        assert item is not None
        item["content"][0]["text"] += text
        delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return events + [self._event(delta, item_id=item["id"], output_index=len(self.items) - 1, content_index=0, delta=text, **extra)]

    def _call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[Event]:
        events: list[Event] = []
        item = self.calls.get(index)
        if item is None:
            item = {"id": new_id("fc"), "type": "function_call", "call_id": call_id or new_id("call"), "name": name or "",
                    "arguments": "", "status": "in_progress"}  # fmt: skip
            self.calls[index] = item
            events += self._begin(item)
        if arguments:
            item["arguments"] += arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self.items.index(item), delta=arguments))  # fmt: skip
        return events

    def _close(self, status: str) -> list[Event]:
        item, self.open = self.open, None
        if item is None:
            return []
        at = self.items.index(item)
        item["status"] = status
        events: list[Event] = []
        if item["type"] == "function_call":
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                                      arguments=item["arguments"], name=item["name"]))  # fmt: skip
        else:
            part = item["content"][0]
            done = "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
            extra = {} if item["type"] == "reasoning" else {"logprobs": []}
            events.append(self._event(done, item_id=item["id"], output_index=at, content_index=0, text=part["text"], **extra))
            events.append(self._event("response.content_part.done", item_id=item["id"], output_index=at, content_index=0, part=dict(part)))
        return events + [self._event("response.output_item.done", output_index=at, item=dict(item))]

    def finish(self, finish_reason: str | None, extracted: ExtractedToolCalls | None, usage: dict[str, Any]) -> list[Event]:
        """Close the open item and end the response: completed, incomplete or failed."""
        if extracted is not None and extracted.error:
            self.status = "failed"
            self.head["error"] = {"code": "server_error", "message": f"malformed tool call: {extracted.error}"}
        elif finish_reason in ("length", "timeout", "abort"):
            self.status = "incomplete"
            reason = "max_output_tokens" if finish_reason == "length" else finish_reason
            self.head["incomplete_details"] = {"reason": reason}
        else:
            self.status = "completed"
        events = self._close("completed" if self.status == "completed" else "incomplete")
        for item in self.items:
            if item["status"] == "in_progress":
                item["status"] = "incomplete"
        kind = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}[self.status]
        return events + [self._event(kind, response=self.response(usage))]

    def conversation(self) -> list[dict[str, Any]]:
        """The output as chat messages (thinking dropped), for a follow-up's `previous_response_id`."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.items if i["type"] == "function_call"]  # fmt: skip
        msg: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            msg["tool_calls"] = calls
        return [msg] if text or calls else []


def usage_object(prompt: int, generated: int, thinking: int, cached: int) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": thinking}, "total_tokens": prompt + generated}  # fmt: skip
