"""What an engine process sends of a step's outputs (engine/core_process.py): a request's first
output whole, then only what grew. A `RequestOutput` holds its request's whole story so far (the
token ids, the text, the logprob entries, the metrics' per-token lists); pickled whole every step,
a stream of n tokens costs O(n^2), and the first version of the engine process spent 2x the CPU a
token of the one-process server doing so (benchmarks/README.md). The lists only grow (`Prefix`);
where one did not (a different number of outputs, something shorter), the output goes whole.

The decoder rebuilds each step's `RequestOutput` over lists of its own, with `Prefix` views as
the engine does, so an output handed on earlier never sees later tokens."""

from __future__ import annotations

import dataclasses
from typing import Any

from inflight.outputs import (
    CompletionOutput,
    Prefix,
    RequestMetrics,
    RequestOutput,
    TextPrefix,
    TextSoFar,
)

_LISTS = ("token_times", "schedule_times", "batch_sizes")  # RequestMetrics' per-token lists
_SCALARS = tuple(f.name for f in dataclasses.fields(RequestMetrics) if f.name not in _LISTS)  # sent as a tuple: no dataclass to pickle


def _raw(c: CompletionOutput, name: str) -> tuple[list[Any] | None, int]:
    """A list field of `c` without copying a `Prefix`: (its list, its length)."""
    v = c.__dict__[name]
    if isinstance(v, Prefix):
        return v.items, v.length
    return (None, 0) if v is None else (v, len(v))


def _text(c: CompletionOutput) -> tuple[TextSoFar, int]:
    """`c.text` without making a `TextPrefix` a str: (the text, its length)."""
    v = c.__dict__["text"]
    return (v.text, v.length) if isinstance(v, TextPrefix) else (TextSoFar(v), len(v))


class Encoder:
    """The engine process's side: what each live request was sent so far (lengths)."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[list[int], list[tuple[int, int, int]]]] = {}

    def encode(self, o: RequestOutput) -> Any:
        m = o.metrics
        raws = [(_raw(c, "token_ids"), _raw(c, "logprobs"), _text(c)) for c in o.outputs]
        lens = ([len(getattr(m, n)) for n in _LISTS], [(t[1], txt[1], lp[1]) for c, (t, lp, txt) in zip(o.outputs, raws)])
        prev = self.sent.pop(o.request_id, None)
        if not o.finished:
            self.sent[o.request_id] = lens
        if prev is None or len(prev[1]) != len(lens[1]) or not _grew(prev, lens):
            return o
        scalars = tuple([m.__dict__[n] for n in _SCALARS])
        metric_tails = [getattr(m, n)[p:] for n, p in zip(_LISTS, prev[0])]
        comps = []
        for c, ((tokens, nt), (lps, nl), (text, nc)), (pt, pc, pl) in zip(o.outputs, raws, prev[1]):
            comps.append((c.index, c.cumulative_logprob, c.finish_reason, c.stop_reason, c.delta_text, c.delta_token_ids,
                          c.delta_logprobs, c.generation_logits, tokens[pt:nt] if tokens is not None else [], text.between(pc, nc),
                          None if lps is None else lps[pl:nl]))  # fmt: skip
        return (o.request_id, o.serial, o.finished, o.num_cached_tokens, o.error, o.prompt_logprobs, o.context_logits,
                o.embedding, scalars, metric_tails, comps)  # fmt: skip


def _grew(prev: tuple[list[int], list[tuple[int, int, int]]], now: tuple[list[int], list[tuple[int, int, int]]]) -> bool:
    if any(a > b for a, b in zip(prev[0], now[0])):
        return False
    return all(a <= b for p, n in zip(prev[1], now[1]) for a, b in zip(p, n))


class Decoder:
    """The server process's side: each live request's lists, extended by what arrives."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[Any, list[int], Any, list[list[Any]]]] = {}

    def decode(self, item: Any) -> RequestOutput:
        if isinstance(item, RequestOutput):
            if item.finished:
                self.state.pop(item.request_id, None)
            else:
                outs = [[list(c.token_ids), TextSoFar(c.text), None if c.logprobs is None else list(c.logprobs)] for c in item.outputs]
                self.state[item.request_id] = (item.prompt, item.prompt_token_ids, item.metrics, outs)
            return item
        rid, serial, finished, cached, error, prompt_lps, context_logits, embedding, scalars, metric_tails, comps = item
        prompt, prompt_ids, metrics, outs = self.state.pop(rid) if finished else self.state[rid]
        metrics.__dict__.update(zip(_SCALARS, scalars))
        for name, tail in zip(_LISTS, metric_tails):
            metrics.__dict__[name] += tail
        completions = []
        for (index, cum, reason, stop, delta, delta_ids, delta_lps, gen_logits, tokens, text, lps), out in zip(comps, outs):
            out[0] += tokens
            out[1].append(text)
            if lps is not None and out[2] is not None:
                out[2] += lps
            completions.append(CompletionOutput(
                index=index, text=TextPrefix(out[1], out[1].length), token_ids=Prefix(out[0], len(out[0])),  # type: ignore[arg-type]
                cumulative_logprob=cum, logprobs=None if out[2] is None else Prefix(out[2], len(out[2])),  # type: ignore[arg-type]
                finish_reason=reason, stop_reason=stop, delta_text=delta, delta_token_ids=delta_ids,
                delta_logprobs=delta_lps, generation_logits=gen_logits,
            ))  # fmt: skip
        return RequestOutput(
            request_id=rid, prompt=prompt, prompt_token_ids=prompt_ids, outputs=completions, finished=finished,
            metrics=metrics, num_cached_tokens=cached, error=error, prompt_logprobs=prompt_lps,
            context_logits=context_logits, embedding=embedding, serial=serial,
        )  # fmt: skip
