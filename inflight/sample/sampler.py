"""Batched sampling over one step's logits.

Order of work on the (B, V) float32 logits, one row per sampling request:
  1. log_softmax of the *raw* logits, as vLLM and HF report logprobs (the chosen
     token's feeds cumulative_logprob; top-N and rank only where asked);
  2. logits processors (biases, penalties, banned tokens: sample/processors.py);
  3. greedy rows: argmax. Random rows: temperature, top-k, top-p, min-p,
     typical-p (HF's order), then the
     exponential race `argmax(p / q)`, q ~ Exp(1), which is a draw from p; seeded
     rows draw q from their own generator so a seed fixes the tokens whatever
     else shares the batch;
  4. rows verifying draft tokens against the draft model's logits: the speculative-sampling
     rule (Leviathan et al. / Chen et al.): draft d_i is kept with probability
     min(1, p_i(d_i) / q_i(d_i)), p the target distribution of step 3, q = softmax(draft logits
     / temperature); the first rejected row is redrawn from norm(max(0, p_i - q_i)), so it never
     equals its draft. The output follows p exactly. (Drafts without logits need nothing here:
     independent draws from p, kept while they match the drafts, follow p too.)
Everything stays on the device until one `.tolist()` at the end of the step.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from inflight.outputs import SampledToken

LogitsProcessor = Callable[[torch.Tensor], torch.Tensor]  # (B, V) -> (B, V), may work in place


@dataclass
class DraftRows:
    """K + 1 consecutive rows of one request: rows `row` .. `row + K - 1` verify the drafts, the
    last one samples the token after them (kept when every draft is)."""

    row: int
    token_ids: list[int]  # the K drafts
    logits: torch.Tensor  # (K, V) the draft model's logits (CPU)
    temperature: float  # the request's (> 0: greedy requests are verified by the scheduler)


@dataclass
class GreedyRows:
    """Each row's argmax, and its log-softmax where asked, taken by the CPU decode kernel beside
    its logits (models/cpu_kernel.py `logits`): a plain greedy step then reads nothing else of its
    (B, V) logits. Empty (None) until the kernel fills it in; where the lm_head ran in torch it
    stays empty and the sampler computes both."""

    want_logprobs: bool  # some row reads its chosen token's logprob (cumulative_logprob)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None  # None: not asked


@dataclass
class SamplingBatch:
    """Per-row sampling settings of one step, as tensors on the logits' device."""

    temperature: torch.Tensor  # (B,) float32; 0 for greedy rows
    top_k: torch.Tensor | None  # (B,) int64, 0 = off; None when no row uses it
    top_p: torch.Tensor | None  # (B,) float32, 1 = off; None when no row uses it
    min_p: torch.Tensor | None  # (B,) float32, 0 = off; None when no row uses it
    typical_p: torch.Tensor | None  # (B,) float32, 1 = off; None when no row uses it
    generators: dict[int, torch.Generator]  # row -> the request's own generator
    num_logprobs: list[int | None]  # per row: None = not asked, N = chosen + top-N
    all_greedy: bool
    processors: list[LogitsProcessor] = field(default_factory=list)
    drafts: list[DraftRows] = field(default_factory=list)  # sampled rows verifying draft logits
    # vLLM's logprob_token_ids: per row, the ids whose logprobs it reports (None: not asked)
    logprob_ids: list[list[int] | None] = field(default_factory=list)
    # some row reads its chosen token's logprob (RequestInputs.chosen_logprobs); else no log-softmax
    chosen_logprobs: bool = True
    # plain greedy rows: the argmax (and logprobs) the decode kernel took beside the logits, if it did
    greedy_rows: GreedyRows | None = None

    @classmethod
    def build(
        cls,
        temperatures: list[float],
        top_ks: list[int],
        top_ps: list[float],
        generators: dict[int, torch.Generator],
        num_logprobs: list[int | None],
        device: torch.device,
        min_ps: list[float] | None = None,
        typical_ps: list[float] | None = None,
    ) -> SamplingBatch:
        """From per-row lists (the runner reads its persistent columns instead: `of_rows`)."""
        n = len(temperatures)
        cols = np.array(
            [[clamp_temperature(t) for t in temperatures], [max(k, 0) for k in top_ks], top_ps,
             min_ps or [0.0] * n, typical_ps or [1.0] * n], dtype=np.float32,
        ).T  # fmt: skip
        return cls.of_rows(cols, generators, num_logprobs, device)

    @classmethod
    def greedy(cls, rows: int, chosen_logprobs: bool = True, taken: GreedyRows | None = None) -> SamplingBatch:
        """Argmax rows that ask for nothing else (no logprobs, processors or seeds): no tensors.
        `taken`: the tokens (and logprobs) the decode kernel already took, where it did."""
        return cls(_NO_TENSOR, None, None, None, None, {}, [None] * rows, all_greedy=True, chosen_logprobs=chosen_logprobs,
                   greedy_rows=taken)  # fmt: skip

    @classmethod
    def of_rows(
        cls, cols: np.ndarray, generators: dict[int, torch.Generator], num_logprobs: list[int | None], device: torch.device
    ) -> SamplingBatch:
        """From the step's rows of the runner's sampling columns ((B, 5) float32, SAMPLING_OFF's
        order; temperature clamped): one host->device copy; a warper no row uses is None (skipped)."""
        used = (cols != np.array(SAMPLING_OFF, np.float32)).any(axis=0)
        t = torch.from_numpy(np.ascontiguousarray(cols.T)).to(device, non_blocking=True)  # (5, B)
        return cls(
            temperature=t[0],
            top_k=t[1].long() if used[1] else None,
            top_p=t[2] if used[2] else None,
            min_p=t[3] if used[3] else None,
            typical_p=t[4] if used[4] else None,
            generators=generators,
            num_logprobs=num_logprobs,
            all_greedy=not used[0],
        )


_NO_TENSOR = torch.empty(0)  # the temperature of an all-greedy batch: never read

# the sampling columns and the value at which each is off: temperature (0 = greedy), top-k, top-p,
# min-p, typical-p
SAMPLING_OFF = (0.0, 0.0, 1.0, 0.0, 1.0)


def clamp_temperature(t: float) -> float:
    """float32 can't divide logits by 1e-40 (inf -> NaN probabilities) or by 1e308 (inf; -inf / inf
    is NaN): temperatures outside [1e-5, 1e5] sample as the nearest bound (indistinguishable: 1e-5
    is already argmax for logit gaps > 1e-3, 1e5 already uniform); 0 stays greedy."""
    return 0.0 if t == 0 else min(max(t, 1e-5), 1e5)


class Sampler:
    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> list[SampledToken]:
        """Greedy rows take the argmax of the (processed) raw logits, as HF does, whether or not
        the step computes logprobs: a row's token never depends on the rows beside it."""
        taken = batch.greedy_rows  # the decode kernel's argmax (and logprobs): nothing left to compute
        if taken is not None and taken.token_ids is not None and (taken.logprobs is not None or not batch.chosen_logprobs):
            lps = taken.logprobs if batch.chosen_logprobs else None
            return [SampledToken(t, math.nan if lps is None else lps[i]) for i, t in enumerate(taken.token_ids)]
        plain = batch.all_greedy and not batch.processors
        only_chosen = batch.chosen_logprobs and all(n is None for n in batch.num_logprobs) and not any(batch.logprob_ids)
        # the token and its logprob only: one C pass a row where the quant kernels are loaded
        if plain and only_chosen and (fast := _c_row_stats(logits, True)) is not None and fast[1] is not None:
            return [SampledToken(t, lp) for t, lp in zip(fast[0].tolist(), fast[1].tolist())]
        # log_softmax is one fused pass over every logit (1.2 ms for 32 x 152k on 2 quiet threads,
        # 35 ms on one loaded one; logsumexp takes 3.2): skipped when no row reads a logprob
        logprobs = torch.log_softmax(logits, dim=-1) if batch.chosen_logprobs else None
        if plain:
            return self._pack(logprobs, row_argmax(logits), batch)
        processed = logits
        if batch.processors:
            processed = logits.clone()  # processors work in place; logprobs stay on the raw logits
            for proc in batch.processors:
                processed = proc(processed)
        if batch.all_greedy:
            tokens = row_argmax(processed)
        else:
            tokens, probs = self._sample(processed, batch)
            sampled_drafts = [d for d in batch.drafts if d.temperature > 0]  # greedy: the scheduler matches argmaxes
            if sampled_drafts:
                self._verify_drafts(tokens, probs, sampled_drafts, batch)
        return self._pack(logprobs, tokens, batch)

    @staticmethod
    def _verify_drafts(tokens: torch.Tensor, probs: torch.Tensor, drafts: list[DraftRows], batch: SamplingBatch) -> None:
        """The speculative-sampling rule over every draft row of the step (R rows in all), in place
        on `tokens`. Seeded requests draw from their own generators."""
        dev = probs.device
        rows = torch.tensor([d.row + i for d in drafts for i in range(len(d.token_ids))], device=dev)
        ids = torch.tensor([t for d in drafts for t in d.token_ids], device=dev)  # (R,)
        temps = torch.tensor([d.temperature for d in drafts for _ in d.token_ids], device=dev)
        p = probs[rows]  # (R, V) target distributions at the draft positions
        q = torch.softmax(torch.cat([d.logits for d in drafts]).to(dev) / temps[:, None], dim=-1)  # (R, V)
        p_d, q_d = p.gather(1, ids[:, None])[:, 0], q.gather(1, ids[:, None])[:, 0]
        u = torch.rand(len(ids), device=dev)
        noise = torch.empty_like(p).exponential_()
        starts, start = [], 0
        for d in drafts:
            k, gen = len(d.token_ids), batch.generators.get(d.row)
            if gen is not None:
                u[start : start + k] = torch.rand(k, device=dev, generator=gen)
                noise[start : start + k].exponential_(generator=gen)
            starts.append(start)
            start += k
        rejected = (u * q_d >= p_d).long()  # kept with probability min(1, p / q)
        # a draft stays only if no earlier draft of its request was rejected (nor itself)
        seg = torch.repeat_interleave(torch.arange(len(drafts), device=dev), torch.tensor([len(d.token_ids) for d in drafts], device=dev))
        cum = rejected.cumsum(0)
        before = (cum - rejected)[torch.tensor(starts, device=dev)]  # rejections before each request's first row
        kept = cum - before[seg] == 0
        residual = (p - q).clamp(min=0)
        empty = residual.sum(dim=-1, keepdim=True) <= 0  # p == q (rounding): no rejection happens
        residual = torch.where(empty, p, residual)
        redrawn = row_argmax(residual / noise)  # a draw from norm(residual)
        tokens[rows] = torch.where(kept, ids, redrawn)

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        greedy = batch.temperature == 0
        temp = torch.where(greedy, torch.ones_like(batch.temperature), batch.temperature)
        scaled = logits / temp[:, None]
        scaled = apply_warpers(scaled, batch)
        probs = torch.softmax(scaled, dim=-1)
        q = torch.empty_like(probs).exponential_()
        for row, gen in batch.generators.items():
            q[row].exponential_(generator=gen)
        sampled = row_argmax(probs / q)
        return torch.where(greedy, row_argmax(logits), sampled), probs

    @staticmethod
    def _pack(logprobs: torch.Tensor | None, tokens: torch.Tensor, batch: SamplingBatch) -> list[SampledToken]:
        """Chosen-token logprobs for every row (cumulative_logprob), top-N and rank where asked;
        without `logprobs` (no row reads one) the tokens alone, their logprob NaN."""
        if logprobs is None:
            return [SampledToken(t, math.nan) for t in tokens.tolist()]
        chosen = logprobs.gather(1, tokens[:, None])[:, 0]
        rows = logprobs.shape[0]
        max_n = max((n for n in batch.num_logprobs if n is not None), default=None)
        if max_n is None and not any(batch.logprob_ids):  # token + chosen logprob only: 2 values a row
            both = torch.stack((tokens.to(torch.float64), chosen.to(torch.float64)), dim=1).tolist()
            return [SampledToken(int(t), lp) for t, lp in both]
        parts = [tokens.to(torch.float64), chosen.to(torch.float64)]
        if max_n is not None:
            rank = (logprobs > chosen[:, None]).sum(dim=-1) + 1
            parts.append(rank.to(torch.float64))
            if max_n > 0:
                top_v, top_i = logprobs.topk(max_n, dim=-1)
                parts += [top_i.to(torch.float64).T, top_v.to(torch.float64).T]
        asked = [ids or [] for ids in batch.logprob_ids] if any(batch.logprob_ids) else []
        width = max((len(ids) for ids in asked), default=0)
        if width:  # the asked ids' logprobs ride in the same copy (rows padded with id 0)
            index = torch.tensor([ids + [0] * (width - len(ids)) for ids in asked], device=logprobs.device)
            parts.append(logprobs.gather(1, index).to(torch.float64).T)
        host = torch.cat([p.reshape(-1, rows) for p in parts]).T.tolist()  # the one device->host copy
        out = []
        for row, vals in enumerate(host):
            n = batch.num_logprobs[row]
            st = SampledToken(int(vals[0]), vals[1])
            if n is not None and max_n is not None:
                st.rank = int(vals[2])
                ids, lps = vals[3 : 3 + max_n], vals[3 + max_n : 3 + 2 * max_n]
                st.top = [(int(ids[j]), lps[j]) for j in range(n)]
            if width and asked[row]:
                got = vals[len(vals) - width :]
                st.top, st.asked = None, [(t, got[j]) for j, t in enumerate(asked[row])]  # instead of the top-N
            out.append(st)
        return out


def _c_row_stats(x: torch.Tensor, logprobs: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """quant/kernels.py row_stats (each row's argmax, and its log-softmax) where this process already
    loaded the quant kernels (a worker running a quantized model: right after the decode step torch's
    ops run cache-cold, 0.22 ms for an argmax at 152k); looked up, not imported: the mp executor's
    engine process never imports the model packages (test_mp_executor). None otherwise."""
    kernels = sys.modules.get("inflight.quant.kernels")
    return kernels.row_stats(x, logprobs) if kernels is not None and x.device.type == "cpu" else None


def row_argmax(x: torch.Tensor, chunk: int = 128) -> torch.Tensor:
    """`x.argmax(dim=-1)` of a (B, V) tensor: the same indices (the first maximum; NaN counts as
    the maximum). On CPU torch's argmax reduction is scalar while amax is vectorized, so this
    takes the max of each `chunk` of a row, the argmax over those (V / chunk values), then the
    argmax inside the winning chunk: 0.26 vs 1.4 ms for 32 x 152k float32 on 2 threads."""
    if (fast := _c_row_stats(x, False)) is not None:
        return fast[0]
    rows, n = x.shape
    whole = n // chunk * chunk
    # below ~32k values the plain reduction wins: its ~1 ns a value vs the ~45 us of the 15 small ops
    # below (Zen 4, one thread: 1 x 1,000 2.5 vs 48 us; 1 x 49,152 48 vs 25 us)
    if x.device.type != "cpu" or whole == 0 or x.stride(1) != 1 or rows * n <= 32768:
        return x.argmax(dim=-1)
    chunks = x.as_strided((rows, whole // chunk, chunk), (x.stride(0), chunk, 1))
    best_chunk = chunks.amax(dim=-1).argmax(dim=-1)
    r = torch.arange(rows, device=x.device)
    best = chunks[r, best_chunk].argmax(dim=-1) + best_chunk * chunk
    if whole < n:  # the tail that fills no whole chunk
        tail_v, tail_i = x[:, whole:].max(dim=-1)
        head_v = x[r, best]
        # the tail wins only when strictly greater (the head holds the earlier indices) or NaN
        wins = (tail_v > head_v) | (tail_v.isnan() & ~head_v.isnan())
        best = torch.where(wins, tail_i + whole, best)
    return best


def apply_warpers(scaled: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """HF's warper order after temperature: top-k, top-p, min-p, typical-p."""
    if batch.top_k is not None or batch.top_p is not None:
        scaled = apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
    if batch.min_p is not None:
        scaled = apply_min_p(scaled, batch.min_p)
    if batch.typical_p is not None:
        scaled = apply_typical_p(scaled, batch.typical_p)
    return scaled


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens with probability < min_p * the top probability (the top token always stays)."""
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_typical_p(logits: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling (Meister et al.), as HF: keep the tokens whose surprisal is
    closest to the entropy until `mass` is covered; rows with mass 1 are untouched."""
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    entropy = -(logp * p).nansum(dim=-1, keepdim=True)
    shifted = (-logp - entropy).abs()
    sorted_shift, order = shifted.sort(dim=-1)
    cum = logits.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cum < mass[:, None]).sum(dim=-1).clamp(max=logits.shape[-1] - 1)
    remove_sorted = sorted_shift > sorted_shift.gather(1, last[:, None])
    remove_sorted[:, 0] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    remove &= (mass < 1.0)[:, None]
    return logits.masked_fill(remove, float("-inf"))


# A full sort of 32 x 152k logits takes ~830 ms on one Zen 4 thread, topk(1024) ~48 ms. A trained
# model's top-p nucleus nearly always lies inside its best 1024 tokens: rows are cut from those,
# and only rows whose cut reaches past them (flat distributions, top_k > 1024) pay for the sort.
PARTIAL_TOP = 1024


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask logits outside each row's top-k and top-p nucleus with -inf (ties kept, as HF).
    Rows with both off (top_k <= 0, top_p == 1) are left as they are, as HF adds no warper."""
    rows, vocab = logits.shape
    dev = logits.device
    k = torch.full((rows,), vocab, device=dev) if top_k is None else torch.where(top_k <= 0, vocab, top_k.clamp(max=vocab))
    p = torch.ones(rows, device=dev) if top_p is None else top_p
    width = min(vocab, PARTIAL_TOP)
    on = ((k < vocab) | (p < 1)).nonzero()[:, 0]
    if len(on) == 0:
        return logits
    x, k, p = _rows(logits, on), _rows(k, on), _rows(p, on)
    lse = torch.logsumexp(x, dim=-1)
    # sorted whole: a top_k past `width`, or a nucleus that cannot fit in `width` tokens (its best
    # token's probability times `width` < top_p: a flat row, which would pay for topk and the sort)
    whole = (k > width) & ((k < vocab) | ((x.amax(dim=-1) - lse).exp() * width < p)) | (width == vocab)
    part = (~whole).nonzero()[:, 0]
    cut = None
    if len(part):
        cut_part, fits = _cut_partial(_rows(x, part), _rows(k, part), _rows(p, part), _rows(lse, part), width)
        cut = cut_part if len(part) == len(x) else torch.empty_like(x).index_copy_(0, part, cut_part)
        whole[part[~fits]] = True
    rest = whole.nonzero()[:, 0]
    if len(rest):
        cut_rest = _cut_by_sort(_rows(x, rest), _rows(k, rest), _rows(p, rest))
        cut = cut_rest if len(rest) == len(x) else (torch.empty_like(x) if cut is None else cut).index_copy_(0, rest, cut_rest)
    assert cut is not None
    return cut if len(on) == rows else logits.clone().index_copy_(0, on, cut)


def _rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t[idx], without the copy when idx is every row (the common case: one setting for all)."""
    return t if len(idx) == len(t) else t[idx]


def _cut_partial(
    x: torch.Tensor, k: torch.Tensor, p: torch.Tensor, lse: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cut from each row's best `width` tokens, and which rows it decides: those whose top-k
    ends there (no tie of the k-th value at the edge, where one could lie past it) or, with no top-k, whose best `width` already
    hold top_p of the mass (`lse`: the whole row's log-sum-exp), so that the nucleus ends inside."""
    vals, idx = x.topk(width, dim=-1)  # descending
    kth = torch.where(k <= width, vals.gather(1, (k.clamp(max=width) - 1)[:, None])[:, 0], float("-inf"))
    lse = torch.where(k <= width, torch.logsumexp(vals.masked_fill(vals < kth[:, None], float("-inf")), dim=-1), lse)
    fits = (k <= width) & (vals[:, -1] < kth)  # every token outside `vals` is <= vals[:, -1]
    fits |= (k > width) & ((vals - lse[:, None]).exp().sum(dim=-1) >= p)
    return torch.full_like(x, float("-inf")).scatter(1, idx, _mask_sorted(vals, kth, p, lse)), fits


def _cut_by_sort(x: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The whole rows sorted: any top_k (1..vocab) and top_p."""
    vals, idx = x.sort(dim=-1, descending=True)
    kth = vals.gather(1, (k - 1)[:, None])[:, 0]
    lse = torch.logsumexp(vals.masked_fill(vals < kth[:, None], float("-inf")), dim=-1)
    return x.scatter(1, idx, _mask_sorted(vals, kth, p, lse))


def _mask_sorted(vals: torch.Tensor, kth: torch.Tensor, p: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Descending `vals` with the tokens under the k-th value, and those whose mass before them
    (of the top-k renormalized: `lse`) already reaches top_p, set to -inf; the best one stays."""
    mask = vals < kth[:, None]
    probs = (vals.masked_fill(mask, float("-inf")) - lse[:, None]).exp()
    mask |= (probs.cumsum(dim=-1) - probs) >= p[:, None]
    mask[:, 0] = False
    return vals.masked_fill(mask, float("-inf"))
