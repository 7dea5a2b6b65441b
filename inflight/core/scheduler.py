"""Scheduler: one token-budget loop per step over running and waiting requests.

Step order:
  1. finish requests that were aborted or are past their deadline (blocks freed now);
  2. running requests, best first (priority 1..5, then arrival), each gets its next
     piece (1 token when decoding, a chunk when prefilling) within the step budget;
  3. waiting requests, best first, are admitted while the budget, `max_num_seqs`
     (and the batch-size caps) and the block pool allow (core/admission.py);
  4. after the step, `update_from_output` takes its tokens into the requests (core/update.py).
When the pool runs dry, the running request with the worst (priority, arrival)
is preempted: its blocks are freed and it is recomputed later. A waiting request
only preempts running requests strictly worse than itself, so nothing ping-pongs,
and a lone request always fits (the pool holds at least one max-length request).
"""

from __future__ import annotations

import math
import time

from inflight.config import SchedulerConfig
from inflight.core.admission import admit_waiting
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.lora_slots import LoRASlots
from inflight.core.pieces import drafts_fitting, encoder_fit, make_piece, multistep_passes
from inflight.core.update import update_requests
from inflight.outputs import ModelRunnerOutput, NewRequestData, SchedulerOutput
from inflight.request import FinishReason, Request, RequestStatus, order_key

_RUNNING = RequestStatus.RUNNING


class Scheduler:
    """The step's scheduling (module docstring). Admission (core/admission.py) and the update from
    a step's output (core/update.py) are module functions over this object: besides its request
    sets they use the step's state below (`budget`, `seat_victims`, `ahead`, set by `schedule`)
    and the methods of the section "steps shared with core/admission.py and core/update.py"."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._aborts: dict[str, FinishReason] = {}
        self.held: dict[str, list[Request]] = {}  # parent id -> siblings waiting to fork from it
        self.num_preemptions = 0
        self._freed: list[str] = []  # finished since the last SchedulerOutput (the runner drops them)
        # (src, dst) KV blocks the next step copies first: a beam fork's partial block (engine/beam.py)
        self.blocks_to_copy: list[tuple[int, int]] = []
        # LoRA adapters in the runner's device slots; running requests use at most max_loras distinct ones
        self.lora_slots = LoRASlots(config.max_loras)
        # no request's deadline comes before this (a finished one's may: then the next step looks
        # at every request and sets it again); saves a pass over every request a step
        self._next_deadline = math.inf
        self.num_lora = 0  # live requests with a LoRA adapter: none, and the adapter bookkeeping is skipped
        self.num_finished = 0  # requests finished so far (the step loop: none since a step, none of its gone)
        # the step's state, set anew by each `schedule`:
        self.budget = 0  # tokens the step may still schedule
        self.seat_victims: list[Request] = []  # preempted to give a waiting request a running seat
        self.ahead: dict[str, int] = {}  # request id -> KV slots past its piece for the draft model
        self._scheduled: dict[str, int] = {}  # request id -> tokens of its piece
        self._encoder_budget = 0  # image tokens the step may still encode

    # ------------------------------------------------------------ public
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already running")
        self.requests[request.request_id] = request
        self._next_deadline = min(self._next_deadline, request.deadline)
        self.num_lora += request.lora is not None
        if request.held and request.parent_id in self.requests:
            self.held.setdefault(request.parent_id, []).append(request)
        else:
            request.held = False
            self.waiting.append(request)

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        """Mark for abort; it is finished and its blocks freed at the start of the next step."""
        if request_id in self.requests:
            self._aborts[request_id] = reason

    def free_again(self, request_ids: list[str]) -> None:
        """Send these finished ids to the runner again (the output that carried them failed)."""
        self._freed.extend(rid for rid in request_ids if rid not in self.requests)

    def fork_beam(self, origin: Request, beam: Request) -> None:
        """`beam` continues `origin` (engine/beam.py): it shares origin's full blocks, and its copy
        of the partial last block is made at the start of the next step, before any forward can
        write a freed source block (recomputed instead when the pool has no free block)."""
        pair = self.kv.fork_beam(origin, beam)
        if pair is not None:
            self.blocks_to_copy.append(pair)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def pending_aborts(self) -> list[str]:
        """The ids `abort` marked that the next step has yet to finish (none once no request is
        live: `finish` drops each request's mark, the soak's flat memory)."""
        return list(self._aborts)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def finish(self, request: Request, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        request.finish(reason, stop_reason)
        self.num_finished += 1
        request.metrics.finished_time = time.perf_counter()
        request.metrics.num_computed_tokens = request.num_computed_tokens
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        elif request.held:
            self.held[request.parent_id].remove(request)  # type: ignore[index]
        self.release_children(request, share=False)  # a finished parent can't be forked from
        self.kv.forget(request)
        if self.requests.pop(request.request_id, None) is not None and request.lora is not None:
            self.num_lora -= 1
        self._aborts.pop(request.request_id, None)
        if request.num_sent_tokens:
            self._freed.append(request.request_id)

    def schedule(self, now: float | None = None) -> SchedulerOutput:
        now = time.perf_counter() if now is None else now
        finished_ids = self._finish_expired(now)
        self.budget = self.config.max_num_batched_tokens
        self._encoder_budget = self.config.max_num_batched_tokens
        self._scheduled = {}
        self.seat_victims = []
        self.ahead = {}
        preempted: list[str] = []

        self._schedule_running(now, preempted)

        # A step that had to preempt is out of blocks: admitting now would only re-admit the
        # victim (throwing away its computed KV) or thrash; new work waits for the next step.
        if not preempted:
            admit_waiting(self, now, preempted)

        num_steps = multistep_passes(self._scheduled, self.requests, self.config.num_scheduler_steps, self.kv)
        new: list[NewRequestData] = []
        slot_of, lora_loads = self._assign_lora_slots()
        reqs, la = self.requests, self.ahead  # (no lookup a request when none has lookahead)
        scheduled = [make_piece(reqs[rid], n, new, slot_of, la.get(rid, 0) if la else 0) for rid, n in self._scheduled.items()]
        freed, self._freed = self._freed, []
        copies, self.blocks_to_copy = self.blocks_to_copy, []
        return SchedulerOutput(
            scheduled=scheduled,
            num_batched_tokens=sum(self._scheduled.values()),
            preempted_ids=preempted,
            finished_ids=finished_ids,
            new_requests=new,
            freed_ids=freed,
            blocks_to_copy=copies,
            lora_loads=lora_loads,
            num_steps=num_steps,
        )

    def update_from_output(self, out: SchedulerOutput, runner: ModelRunnerOutput) -> list[Request]:
        """Advance computed counts, append sampled tokens, run the token-level stop checks
        (core/update.py). Returns the requests that got a token this step (some now finished)."""
        return update_requests(self, out, runner)

    # ------------------------------------------------ steps shared with core/admission.py and core/update.py
    def running_adapters(self) -> set[int]:
        """The LoRA adapters (uids) the running requests use."""
        return {r.lora.uid for r in self.running if r.lora is not None}

    def fit_encoder(self, req: Request, start: int, n: int) -> int:
        """core/pieces.py `encoder_fit` against this step's encoder budget."""
        n, self._encoder_budget = encoder_fit(req, start, n, self._encoder_budget, self.config)
        return n

    def reserve_lookahead(self, req: Request, n: int, hits: list[int] = ()) -> None:  # type: ignore[assignment]
        """Slots for the drafts the draft model proposes after this piece, when the piece reaches
        the end of the known tokens and they fit without preempting anyone (else no proposal)."""
        self.ahead.pop(req.request_id, None)
        la = req.num_lookahead
        computed = len(hits) * self.kv.block_size if hits else req.num_computed_tokens  # prefix-cache hits count
        if la and computed + n >= req.num_tokens and self.kv.can_allocate(req, n + la, hits):
            self.ahead[req.request_id] = la

    def schedule_piece(self, req: Request, n: int, now: float) -> None:
        """`n` tokens of `req` in this step, out of its budget."""
        self._scheduled[req.request_id] = n
        self.budget -= n
        m = req.metrics
        if m.first_scheduled_time is None:
            m.first_scheduled_time = now
        m.schedule_times.append(now)

    def worst_running(self) -> Request:
        """The running request last in scheduling order: the first to preempt."""
        return max(self.running, key=order_key)

    def preempt(self, req: Request) -> None:
        """Free a running request's blocks; it goes back to waiting and is recomputed."""
        n = self._scheduled.pop(req.request_id, 0)
        self.budget += n
        self.running.remove(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_sent_blocks = 0  # its next piece sends the whole new table
        req.status = RequestStatus.PREEMPTED
        req.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(req)

    def release_children(self, parent: Request, share: bool) -> None:
        """Move the siblings held on `parent` to waiting, forked from its prompt blocks if `share`."""
        for child in self.held.pop(parent.request_id, []):
            child.held = False
            if share:
                self.kv.fork(parent, child)
            self.waiting.append(child)

    # ------------------------------------------------------------ internals
    def _schedule_running(self, now: float, preempted: list[str]) -> None:
        """Running requests, best first, each its next piece within the budget; the worst preempted
        when the pool runs dry. (Every running request every step: 256 at 256; offline_host_cost.py)"""
        bs, scheduled = self.kv.block_size, self._scheduled
        for req in sorted(self.running, key=order_key):
            if req.status != _RUNNING or self.budget == 0:
                continue
            pending, computed = req.num_pending, req.num_computed_tokens
            if pending and req.num_output_tokens + pending >= req.max_tokens:
                continue  # its last token is being sampled in the step in flight
            n = min(len(req.all_token_ids) + pending - computed, self.budget)
            # (the checks below are skipped where they could change nothing)
            n = self.fit_encoder(req, computed, n) if req.inputs.mm_items else n
            if n == 0:
                continue  # a beam awaiting its group's choice of next token; an image for a later step
            k = drafts_fitting(req, n, self.budget) if req.draft_token_ids else 0
            n += k if k and self.kv.can_allocate(req, n + k) else 0  # drafts never preempt anyone
            if req.num_lookahead or self.ahead:
                self.reserve_lookahead(req, n)
            # its blocks hold the piece (most decodes: a block lasts block_size steps): nothing to allocate
            fits = not self.ahead and computed + n <= len(req.block_ids) * bs
            while not (fits or self.kv.allocate(req, n + self.ahead.get(req.request_id, 0))):
                victim = self.worst_running()
                preempted.append(victim.request_id)
                self.preempt(victim)
                if victim is req:
                    break
            else:  # (schedule_piece, inlined)
                scheduled[req.request_id] = n
                self.budget -= n
                m = req.metrics
                if m.first_scheduled_time is None:
                    m.first_scheduled_time = now
                m.schedule_times.append(now)

    def _assign_lora_slots(self) -> tuple[dict[int, int], list[tuple[int, object]]]:
        """Device slots for the adapters of this step's pieces (core/lora_slots.py)."""
        if not self.num_lora:
            return {}, []
        needed = {}
        for rid in self._scheduled:
            lora = self.requests[rid].lora
            if lora is not None:
                needed[lora.uid] = lora.adapter
        if not needed:
            return {}, []
        return self.lora_slots.assign(needed, self.running_adapters())

    def _finish_expired(self, now: float) -> list[str]:
        if not self._aborts and now < self._next_deadline:
            return []
        done = []
        self._next_deadline = math.inf
        for req in list(self.requests.values()):
            reason = self._aborts.get(req.request_id)
            if reason is None and now >= req.deadline:
                reason = FinishReason.TIMEOUT
            if reason is not None:
                self.finish(req, reason)
                done.append(req.request_id)
            else:
                self._next_deadline = min(self._next_deadline, req.deadline)
        return done
