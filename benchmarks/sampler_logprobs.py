"""The sampler with and without the chosen tokens' logprobs, per step of B rows over a V vocabulary.

`on` is what every step paid before `RequestInputs.chosen_logprobs` (a log-softmax over every
logit, for cumulative_logprob); `off` is a step none of whose rows reads a logprob (the servers'
requests that ask for no logprobs). Greedy rows (argmax) and sampled rows (temperature, top-k,
top-p, seeds) alike; A and B interleaved in one process, medians of --repeat calls each:

    OMP_WAIT_POLICY=PASSIVE python benchmarks/sampler_logprobs.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from step_host_time import cpu_name

from inflight.sample.sampler import Sampler, SamplingBatch


def batch(rows: int, greedy: bool, chosen: bool) -> SamplingBatch:
    if greedy:
        return SamplingBatch.greedy(rows, chosen_logprobs=chosen)
    gens = {r: torch.Generator().manual_seed(r) for r in range(rows)}
    b = SamplingBatch.build([0.8] * rows, [50] * rows, [0.9] * rows, gens, [None] * rows, torch.device("cpu"))
    b.chosen_logprobs = chosen
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sampler = Sampler()
    print(f"{cpu_name()}, torch threads {args.threads}; median ms per sampler call of {args.repeat}")
    for vocab in (32_000, 152_064):
        for rows in (1, 32):
            logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
            for greedy in (True, False):
                times: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(args.repeat):
                    for chosen in (True, False):  # interleaved: load on the machine hits both alike
                        b = batch(rows, greedy, chosen)
                        t = time.perf_counter()
                        sampler(logits, b)
                        times[chosen].append(time.perf_counter() - t)
                on, off = (statistics.median(times[c]) * 1e3 for c in (True, False))
                kind = "greedy " if greedy else "sampled"
                print(f"  V {vocab:>7,} x B {rows:>2} {kind}: logprobs on {on:8.3f}  off {off:8.3f}  ({off / on:.2f}x)")


if __name__ == "__main__":
    main()
