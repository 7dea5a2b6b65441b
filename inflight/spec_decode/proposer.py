"""The engine's hook: before each schedule, drafts for the requests that may run this step.

Called by `LLMEngine.step` only when no step is in flight, so every request's last token is
known. What it sets is the scheduler's existing draft state (`Request.draft_token_ids`): the
scheduler appends the drafts to a piece that reaches the end of the known tokens, the runner
samples K + 1 rows, `Scheduler._verify_drafts` keeps the agreeing prefix + the next token.

Per step, not per request: speculation is off in a step whose batch (running + waiting requests,
at most max_num_seqs) is larger than `disable_by_batch_size` (vLLM's name): a large batch
is compute-bound, its K extra rows per request cost more than the accepted tokens save. In such
steps async scheduling (mp) runs ahead as without speculation; in speculating steps it does not
(each step needs the previous one's tokens to propose from).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inflight.spec_decode.config import RUNNER_METHODS, SpeculativeConfig
from inflight.spec_decode.ngram import TokenBuffer, propose_ngram

if TYPE_CHECKING:
    from inflight.core.scheduler import Scheduler
    from inflight.request import Request


class Speculator:
    def __init__(self, config: SpeculativeConfig, vocab_size: int) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self._buffers: dict[tuple[str, int], TokenBuffer] = {}  # (request id, serial) -> its ids
        self._drafted: list[Request] = []  # requests holding drafts proposed here
        # adaptive_k: (request id, serial) -> (its K now, drafts verified and accepted when it was set)
        self._k: dict[tuple[str, int], tuple[int, int, int]] = {}

    def active(self, scheduler: Scheduler) -> bool:
        """Whether this step speculates: the batch it can run (running + waiting, at most
        max_num_seqs) is no larger than disable_by_batch_size."""
        batch = min(scheduler.num_running + scheduler.num_waiting, scheduler.config.max_num_seqs)
        return batch <= self.config.disable_by_batch_size

    def propose(self, scheduler: Scheduler) -> None:
        """Fresh drafts for this step's candidates (none when the batch is too large). With a
        draft model or an EAGLE head: how many drafts the runner proposes after the step (`Request.num_lookahead`);
        the drafts it proposed after the previous step are already set (`absorb`)."""
        ks: dict[tuple[str, int], tuple[int, int, int]] = {}
        if self.config.method in RUNNER_METHODS:
            active = self.active(scheduler)
            for req in (*scheduler.running, *scheduler.waiting):
                req.num_lookahead = max(0, self._num_drafts(req, ks)) if active else 0
                if not active and req.drafts_proposed:
                    req.draft_token_ids = []
            self._k = ks
            return
        for req in self._drafted:  # last step's proposals that were not verified: stale now
            if req.drafts_proposed:
                req.draft_token_ids = []
        self._drafted = []
        live: dict[tuple[str, int], TokenBuffer] = {}
        if self.active(scheduler):
            for req in (*scheduler.running, *scheduler.waiting):
                k = self._num_drafts(req, ks)
                if k <= 0:
                    continue
                key = (req.request_id, req.serial)
                buf = live[key] = self._buffers.get(key) or TokenBuffer()
                drafts = self._propose(buf.sync(req.all_token_ids), k)
                req.draft_token_ids, req.drafts_proposed = drafts, True
                if drafts:
                    self._drafted.append(req)
        self._buffers, self._k = live, ks  # finished requests' state goes

    def absorb(self, requests: list[Request], proposed: dict[str, list[int]]) -> None:
        """The draft model's proposals after a step, for the next one: `requests` ran in the step
        (their drafts, if any, were verified); one without a proposal has none now."""
        for req in requests:
            if req.is_finished or not (req.drafts_proposed or not req.draft_token_ids):
                continue  # a client's drafts wait for their verification
            drafts = proposed.get(req.request_id, [])
            # at most what is left before max_tokens, less the token the verifying step adds
            req.draft_token_ids = drafts[: max(0, req.max_tokens - req.num_output_tokens - 1)]
            req.drafts_proposed = True

    def _num_drafts(self, req: Request, ks: dict[tuple[str, int], tuple[int, int, int]]) -> int:
        """How many drafts `req` may take now: none for beams (their group picks tokens), a token
        still in flight, or a client's own drafts (they take precedence); never past max_tokens (the
        bonus token is the last). Grammars and thinking budgets speculate: each draft row is masked
        by the state after the drafts before it (structured/runtime.py)."""
        k = self._adapt(req, ks) if self.config.adaptive_k else self.config.num_speculative_tokens
        if req.beam_group_id is not None or req.num_pending or req.is_finished:
            return 0
        if req.draft_token_ids and not req.drafts_proposed:
            return 0
        return min(k, req.max_tokens - req.num_output_tokens - 1)

    def _adapt(self, req: Request, ks: dict[tuple[str, int], tuple[int, int, int]]) -> int:
        """adaptive_k: `req`'s K after its last verification (config.py); kept in `ks`."""
        top = self.config.num_speculative_tokens
        key = (req.request_id, req.serial)
        k, seen, kept = self._k.get(key, (top, 0, 0))
        m = req.metrics
        drafted, accepted = m.num_draft_tokens - seen, m.num_accepted_draft_tokens - kept
        if drafted:
            k = min(top, k + 1) if accepted == drafted else max(1, accepted + 1)
        ks[key] = (k, m.num_draft_tokens, m.num_accepted_draft_tokens)
        return k

    def _propose(self, ids, k: int) -> list[int]:  # type: ignore[no-untyped-def]
        c = self.config
        drafts = propose_ngram(ids, k, c.prompt_lookup_min, c.prompt_lookup_max)
        # p-tuning prompts hold virtual ids >= vocab: never a draft
        cut = next((i for i, t in enumerate(drafts) if t >= self.vocab_size), len(drafts))
        return drafts[:cut]
