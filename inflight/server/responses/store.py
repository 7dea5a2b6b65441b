"""Stored responses (`store: true`): GET / DELETE /v1/responses/{id} and `previous_response_id`.

In memory, per API key (a response stored under one key is invisible to every other), bounded in
entries (`--responses-store-size`) and in bytes (the JSON size of what is kept), least recently
used first out. A restart forgets them all, as vLLM's store does.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class Stored:
    response: dict[str, Any]  # the response object as returned
    conversation: list[dict[str, Any]]  # chat messages: its input turn and its output (for a follow-up)
    input_items: list[dict[str, Any]]  # its `input`, as items with ids
    size: int  # bytes counted against the store


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._items: OrderedDict[tuple[str, str], Stored] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the event loop only today; cheap insurance for a thread pool

    def put(self, key: str, response: dict[str, Any], conversation: list[dict[str, Any]],
            input_items: list[dict[str, Any]] | None = None) -> bool:  # fmt: skip
        """Keep it (False: larger than the whole store, or the store is off)."""
        input_items = input_items or []
        size = len(json.dumps(response)) + len(json.dumps(conversation)) + len(json.dumps(input_items))
        if self.max_entries == 0 or size > self.max_bytes:
            return False
        with self._lock:
            self._drop((key, response["id"]))
            self._items[(key, response["id"])] = Stored(response, conversation, input_items, size)
            self._bytes += size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.size
        return True

    def get(self, key: str, response_id: str) -> Stored | None:
        with self._lock:
            item = self._items.get((key, response_id))
            if item is not None:
                self._items.move_to_end((key, response_id))
            return item

    def delete(self, key: str, response_id: str) -> bool:
        with self._lock:
            return self._drop((key, response_id))

    def _drop(self, k: tuple[str, str]) -> bool:
        old = self._items.pop(k, None)
        if old is None:
            return False
        self._bytes -= old.size
        return True

    def __len__(self) -> int:
        return len(self._items)

    @property
    def num_bytes(self) -> int:
        return self._bytes
