"""The runner's vision work for vision-language models: M-RoPE positions of a step, encoder
outputs of the images / videos a step's pieces reach, and the cross-request encoder cache.

A piece [start, end) of a request needs the rows [max(start, offset), min(end, offset + length))
of every item whose placeholder span it overlaps: prefix-cache hits and chunked prefill can start
or end a piece in the middle of an image, so an item is encoded whole (once) and sliced. Encoder
outputs live on the request (`RunnerRequest.mm_embeds`) until it is freed, and in `EncoderCache`
(LRU by bytes, keyed by the item's content hash) across requests: the same image sent again is
not encoded again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from inflight.outputs import ScheduledRequest
    from inflight.worker.input_batch import RunnerRequest


class EncoderCache:
    """Encoder outputs by content hash, least recently used evicted past `capacity_bytes`."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> torch.Tensor | None:
        t = self.entries.get(key)
        if t is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return t

    def put(self, key: bytes, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        if size > self.capacity or key in self.entries:
            return
        self.entries[key] = value
        self.bytes += size
        while self.bytes > self.capacity:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


def needs_mrope(pieces: list[ScheduledRequest], reqs: list[RunnerRequest]) -> bool:
    """Whether a piece runs prompt positions of a request with M-RoPE positions (3-D positions);
    otherwise every row's three components are equal and 1-D positions (index + delta) serve."""
    return any(
        r.mrope_positions is not None and sr.num_computed_tokens < r.num_prompt_tokens
        for sr, r in zip(pieces, reqs)
    )


def mrope_positions(pieces: list[ScheduledRequest], reqs: list[RunnerRequest]) -> np.ndarray:
    """(3, T) positions of the flat batch: a prompt's precomputed ones, index + delta after it."""
    cols = []
    for sr, r in zip(pieces, reqs):
        start, end = sr.num_computed_tokens, sr.num_computed_tokens + sr.num_tokens
        if r.mrope_positions is None:
            cols.append(np.broadcast_to(np.arange(start, end), (3, end - start)))
            continue
        p = r.num_prompt_tokens
        head = r.mrope_positions[:, start : min(end, p)]
        tail = np.arange(max(start, p), end) + r.mrope_delta
        cols.append(np.concatenate([head, np.broadcast_to(tail, (3, tail.size))], axis=1))
    return np.concatenate(cols, axis=1)


class VisionRunner:
    """Encodes the items a step reaches and scatters their rows into the step's embeddings."""

    def __init__(self, model: Any, device: torch.device, cache_bytes: int) -> None:
        self.model = model
        self.device = device
        self.cache = EncoderCache(cache_bytes)
        self.num_encoded = 0  # items run through the encoder (tests, benchmarks)

    @staticmethod
    def reached(
        pieces: list[ScheduledRequest], reqs: list[RunnerRequest]
    ) -> list[tuple[int, RunnerRequest, int, int, int]]:
        """(flat row of the piece's first token, request, item index, lo, hi) per overlap."""
        out = []
        row = 0
        for sr, r in zip(pieces, reqs):
            start, end = sr.num_computed_tokens, sr.num_computed_tokens + sr.num_tokens
            for i, item in enumerate(r.mm_items):
                lo, hi = max(start, item.offset), min(end, item.end)
                if lo < hi:
                    out.append((row - start, r, i, lo, hi))
            row += sr.num_tokens
        return out

    def scatter(
        self, embeds: torch.Tensor, overlaps: list[tuple[int, RunnerRequest, int, int, int]]
    ) -> None:
        """Write each overlap's encoder rows over the placeholder rows of `embeds` (T, hidden)."""
        self._encode_missing([(r, i) for _, r, i, _, _ in overlaps])
        for base, r, i, lo, hi in overlaps:
            item = r.mm_items[i]
            embeds[base + lo : base + hi] = r.mm_embeds[i][lo - item.offset : hi - item.offset]

    def _encode_missing(self, needed: list[tuple[RunnerRequest, int]]) -> None:
        """One encoder call for every item not on its request or in the cache."""
        todo: dict[bytes, list[tuple[RunnerRequest, int]]] = {}
        for r, i in needed:
            if i in r.mm_embeds:
                continue
            key = r.mm_items[i].hash
            cached = self.cache.get(key)
            if cached is not None:
                r.mm_embeds[i] = cached
            else:
                todo.setdefault(key, []).append((r, i))
        if not todo:
            return
        items = [users[0][0].mm_items[users[0][1]] for users in todo.values()]
        pixels = torch.from_numpy(np.concatenate([it.pixel_values for it in items])).to(self.device)
        out = self.model.encode_vision(pixels, [tuple(it.grid_thw) for it in items])
        self.num_encoded += len(items)
        for (key, users), chunk in zip(todo.items(), out.split([it.length for it in items])):
            chunk = chunk.clone() if len(items) > 1 else chunk  # cache entries own their memory
            self.cache.put(key, chunk)
            for r, i in users:
                r.mm_embeds[i] = chunk
