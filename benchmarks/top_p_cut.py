"""Top-k / top-p cut per sampler step: the cut from the best PARTIAL_TOP tokens (what the sampler
does) against sorting the whole rows (what it did before, still its fallback), in one process,
interleaved, medians of --repeat calls. Three kinds of logits over a 152k vocabulary:
`zipf2` (probabilities ~ 1 / rank^2, shuffled: a trained model's peaked shape, the 0.9 nucleus a
few tokens), `zipf1.1` (1 / rank^1.1: a heavy tail, the nucleus ~16k tokens, past the best 1024)
and `flat` (N(0, 1) logits, a random-weight model's: the nucleus is most of the vocabulary). The
last two are sorted whole; `flat` is recognised before topk (best probability x 1024 < top_p).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/top_p_cut.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from step_host_time import cpu_name

from inflight.sample.sampler import _cut_by_sort, apply_top_k_top_p


def logits_of(kind: str, rows: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if kind == "flat":
        return torch.randn(rows, vocab, generator=g)
    ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
    base = -float(kind[4:]) * ranks.log()
    return torch.stack([base[torch.randperm(vocab, generator=g)] for _ in range(rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=152_064)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{cpu_name()}, torch threads {args.threads}; V {args.vocab:,}; median ms per call of {args.repeat}")
    for kind in ("zipf2", "zipf1.1", "flat"):
        for rows in (1, 32):
            x = logits_of(kind, rows, args.vocab)
            for top_k in (0, 50):
                k, p = torch.full((rows,), top_k), torch.full((rows,), 0.9)
                kk = torch.where(k <= 0, args.vocab, k)
                new, old = [], []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    a = apply_top_k_top_p(x, k, p)
                    new.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    b = _cut_by_sort(x, kk, p)
                    old.append(time.perf_counter() - t)
                assert torch.equal(a.isfinite(), b.isfinite())  # the same tokens kept
                n, o = statistics.median(new) * 1e3, statistics.median(old) * 1e3
                kept = int(a.isfinite().sum(dim=-1).float().mean())
                print(f"  {kind} B {rows:>2} top_k {top_k:>2} top_p 0.9: sort {o:8.2f}  cut {n:8.2f}  ({o / n:5.1f}x; {kept} kept)")


if __name__ == "__main__":
    main()
