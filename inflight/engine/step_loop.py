"""The engine core: the step loop (schedule -> execute -> update), one step in flight ahead when
it can (async scheduling), and what a step that raises ends.

It knows sequences only as the scheduler's `Request`s. What a step's output means to the user
(tokens to text and stop strings, n / best_of siblings, beams, a request's own failure) is the
front's, `Sequences` (engine/sequences.py) with the `OutputProcessor`; requests come in through
`LLMEngine` (engine/llm_engine.py), which builds this with the model's executor.
"""

from __future__ import annotations

import logging

from inflight.config import EngineConfig
from inflight.core.pieces import multistep_request
from inflight.core.scheduler import Scheduler
from inflight.engine.sequences import Sequences
from inflight.outputs import RequestOutput, SchedulerOutput
from inflight.request import FinishReason, Request, RequestStatus
from inflight.spec_decode.config import RUNNER_METHODS
from inflight.spec_decode.proposer import Speculator
from inflight.worker.executor import MultiprocExecutor, UniExecutor

logger = logging.getLogger(__name__)


class StepLoop:
    def __init__(
        self, config: EngineConfig, executor: UniExecutor | MultiprocExecutor, scheduler: Scheduler, seqs: Sequences,
        speculator: Speculator | None,
    ) -> None:  # fmt: skip
        self.config = config
        self.executor = executor
        self.scheduler = scheduler
        self.seqs = seqs
        self.requests = seqs.requests  # every scheduled sequence, by id
        self.speculator = speculator  # proposes drafts before each step it schedules (None: off)
        # the steps in progress: fail_step ends their requests (None: none tracked, it ends all)
        self._tracked: list[SchedulerOutput] | None = None
        self._inflight: SchedulerOutput | None = None  # sent to the worker ahead of its output (async scheduling)
        self._inflight_mark = 0  # Scheduler.num_finished when it was scheduled
        self.num_steps_ahead = 0  # steps scheduled before the previous step's output was read
        self.last_step_tokens = 0  # tokens the last step ran (the admission estimate's rate)

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns an output for every request that changed.

        With a worker process (`mp`) and `async_scheduling`, the next step is scheduled and sent
        before this one's output is read, so the worker never waits for the engine: the
        scheduler counts the tokens being sampled as pending (core/scheduler.py) and the runner
        already holds them. A request that stops (EOS, stop string) may have run one more row,
        which is dropped. Steps with beams or drafts are not run ahead of: what comes
        next depends on their output (a grammar does not stop it: the runner's matcher already
        took the token it sampled).

        A request whose own work fails (the runner reports it, or its output processing raises)
        ends alone with `finish_reason` "abort" and `error` set; if the step raises anyway,
        `fail_step` ends the requests it scheduled (and those of the step sent after it)."""
        self._tracked = None
        self.last_step_tokens = 0
        sched, mark, self._inflight = self._inflight, self._inflight_mark, None
        try:
            if sched is None:
                if self.speculator is not None:  # nothing in flight: every last token is known
                    self.speculator.propose(self.scheduler)
                sched = self.scheduler.schedule()
                mark = self.scheduler.num_finished
                if sched.has_work:
                    self.executor.submit(sched)
            self._tracked = [sched]
            ahead = None
            if self._can_run_ahead(sched):
                self.num_steps_ahead += 1
                ahead = self.scheduler.schedule()
                ahead_mark = self.scheduler.num_finished
                self._tracked = [sched, ahead]
                if ahead.has_work:
                    self.executor.submit(ahead)
            outputs = self._finish(sched, mark)
            if ahead is not None and ahead.has_work:
                self._inflight, self._inflight_mark = ahead, ahead_mark
            elif ahead is not None:
                outputs += self._finish(ahead, ahead_mark)
            if not self.scheduler.has_unfinished():
                if self._inflight is not None:  # rows of requests that have all finished since
                    outputs += self._finish(self._inflight, self._inflight_mark)
                    self._inflight = None
                self._release_runner_state()
        except BaseException:
            self._inflight = None
            self.executor.drain()  # the worker answers every step sent: read those answers
            raise
        self._tracked = None
        return outputs

    def _live(self, request_id: str, serial: int) -> bool:
        req = self.requests.get(request_id)
        return req is not None and req.serial == serial and not req.is_finished

    def _can_run_ahead(self, sched: SchedulerOutput) -> bool:
        """Can the step after `sched` be scheduled before `sched`'s output is read?"""
        if not (self.executor.pipelined and self.config.async_scheduling and sched.scheduled) or sched.num_steps > 1:
            return False  # several decode passes: the next step starts after their last token
        if self.speculator is not None and self.speculator.active(self.scheduler):
            return False  # the next step proposes from this one's tokens (spec_decode/proposer.py)
        reqs = [self.requests.get(sr.request_id) for sr in sched.scheduled]
        for sr, req in zip(sched.scheduled, reqs):
            if sr.num_draft_tokens or req is None or req.beam_group_id is not None:
                return False  # its verified drafts / its group's chosen beams decide what runs next
        # the next step may run several decode passes once every token is known (core/pieces.py)
        return not (self.config.scheduler.num_scheduler_steps > 1 and all(multistep_request(r) for r in reqs))  # type: ignore[arg-type]

    def _finish(self, sched: SchedulerOutput, mark: int) -> list[RequestOutput]:
        """Read `sched`'s output from the runner (it was submitted) and turn it into outputs; `mark`:
        Scheduler.num_finished right after it was scheduled (its requests were all live then)."""
        changed: list[Request] = [self.requests[rid] for rid in sched.finished_ids if rid in self.requests]
        if not sched.has_work:
            return self.seqs.outputs(changed)
        result = self.executor.collect()
        self.last_step_tokens += sched.num_batched_tokens
        # async scheduling: a request may have finished (and its id been reused) since this step was
        # sent; what the step made for it is dropped (its extra row's logits included)
        gone = set()
        if self.scheduler.num_finished != mark:  # only a request finished since may be gone (_live, inlined)
            reqs = self.requests
            gone = {
                sr.request_id for sr in sched.scheduled
                if (r := reqs.get(sr.request_id)) is None or r.serial != sr.serial or r.status == RequestStatus.FINISHED
            }  # fmt: skip
        if gone:
            result.drop(gone)
        for rid, err in result.failed.items():
            if rid in self.requests and not self.requests[rid].is_finished:
                logger.error("request %s failed in the model step: %s", rid, err)
                changed.extend(self.seqs.fail(self.requests[rid], f"engine error: {err}"))
        touched = self.scheduler.update_from_output(sched, result)
        if self.speculator is not None and self.speculator.config.method in RUNNER_METHODS:
            self.speculator.absorb([self.requests[sr.request_id] for sr in sched.scheduled if self._live(sr.request_id, sr.serial)], result.draft_token_ids)
        return self.seqs.step_outputs(changed, touched, result)

    def fail_step(self, error: str) -> list[RequestOutput]:
        """The step raised: end the requests it scheduled (all live ones if it failed while
        scheduling, when the scheduler's state can't be trusted); the rest go on."""
        steps, self._tracked = self._tracked, None
        self._inflight = None
        self.executor.drain()
        if steps is None:
            return self.finish_all(error)
        self.scheduler.free_again([rid for s in steps for rid in s.freed_ids])  # the runner may not have seen them
        # timed out, aborted: finished before they ran
        changed = [self.requests[rid] for s in steps for rid in s.finished_ids if rid in self.requests]
        for rid in [sr.request_id for s in steps for sr in s.scheduled]:
            req = self.requests.get(rid)
            if req is not None and not req.is_finished:
                changed.extend(self.seqs.fail(req, error))
        try:
            return self.seqs.outputs(changed)
        except Exception:  # the output state is what broke: everything goes
            logger.exception("outputs of a failed step")
            return self.finish_all(error)

    def _release_runner_state(self) -> None:
        """Nothing live: hand the runner the ids finished in the last step now, not at the next one."""
        idle = self.scheduler.schedule()
        if idle.has_work:
            self.executor.execute(idle)

    def finish_all(self, error: str) -> list[RequestOutput]:
        """Fail every live request (used when a step raised): blocks freed, outputs carry the error."""
        self._inflight = None
        self.executor.drain()
        live = list(self.requests.values())
        for req in live:
            if not req.is_finished:
                self.scheduler.finish(req, FinishReason.ABORT)
        outputs = self.seqs.outputs(live, error)
        self.seqs.clear()
        try:
            self._release_runner_state()
        except Exception:  # the runner is what failed: its state goes with the next request's
            logger.exception("runner state not released after a failed step")
        return outputs
