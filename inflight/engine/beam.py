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
The engine then forks the chosen beams (engine/llm_engine.py `_advance_beams`).
"""

from __future__ import annotations

import torch

from inflight.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from inflight.request import Request

_NEG = -1.0e9  # HF's "impossible" score


class BeamGroup:
    def __init__(self, request: Request) -> None:
        p = request.params
        self.request = request
        self.num_beams = p.num_beams
        self.n = p.n
        self.length_penalty = p.length_penalty
        self.early_stopping = p.early_stopping
        self.eos = () if p.ignore_eos else ((p.end_id,) if p.end_id is not None else request.eos_token_ids)
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
        self.fin_lps: list[list[float]] = [[] for _ in range(b)]  # per-token logprobs of fin_seqs
        self.token_lps: dict[str, list[float]] = {}  # running beam id -> its tokens' logprobs
        self.unsatisfied = True
        self.done = False
        self.metrics = RequestMetrics(arrival_time=request.arrival_time)
        self._ids = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def new_beam(self, tokens: list[int], score: float, origin: Request | None = None) -> Request:
        """A Request for a beam with these generated tokens (its KV comes from a fork of `origin`,
        whose last token's logprob is the score difference: running scores are raw sums)."""
        r = self.request
        beam = Request(
            f"{r.request_id}#beam{self._ids}", r.prompt_token_ids, r.params, prompt=r.prompt,
            priority=r.priority, timeout_s=r.deadline - r.arrival_time, arrival_time=r.arrival_time,
            eos_token_ids=r.eos_token_ids, max_tokens=r.max_tokens,
        )  # fmt: skip
        self._ids += 1
        for t in tokens:
            beam.append_token(t)
        beam.cumulative_logprob = score
        lps = [] if origin is None else [*self.token_lps.get(origin.request_id, []), score - origin.cumulative_logprob]
        self.token_lps[beam.request_id] = lps
        beam.beam_group_id = r.request_id
        beam.prompt_embedding_table, beam.cache_salt = r.prompt_embedding_table, r.cache_salt
        beam.lora = r.lora
        beam.mm_items, beam.mrope_positions, beam.mrope_delta = r.mm_items, r.mrope_positions, r.mrope_delta
        return beam

    def ready(self) -> bool:
        return all(b.request_id in self.reported for b in self.running)

    def step(self) -> list[tuple[Request, int, float]]:
        """One HF beam round. Returns the next running beams as (origin beam, token, raw score)."""
        b = self.num_beams
        self.token_lps = {r.request_id: self.token_lps.get(r.request_id, []) for r in self.running}  # drop retired beams
        lps = torch.stack([self.reported[r.request_id].float().cpu() for r in self.running])  # (R, V)
        vocab = lps.shape[1]
        acc = (lps + self.running_scores[:, None]).reshape(-1)
        k = min(max(2, 1 + len(self.eos)) * b, acc.numel())
        vals, idx = acc.topk(k)
        origin, token = idx // vocab, idx % vocab
        hits = torch.isin(token, torch.tensor(self.eos, dtype=torch.long)) | (self.cur_len + 1 >= self.max_length)
        run_vals = vals + hits.float() * _NEG
        nxt = run_vals.topk(min(b, k)).indices
        self._update_finished(vals, origin, token, hits)
        chosen = [(self.running[int(origin[j])], int(token[j]), float(run_vals[j])) for j in nxt]
        self.running_scores = run_vals[nxt]
        self.cur_len += 1
        self._update_stop(bool(hits.all()))
        self.reported.clear()
        return chosen

    def _update_finished(
        self, vals: torch.Tensor, origin: torch.Tensor, token: torch.Tensor, hits: torch.Tensor
    ) -> None:
        b = self.num_beams
        just = hits & (torch.arange(len(vals)) < b)
        norm = vals / float(self.cur_len + 1 - self.prompt_len) ** self.length_penalty
        if bool(self.fin_flags.all()) and self.early_stopping is True:
            norm = norm + _NEG
        if not self.unsatisfied:
            norm = norm + _NEG
        norm = norm + (~just).float() * _NEG
        seqs = self.fin_seqs + [self.running[int(o)].output_token_ids + [int(t)] for o, t in zip(origin, token)]
        step_lps = (vals - self.running_scores[origin]).tolist()
        lps = self.fin_lps + [[*self.token_lps.get(self.running[int(o)].request_id, []), lp] for o, lp in zip(origin, step_lps)]
        raw = self.fin_raw + vals.tolist()
        scores = torch.cat([self.fin_scores, norm])
        flags = torch.cat([self.fin_flags, just])
        top = scores.topk(b).indices
        self.fin_scores, self.fin_flags = scores[top], flags[top]
        self.fin_seqs = [seqs[i] for i in top.tolist()]
        self.fin_lps = [lps[i] for i in top.tolist()]
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
            hyps = [(self.fin_seqs[i], self.fin_raw[i], self.fin_lps[i]) for i in range(self.n)]
        else:
            hyps = [(r.output_token_ids, r.cumulative_logprob, self.token_lps.get(r.request_id, [])) for r in self.running[: self.n]]
        outs = []
        for i, (tokens, raw, lps) in enumerate(hyps):
            reason = finish_reason or ("stop" if tokens and tokens[-1] in self.eos else "length")
            text = tokenizer.decode(tokens, skip_special_tokens=self.request.params.skip_special_tokens) if tokenizer else ""
            entries = [{t: Logprob(lp)} for t, lp in zip(tokens, lps)]  # the chosen tokens' logprobs
            outs.append(CompletionOutput(i, text, list(tokens), raw, entries, reason, delta_text=text, delta_token_ids=list(tokens)))
        return RequestOutput(
            request_id=self.request_id, prompt=self.request.prompt,
            prompt_token_ids=self.request.prompt_token_ids, outputs=outs, finished=True, metrics=self.metrics,
        )  # fmt: skip
