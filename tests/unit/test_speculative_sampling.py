"""The sampler's speculative-sampling rule on synthetic distributions (no model): the tokens it
keeps follow the target distribution whatever the draft distribution (chi-square over 8000
requests), drafts are kept at the predicted rate, greedy rows are never touched."""

from __future__ import annotations

import torch

from inflight.sample.sampler import DraftRows, Sampler, SamplingBatch

P0 = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])  # target at the first draft position
P1 = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.20, 0.30])  # target at the second (context ignored)
Q = torch.tensor([0.05, 0.05, 0.50, 0.05, 0.30, 0.05])  # the draft model's distribution at both


def _p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = float(counts.sum())
    stat = float(((counts - n * probs) ** 2 / (n * probs)).sum())
    return float(
        torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2), torch.tensor(stat / 2))
    )


def _drafts(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.multinomial(Q, 2 * n, replacement=True, generator=g).view(n, 2)


def _run(n: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """n requests with two drafts each (d ~ Q): rows 3i, 3i + 1 verify them, 3i + 2 is the bonus."""
    drafts = _drafts(n)
    logits = torch.stack([P0.log(), P1.log(), P1.log()]).repeat(n, 1)  # (3n, V)
    rows = 3 * n
    batch = SamplingBatch.build(
        temperatures=[temperature] * rows, top_ks=[0] * rows, top_ps=[1.0] * rows,
        generators={}, num_logprobs=[None] * rows, device=torch.device("cpu"),
    )  # fmt: skip
    batch.drafts = [
        DraftRows(3 * i, drafts[i].tolist(), Q.log().repeat(2, 1), temperature) for i in range(n)
    ]
    torch.manual_seed(1)
    tokens = torch.tensor([s.token_id for s in Sampler()(logits, batch)]).view(n, 3)
    return drafts, tokens


def test_kept_tokens_follow_the_target() -> None:
    n = 8000
    drafts, tokens = _run(n, 1.0)
    first_kept = tokens[:, 0] == drafts[:, 0]
    # the first output token is the draft when kept, else the redrawn token: either way ~ P0
    assert _p_value(torch.bincount(tokens[:, 0], minlength=6).float(), P0) > 1e-3
    rate = float(torch.minimum(P0, Q).sum())
    assert abs(float(first_kept.float().mean()) - rate) < 4 * (rate * (1 - rate) / n) ** 0.5
    # a rejected draft is redrawn from max(0, P0 - Q): never the draft itself
    assert bool((tokens[~first_kept, 0] != drafts[~first_kept, 0]).all())
    # after a kept first draft, the second token (kept draft or redrawn) ~ P1
    assert _p_value(torch.bincount(tokens[first_kept, 1], minlength=6).float(), P1) > 1e-3
    # with both kept the bonus row is an ordinary draw from its own distribution
    both = first_kept & (tokens[:, 1] == drafts[:, 1])
    assert _p_value(torch.bincount(tokens[both, 2], minlength=6).float(), P1) > 1e-3


def test_the_rule_has_power() -> None:
    """Keeping every draft would follow Q, not P0: the same test tells them apart."""
    drafts = _drafts(8000)
    assert _p_value(torch.bincount(drafts[:, 0], minlength=6).float(), P0) < 1e-6


def test_greedy_rows_are_left_to_the_scheduler() -> None:
    _, tokens = _run(50, 0.0)
    assert bool((tokens == torch.tensor([0, 5, 5])).all())  # argmax of each row, drafts ignored
