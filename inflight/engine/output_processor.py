"""Turn sampled tokens into RequestOutputs: text deltas, stop strings, logprobs.

Stop strings are matched on the detokenized text. While a request has stop
strings, the last `max(len(stop)) - 1` characters are held back from
streamed deltas, so a stop string that arrives over several tokens is never
partly sent before it is recognised and trimmed.
"""

from __future__ import annotations

from typing import Any

import torch

from inflight.engine.detokenizer import IncrementalDetokenizer, renders_at_once
from inflight.outputs import (
    CompletionOutput,
    Logprob,
    ModelRunnerOutput,
    Prefix,
    RequestOutput,
    SampledToken,
    TextPrefix,
    TextSoFar,
)
from inflight.request import FinishReason, Request


class RequestTextState:
    """One sequence's output state: detokenizer, stop-string trimming, what was sent, and what the
    runner reported for it (logprobs, logits, embedding). Kept by the OutputProcessor by request id;
    the scheduler's `Request` holds none of it."""

    def __init__(self, request: Request, tokenizer: Any, at_once: bool = False, texts: dict[int, str] | None = None) -> None:
        p = request.params
        self.detok = (
            IncrementalDetokenizer(
                tokenizer, request.prompt_token_ids, p.skip_special_tokens, p.spaces_between_special_tokens, texts
            )
            if tokenizer is not None and p.detokenize
            else None
        )
        self.text = TextSoFar()  # output text after stop-string trimming (the detokenizer's, until a stop trims it)
        self.sent_chars = 0
        self.sent_tokens = 0
        self.sent_logprobs = 0
        self.holdback = max((len(s) for s in p.stop), default=1) - 1
        self.stopped_by: str | None = None
        # final-only without stop strings: nothing reads the text before the end, so the tokens
        # are detokenized then, at once (IncrementalDetokenizer.finish), where that gives the same
        # text (`at_once`: detokenizer.renders_at_once); beams render their own
        self.deferred = at_once and request.inputs.final_only and not p.stop and request.beam_group_id is None
        self.logprobs: list[dict[int, Logprob]] | None = [] if p.logprobs is not None else None
        # nothing to record a token and no output before the end: `on_token` does nothing for it
        # and the step's outputs skip it until it finishes (Sequences.step_outputs)
        self.quiet = self.logprobs is None and (self.detok is None or self.deferred) and request.inputs.final_only
        # what the runner reported (ModelRunnerOutput), as it arrives
        self.prompt_logprobs: list[SampledToken] | None = [] if p.prompt_logprobs is not None else None
        self.prompt_logprobs_out: list = []  # prompt logprob entries converted so far
        self.context_logits: list[torch.Tensor] = []
        self.generation_logits: list[torch.Tensor] = []
        self.embedding: torch.Tensor | None = None


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._token_text: dict[int, str] = {}
        self.states: dict[str, RequestTextState] = {}  # sequence id -> its output state
        self.at_once = tokenizer is not None and renders_at_once(tokenizer)
        # each token's text alone, by the decode options (skip_special_tokens, spaces_between_special_tokens)
        self._one_token_texts: dict[tuple[bool, bool], dict[int, str]] = {}

    def start(self, request: Request) -> None:
        p = request.params
        texts = self._one_token_texts.setdefault((p.skip_special_tokens, p.spaces_between_special_tokens), {})
        self.states[request.request_id] = RequestTextState(request, self.tokenizer, self.at_once, texts)

    def drop(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def absorb(self, result: ModelRunnerOutput) -> None:
        """The runner's logits outputs and embeddings for the sequences that asked for them."""
        if not (result.prompt_logprobs or result.context_logits or result.generation_logits or result.embeddings):
            return  # most steps (each loop set up costs, cache-cold after a batch-1 C step)
        for rid, entries in result.prompt_logprobs.items():
            st = self.states.get(rid)
            if st is not None and st.prompt_logprobs is not None:
                st.prompt_logprobs.extend(entries)
        for rid, logits in result.context_logits.items():
            if rid in self.states:
                self.states[rid].context_logits.append(logits)
        for rid, rows in result.generation_logits.items():
            if rid in self.states:
                self.states[rid].generation_logits.extend(rows)
        for rid, vector in result.embeddings.items():
            if rid in self.states:
                self.states[rid].embedding = vector

    def on_token(self, request: Request, sampled: SampledToken, last: bool = True) -> str | None:
        """Record one new token (`last`: the step's last one for this request; a step with accepted
        drafts brings several). Returns the stop string if it ended the text."""
        st = self.states[request.request_id]
        if st.logprobs is not None:
            st.logprobs.append(self._logprob_entry(sampled))
        if st.detok is None or st.stopped_by is not None or st.deferred:
            return None
        if last and request.finish_reason is FinishReason.STOP and not request.params.include_stop_str_in_output:
            return None  # ended by EOS / a stop token id: kept in token_ids, not rendered (as vLLM)
        text = st.detok.text_so_far
        before = text.length
        st.detok.push(sampled.token_id)
        if request.params.stop:
            hit = self._find_stop(text, before, request)
            if hit is not None:
                return hit
        st.text = text
        return None

    def _find_stop(self, text: TextSoFar, before: int, request: Request) -> str | None:
        p = request.params
        st = self.states[request.request_id]
        start = max(0, before - st.holdback)  # where a stop string may begin: len(stop) - 1 back at most
        tail = text.between(start, text.length)
        best: tuple[int, str] | None = None
        for stop in p.stop:
            idx = tail.find(stop, max(0, before - len(stop) + 1) - start)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return None
        idx, stop = best
        end = start + idx + (len(stop) if p.include_stop_str_in_output else 0)
        st.text = TextSoFar(text.between(0, end))
        st.stopped_by = stop
        return stop

    def _logprob_entry(self, s: SampledToken) -> dict[int, Logprob]:
        entry = {s.token_id: Logprob(s.logprob, s.rank, self._decode_one(s.token_id))}
        for rank, (tid, lp) in enumerate(s.top or [], start=1):
            if tid not in entry:
                entry[tid] = Logprob(lp, rank, self._decode_one(tid))
        for tid, lp in s.asked or []:
            entry.setdefault(tid, Logprob(lp, None, self._decode_one(tid)))
        return entry

    def _decode_one(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id])
            self._token_text[token_id] = text
        return text

    def make_output(self, request: Request) -> RequestOutput:
        """The output since the last call: deltas plus the cumulative view."""
        st = self.states[request.request_id]
        finished = request.is_finished
        if finished and st.detok is not None and st.stopped_by is None:
            if st.deferred:
                st.detok.finish(self._rendered(request))
            else:
                st.detok.flush()
            st.text = st.detok.text_so_far
        visible = st.text.length if finished or not request.params.stop else st.text.length - st.holdback
        visible = max(visible, st.sent_chars)
        delta_text = st.text.between(st.sent_chars, visible)
        st.sent_chars = visible
        tokens = request.output_token_ids
        delta_tokens = tokens[st.sent_tokens :]
        st.sent_tokens = len(tokens)
        delta_lp = None
        if st.logprobs is not None:
            delta_lp = st.logprobs[st.sent_logprobs :]
            st.sent_logprobs = len(st.logprobs)
        # by position, in the fields' order (one of each per stream per step: keywords cost ~0.5 us more)
        completion = CompletionOutput(
            0,  # index
            TextPrefix(st.text, visible),  # type: ignore[arg-type]  # text: a str when read
            Prefix(tokens, len(tokens)),  # type: ignore[arg-type]  # token_ids: copied when read
            request.cumulative_logprob if request.inputs.chosen_logprobs else None,
            None if st.logprobs is None else Prefix(st.logprobs, len(st.logprobs)),  # type: ignore[arg-type]
            request.finish_reason.value if request.finish_reason else None,
            request.stop_reason,
            delta_text,
            delta_tokens,
            delta_lp,
        )
        metrics = request.metrics
        out = RequestOutput(
            request.request_id, request.inputs.prompt, request.inputs.prompt_token_ids, [completion], finished, metrics,
            metrics.num_cached_tokens,
        )  # fmt: skip
        self._logits_outputs(st, out)
        return out

    @staticmethod
    def _rendered(request: Request) -> list[int]:
        """The output tokens that become text (on_token's rule: not an EOS / stop token id that
        ended the request, unless include_stop_str_in_output)."""
        tokens = request.output_token_ids
        if tokens and request.finish_reason is FinishReason.STOP and not request.params.include_stop_str_in_output:
            return tokens[:-1]
        return tokens

    def _logits_outputs(self, st: RequestTextState, out: RequestOutput) -> None:
        if st.prompt_logprobs is not None:
            done = st.prompt_logprobs_out
            done.extend(self._logprob_entry(s) for s in st.prompt_logprobs[len(done) :])
            out.prompt_logprobs = [None, *done]
        if st.embedding is not None:
            out.embedding = st.embedding
        if out.finished and st.context_logits:
            out.context_logits = torch.cat(st.context_logits)
        if out.finished and st.generation_logits:
            # rows past the last token (drafts accepted after a stop) are not the output's
            out.outputs[0].generation_logits = torch.stack(st.generation_logits[: len(out.outputs[0].token_ids)])
