"""A step's results into its requests (`Scheduler.update_from_output`, once a step): computed
counts advanced, sampled tokens appended, the token-level stop checks run (core/pieces.py)."""

from __future__ import annotations

import time
from typing import Any

from inflight.core.pieces import accepted_drafts, append_tokens
from inflight.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.request import Request, RequestStatus

Scheduler = Any  # core/scheduler.py's, which imports this module: its requests, held siblings, finish
_FINISHED = RequestStatus.FINISHED


def update_requests(sched: Scheduler, out: SchedulerOutput, runner: ModelRunnerOutput) -> list[Request]:
    """Advance computed counts, append sampled tokens, run the token-level stop checks.
    Returns the requests that got a token this step (some now finished)."""
    now = time.perf_counter()
    batch_size = len(out.scheduled)
    touched: list[Request] = []
    requests, got, num_steps = sched.requests, runner.sampled, out.num_steps
    cache = sched.kv.enable_prefix_caching  # (cache_computed_blocks does nothing without: no call)
    for sr in out.scheduled:
        rid = sr.request_id
        req = requests.get(rid)
        if req is None or req.status == _FINISHED or req.serial != sr.serial:
            continue  # finished while the step ran (async scheduling; its id may be reused): dropped
        k = sr.num_draft_tokens
        sampled = got.get(rid, [])
        if not k and sr.samples and len(sampled) == 1 and not sched.held and req.beam_group_id is None:
            # a decode's one token (most pieces of a large batch): the general path's steps, fewer lookups
            req.num_pending -= 1
            if cache:
                sched.kv.cache_computed_blocks(req)
            req.grammar_terminated = rid in runner.grammar_terminated
            if (stop := append_tokens(req, sampled, now, batch_size)) is not None:
                sched.finish(req, *stop)  # (a request here is running: only this can finish it)
            touched.append(req)
            continue
        if k:  # drafts are never scheduled ahead: the request is running, nothing is pending
            tokens = accepted_drafts(req, sampled)
            # only KV of accepted tokens is valid: rejected drafts' slots are overwritten later
            req.num_computed_tokens += sr.num_tokens - k + max(0, len(tokens) - 1)
        else:  # computed counted at schedule time (_piece); the sampled token is no longer pending
            tokens = sampled[:num_steps] if sr.samples else []
            req.num_pending -= sr.samples
            req.num_computed_tokens += max(0, len(tokens) - 1)  # several passes: pass i wrote token i - 1's KV
        sched.kv.cache_computed_blocks(req)
        if sched.held and req.num_computed_tokens >= req.num_prompt_tokens:
            sched.release_children(req, share=True)
        if req.beam_group_id is not None:  # its group appends the token (engine/beam.py)
            if sr.samples:  # ... and reports this step's time and batch size as the search's
                req.metrics.token_times.append(now)
                req.metrics.batch_sizes.append(batch_size)
            continue
        req.grammar_terminated = sr.request_id in runner.grammar_terminated
        if tokens:  # a request preempted while this step ran still gets its token
            if (stop := append_tokens(req, tokens, now, batch_size)) is not None:
                sched.finish(req, *stop)
            touched.append(req)
    return touched
