"""Beam search over the paged cache, with Hugging Face `generate`'s semantics.

Each live beam is a Request (`beam_group_id` set) whose step yields a log-softmax row
instead of a token. When every live beam has reported, `BeamGroup.step` does one HF
round (transformers 5.x `_beam_search`):

  1. scores = log_probs + running score, over beams x vocab; keep the top
     K = max(2, 1 + #eos) * B candidates;
  2. a candidate "hits" when its token is EOS or the sequence reaches max length;
  3. the next running beams are the best B candidates that don't hit;
  4. hits ranked within the first B enter the finished set with score
     sum / generated_len ** length_penalty (masked out once the set is full under
     early_stopping=True, or once the early-stop heuristic is satisfied);
  5. stop when no improvement is possible, the set is full (early_stopping=True),
     or every candidate hit.
The engine then forks the chosen beams (engine/sequences.py `Sequences.advance_beams`).

With temperature > 0 it is HF's beam *sampling* (`do_sample=True`): the step's log-probs are
divided by the temperature (and cut by top_k / top_p / min_p / typical_p: sample/beam_warpers.py)
before the running scores are added, and the K
candidates are drawn without replacement from the softmax over beams x vocab (the request's
seeded generator) instead of taken by top-k, in the order drawn. Per-token logprobs (the raw
log-softmax of the chosen token, its rank and the top-N) are kept per hypothesis when asked.
"""

from __future__ import annotations

from typing import Any

import torch

from inflight.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from inflight.request import Request
from inflight.sample import beam_warpers as warpers

_NEG = -1.0e9  # HF's "impossible" score


class BeamGroup:
    def __init__(self, request: Request, tokenizer: Any = None) -> None:
        p = request.params
        self.request = request
        self.num_beams = p.num_beams
        self.n = p.n
        self.length_penalty = p.length_penalty
        self.early_stopping = p.early_stopping
        # stop_token_ids end a hypothesis as EOS does (HF: a list of eos_token_id, which also widens K)
        eos = () if p.ignore_eos else ((p.end_id,) if p.end_id is not None else request.eos_token_ids)
        self.eos = tuple(dict.fromkeys([*eos, *p.stop_token_ids]))
        self.stop = StopCheck(request, tokenizer)
        self.prompt_len = request.num_prompt_tokens
        self.max_length = self.prompt_len + request.max_tokens
        self.cur_len = self.prompt_len
        self.running: list[Request] = []
        self.running_scores = torch.zeros(1)
        self.reported: dict[str, torch.Tensor] = {}
        b = self.num_beams
        self.fin_scores = torch.full((b,), _NEG)
        self.fin_flags = torch.zeros(b, dtype=torch.bool)
        self.fin_seqs: list[list[int]] = [[] for _ in range(b)]
        self.fin_raw: list[float] = [0.0] * b
        self.unsatisfied = True
        self.done = False
        self.metrics = RequestMetrics(arrival_time=request.arrival_time)
        self._ids = 0
        self.temperature, self.top_k = p.temperature, p.top_k
        self.top_p, self.min_p, self.typical_p = p.top_p, p.min_p, p.typical_p
        self.generator = None
        if p.temperature > 0 and p.seed is not None:
            self.generator = torch.Generator().manual_seed(p.seed)
        self.num_logprobs = p.logprobs  # None: not asked; -1: the whole vocabulary
        # per-token logprob entries: of each running beam (by request id), of each finished hypothesis
        self.entries: dict[str, list[Entry]] = {}
        self.fin_entries: list[list[Entry]] = [[] for _ in range(b)]
        self.context_logits: torch.Tensor | None = None  # return_context_logits: the prompt's, kept from the first beam
        # return_generation_logits: this round's raw logits row of each beam, and each hypothesis's rows
        self.reported_logits: dict[str, torch.Tensor] = {}
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.fin_rows: list[list[torch.Tensor]] = [[] for _ in range(b)]
        self._pending_rows: dict[tuple[int, ...], list[torch.Tensor]] = {}  # chosen hypothesis -> its rows

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def new_beam(self, tokens: list[int], score: float, entries: list[Entry] | None = None) -> Request:
        """A Request for a beam with these generated tokens (its KV comes from a fork)."""
        r = self.request
        beam = Request.from_inputs(
            f"{r.request_id}#beam{self._ids}", r.inputs, output_token_ids=tokens, cumulative_logprob=score,
            beam_group_id=r.request_id,
        )  # fmt: skip
        self._ids += 1
        self.entries[beam.request_id] = entries or []
        self.rows[beam.request_id] = self._pending_rows.pop(tuple(tokens), [])  # (hypotheses are distinct sequences)
        return beam

    def ready(self) -> bool:
        return all(b.request_id in self.reported for b in self.running)

    def step(self) -> list[tuple[Request, int, float, list[Entry]]]:
        """One HF beam round. Returns the next running beams as (origin beam, token, score,
        logprob entries of the hypothesis)."""
        b = self.num_beams
        raw = torch.stack([self.reported[r.request_id].float().cpu() for r in self.running])  # (R, V)
        self._record_step()
        lps = raw
        if self.temperature > 0:  # beam sampling: HF's warpers act on the step's log-probs
            lps = self._warp(raw / self.temperature)
        vocab = lps.shape[1]
        scores = self.running_scores
        if self.temperature > 0 and len(self.running) < b:  # HF's first round: B beams, all but one at -1e9
            pad = b - len(self.running)
            lps = torch.cat([lps, lps[:1].expand(pad, -1)])
            scores = torch.cat([scores, torch.full((pad,), _NEG)])
        acc = (lps + scores[:, None]).reshape(-1)
        k = min(max(2, 1 + len(self.eos)) * b, acc.numel())
        if self.temperature > 0:
            k = min(k, int(torch.isfinite(acc).sum()))
            idx = torch.multinomial(acc.softmax(-1), k, generator=self.generator)
            # best first, as HF >= 5.24 orders them: only the first `b` candidates may finish a
            # hypothesis, and in draw order (HF <= 5.23) a worse draw could finish before a better one
            vals, order = acc[idx].sort(descending=True)
            idx = idx[order]
        else:
            vals, idx = acc.topk(k)
        origin, token = (idx // vocab).clamp(max=len(self.running) - 1), idx % vocab
        entries = self._entries(raw, origin, token)
        hits = torch.isin(token, torch.tensor(self.eos, dtype=torch.long)) | (self.cur_len + 1 >= self.max_length)
        if self.stop.active:  # stop words / strings: HF's stopping criteria, applied to every candidate
            seqs = [self.running[o].output_token_ids + [t] for o, t in zip(origin.tolist(), token.tolist())]
            hits = hits | torch.tensor([self.stop.hit(seq) is not None for seq in seqs], dtype=torch.bool)
        run_vals = vals + hits.float() * _NEG
        nxt = run_vals.topk(min(b, k)).indices
        rows = self._rows(origin)
        self._update_finished(vals, origin, token, hits, entries, rows)
        chosen = [(self.running[int(origin[j])], int(token[j]), float(run_vals[j]), entries[int(j)]) for j in nxt]
        if rows is not None:
            self._pending_rows = {tuple(c[0].output_token_ids + [c[1]]): rows[int(j)] for c, j in zip(chosen, nxt)}
        self.running_scores = run_vals[nxt]
        self.cur_len += 1
        self._update_stop(bool(hits.all()))
        self.reported.clear()
        self.reported_logits.clear()
        return chosen

    def _warp(self, lps: torch.Tensor) -> torch.Tensor:
        """HF's warpers after the temperature, in its order, keeping 1 + #EOS tokens (at least 2)."""
        keep = max(2, len(self.eos) + 1)
        if self.top_k > 0:
            lps = warpers.top_k(lps, self.top_k, keep)
        if self.top_p < 1.0:
            lps = warpers.top_p(lps, self.top_p, keep)
        if self.min_p > 0.0:
            lps = warpers.min_p(lps, self.min_p, keep)
        if self.typical_p < 1.0:
            lps = warpers.typical_p(lps, self.typical_p, keep)
        return lps

    def _record_step(self) -> None:
        """The search's figures: each round is one token of it (time, batch size, schedule)."""
        m, beam = self.metrics, self.running[0].metrics
        if m.first_scheduled_time is None:
            m.first_scheduled_time = beam.first_scheduled_time
            m.num_cached_tokens = beam.num_cached_tokens  # the prompt's prefix-cache hit (usage's cached_tokens)
        if beam.token_times:
            m.first_token_time = m.first_token_time or beam.token_times[-1]
            m.token_times.append(beam.token_times[-1])
            m.batch_sizes.append(beam.batch_sizes[-1])
        if beam.schedule_times:
            m.schedule_times.append(beam.schedule_times[-1])

    def _entries(self, raw: torch.Tensor, origin: torch.Tensor, token: torch.Tensor) -> list[list[Entry]]:
        """Each candidate's hypothesis entries (its origin beam's + the new token's): the chosen
        token always (the /v2 outputs report per-token logprobs of every beam), the top-N when asked."""
        n = raw.shape[1] if self.num_logprobs == -1 else self.num_logprobs or 0
        top_v, top_i = raw.topk(n, dim=-1) if n else (raw[:, :0], raw[:, :0].long())
        out = []
        for o, t in zip(origin.tolist(), token.tolist()):
            chosen = float(raw[o, t])
            rank = int((raw[o] > chosen).sum()) + 1
            entry = (t, chosen, rank, list(zip(top_i[o].tolist(), top_v[o].tolist())))
            out.append([*self.entries.get(self.running[o].request_id, []), entry])
        return out

    def _rows(self, origin: torch.Tensor) -> list[list[torch.Tensor]] | None:
        """return_generation_logits: each candidate's raw logits rows (its origin beam's + this round's)."""
        if not self.request.params.return_generation_logits:
            return None
        return [[*self.rows.get(self.running[o].request_id, []), self.reported_logits[self.running[o].request_id]]
                for o in origin.tolist()]  # fmt: skip

    def _update_finished(
        self, vals: torch.Tensor, origin: torch.Tensor, token: torch.Tensor, hits: torch.Tensor,
        entries: list[list[Entry]], rows: list[list[torch.Tensor]] | None = None,
    ) -> None:  # fmt: skip
        b = self.num_beams
        just = hits & (torch.arange(len(vals)) < b)
        norm = vals / float(self.cur_len + 1 - self.prompt_len) ** self.length_penalty
        if bool(self.fin_flags.all()) and self.early_stopping is True:
            norm = norm + _NEG
        if not self.unsatisfied:
            norm = norm + _NEG
        norm = norm + (~just).float() * _NEG
        seqs = self.fin_seqs + [self.running[int(o)].output_token_ids + [int(t)] for o, t in zip(origin, token)]
        all_entries = self.fin_entries + entries
        all_rows = self.fin_rows + (rows or [[] for _ in entries])
        raw = self.fin_raw + vals.tolist()
        scores = torch.cat([self.fin_scores, norm])
        flags = torch.cat([self.fin_flags, just])
        top = scores.topk(b).indices
        self.fin_scores, self.fin_flags = scores[top], flags[top]
        self.fin_seqs = [seqs[i] for i in top.tolist()]
        self.fin_entries = [all_entries[i] for i in top.tolist()]
        self.fin_rows = [all_rows[i] for i in top.tolist()]
        self.fin_raw = [raw[i] for i in top.tolist()]

    def _update_stop(self, all_hit: bool) -> None:
        lp = self.length_penalty
        if self.early_stopping == "never" and lp > 0.0:
            hyp_len = self.max_length - self.prompt_len
        else:
            hyp_len = self.cur_len - self.prompt_len
        best = self.running_scores[0] / float(hyp_len) ** lp
        worst = torch.where(self.fin_flags, self.fin_scores.min(), torch.tensor(_NEG))
        self.unsatisfied = self.unsatisfied and bool((best > worst).any())
        full = bool(self.fin_flags.all()) and self.early_stopping is True
        self.done = not self.unsatisfied or full or all_hit

    def output(self, tokenizer, finish_reason: str | None = None) -> RequestOutput:  # type: ignore[no-untyped-def]
        """The n best finished hypotheses (or, when ended early, the best running beams)."""
        if finish_reason is None:
            hyps = [(self.fin_seqs[i], self.fin_raw[i], self.fin_entries[i], self.fin_rows[i]) for i in range(self.n)]
        else:
            hyps = [(r.output_token_ids, r.cumulative_logprob, self.entries.get(r.request_id, []), self.rows.get(r.request_id, []))
                    for r in self.running[: self.n]]  # fmt: skip
        outs = []
        for i, (tokens, raw, entries, rows) in enumerate(hyps):
            text = tokenizer.decode(tokens, skip_special_tokens=self.request.params.skip_special_tokens) if tokenizer else ""
            reason, why = finish_reason, None
            if reason is None:
                why = self.stop.hit(tokens) if tokens and tokens[-1] not in self.eos else None
                reason = "stop" if (tokens and tokens[-1] in self.eos) or why is not None else "length"
                if tokens and tokens[-1] in self.request.params.stop_token_ids:
                    why = tokens[-1]
                text = self.stop.cut(text, why)
            lps = _logprobs(entries, tokenizer)
            outs.append(CompletionOutput(i, text, list(tokens), raw, lps, reason, why, delta_text=text, delta_token_ids=list(tokens),
                                         delta_logprobs=lps, generation_logits=torch.stack(rows) if rows else None))  # fmt: skip
        return RequestOutput(
            request_id=self.request_id, prompt=self.request.prompt,
            prompt_token_ids=self.request.prompt_token_ids, outputs=outs, finished=True, metrics=self.metrics,
            context_logits=self.context_logits, num_cached_tokens=self.metrics.num_cached_tokens,
        )  # fmt: skip


class StopCheck:
    """Stop words of a beam search, checked on each candidate as HF's stopping criteria are: a
    candidate that ends with a token stop sequence, or whose text holds a stop string, finishes
    its hypothesis. As for sampled requests, they count from `min_tokens` generated tokens on."""

    def __init__(self, request: Request, tokenizer: Any) -> None:
        p = request.params
        self.seqs = [list(s) for s in p.stop_token_sequences or []]
        self.strings = list(p.stop or []) if tokenizer is not None else []
        self.min_tokens = p.min_tokens
        self.include = p.include_stop_str_in_output
        self.skip_special = p.skip_special_tokens
        self.tokenizer = tokenizer
        self.active = bool(self.seqs or self.strings)

    def hit(self, tokens: list[int]) -> int | str | None:
        """The stop sequence (as a string, as the scheduler names it) or stop string `tokens` end on."""
        if len(tokens) < self.min_tokens:
            return None
        for seq in self.seqs:
            if tokens[len(tokens) - len(seq) :] == seq:
                return str(seq)
        if self.strings:
            text = self.tokenizer.decode(tokens, skip_special_tokens=self.skip_special)
            for s in self.strings:
                if s in text:
                    return s
        return None

    def cut(self, text: str, why: int | str | None) -> str:
        """A hypothesis's text ends before its stop string (after it with include_stop_str_in_output)."""
        if not isinstance(why, str) or why not in self.strings or why not in text:
            return text
        at = text.index(why)
        return text[: at + (len(why) if self.include else 0)]


# one generated token of a hypothesis: (token id, logprob, rank, [(top id, logprob), ...])
Entry = tuple[int, float, int, list[tuple[int, float]]]


def _logprobs(entries: list[Entry], tokenizer: Any) -> list[dict[int, Logprob]]:
    def name(t: int) -> str | None:
        return tokenizer.decode([t]) if tokenizer is not None else None

    out = []
    for t, lp, rank, top in entries:
        entry = {t: Logprob(lp, rank, name(t))}
        for r, (tid, v) in enumerate(top, start=1):
            entry.setdefault(tid, Logprob(v, r, name(tid)))
        out.append(entry)
    return out
