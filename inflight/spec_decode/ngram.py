"""Prompt lookup (n-gram) drafts: what followed the last earlier occurrence of the sequence's tail.

Runs every step for every speculating request, so it is NumPy over a per-request buffer that
grows by the tokens appended since the last call (no list -> array copy of the whole history):
one vectorized compare over the history (O(L)) and at most `max_n` - 1 compares over the
candidate positions.
"""

from __future__ import annotations

import numpy as np


class TokenBuffer:
    """A request's token ids as an int64 array, extended in place (capacity doubles)."""

    def __init__(self) -> None:
        self.ids = np.empty(256, dtype=np.int64)
        self.n = 0

    def sync(self, tokens: list[int]) -> np.ndarray:
        """The buffer after appending tokens[self.n:]; tokens only ever grow at the end."""
        if len(tokens) < self.n:  # not the same sequence any more: start over
            self.n = 0
        if len(tokens) > self.ids.shape[0]:
            grown = np.empty(max(len(tokens), 2 * self.ids.shape[0]), dtype=np.int64)
            grown[: self.n] = self.ids[: self.n]
            self.ids = grown
        if len(tokens) > self.n:
            self.ids[self.n : len(tokens)] = tokens[self.n :]
            self.n = len(tokens)
        return self.ids[: self.n]


def propose_ngram(ids: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to `k` tokens that followed the latest of the longest earlier matches of the last n
    tokens of `ids` (max_n >= n >= min_n); [] when no n-gram of min_n tokens occurred before.

    A match that ends p tokens before the end is a loop of period p: when fewer than k tokens
    follow it, the drafts go round that loop again (a model repeating itself keeps doing so)."""
    size = ids.shape[0]
    if size < min_n + 1 or k < 1:
        return []
    ends = np.flatnonzero(ids[: size - 1] == ids[size - 1])  # earlier positions of the last token
    if ends.shape[0] == 0:
        return []
    lengths = np.ones(ends.shape[0], dtype=np.int64)
    alive = ends
    for j in range(1, min(max_n, size - 1)):  # grow each match backwards while it agrees
        alive = alive[alive >= j]
        alive = alive[ids[alive - j] == ids[size - 1 - j]]
        if alive.shape[0] == 0:
            break
        lengths[np.searchsorted(ends, alive)] += 1
    best = int(lengths.max())
    if best < min_n:
        return []
    end = int(ends[np.flatnonzero(lengths == best)[-1]])
    period = size - 1 - end
    loop = ids[end + 1 :]  # the tokens since the match: the continuation, repeated if short
    return [int(loop[i % period]) for i in range(k)]
