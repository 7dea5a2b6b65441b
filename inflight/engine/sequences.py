"""The sequences of user requests: one each, or n / best_of siblings (engine/groups.py), or a
beam search (engine/beam.py). How they start, fail and end, and how a step's output becomes one
output per user request. The step loop (engine/step_loop.py) runs sequences; this knows whose they are."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from inflight.core.scheduler import Scheduler
from inflight.engine.beam import BeamGroup
from inflight.engine.groups import SequenceGroup, fan_out
from inflight.engine.output_processor import OutputProcessor
from inflight.outputs import ModelRunnerOutput, RequestOutput
from inflight.request import FinishReason, Request

logger = logging.getLogger(__name__)


class Sequences:
    """Every scheduled sequence by id, and each user request's group (siblings or beams)."""

    def __init__(self, scheduler: Scheduler, output_processor: OutputProcessor, tokenizer: Any | None,
                 requests: dict[str, Request], on_forget: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        self.scheduler = scheduler
        self.output_processor = output_processor
        self.tokenizer = tokenizer
        self.on_forget = on_forget  # a user request is gone (the engine trims its LoRA host cache)
        self.requests = requests  # every scheduled sequence (n > 1: one per sibling); the engine's
        # user request id -> the sequences it fans out into (n / best_of siblings, or a beam search)
        self.parents: dict[str, SequenceGroup | BeamGroup] = {}
        self.parent_of: dict[str, SequenceGroup | BeamGroup] = {}  # sequence id -> its parent

    def add(self, request: Request) -> None:
        """Queue a checked request as its sequence(s)."""
        rid = request.request_id
        if request.params.is_beam_search:
            beams = BeamGroup(request, self.tokenizer)
            self.parents[rid] = beams
            self.start_beams(beams, [beams.new_beam([], 0.0)])
            return
        if request.params.num_sequences == 1:
            self.add_one(request)
            return
        group = SequenceGroup(request, fan_out(request))
        self.parents[rid] = group
        for child in group.children:
            self.parent_of[child.request_id] = group
            self.add_one(child)

    def abort(self, request_id: str, reason: FinishReason) -> None:
        parent = self.parents.get(request_id)
        members = [] if parent is None else parent.children if isinstance(parent, SequenceGroup) else parent.running
        for rid in [m.request_id for m in members] or [request_id]:
            self.scheduler.abort(rid, reason)

    def clear(self) -> None:
        self.requests.clear()
        self.parents.clear()
        self.parent_of.clear()
        self.output_processor.states.clear()

    def start_beams(self, group: BeamGroup, beams: list[Request]) -> None:
        group.running = beams
        for b in beams:
            self.parent_of[b.request_id] = group
            self.add_one(b)

    def drop_beam(self, beam: Request) -> None:
        group = self.parent_of.get(beam.request_id)
        st = self.output_processor.states.get(beam.request_id)
        if isinstance(group, BeamGroup) and st is not None and st.context_logits and group.context_logits is None:
            group.context_logits = torch.cat(st.context_logits)  # the first beam ran the prompt
        if not beam.is_finished:
            self.scheduler.finish(beam, FinishReason.ABORT)
        if isinstance(group, BeamGroup):  # the search's work includes every beam it retired
            group.metrics.num_tokens_run += beam.metrics.num_tokens_run
        self.requests.pop(beam.request_id, None)
        self.parent_of.pop(beam.request_id, None)
        self.output_processor.drop(beam.request_id)

    def advance_beams(self, logprobs: dict[str, torch.Tensor], logits: dict[str, list[torch.Tensor]]) -> list[RequestOutput]:
        """Feed this step's beam distributions (and raw logits, when asked) to their groups; run the
        rounds that are complete."""
        if not logprobs:
            return []
        touched: dict[str, BeamGroup] = {}
        for rid, lp in logprobs.items():
            group = self.parent_of.get(rid)
            if isinstance(group, BeamGroup):
                group.reported[rid] = lp
                if logits.get(rid):
                    group.reported_logits[rid] = logits[rid][-1]
                touched[group.request_id] = group
        outputs = []
        for group in touched.values():
            if not group.ready():
                continue
            try:
                chosen, old = group.step(), group.running
            except Exception as e:  # this search's own numbers: it ends alone
                logger.exception("beam search %s failed", group.request_id)
                self.fail(group.running[0], f"engine error: {type(e).__name__}: {e}")
                outputs.append(self.end_beams(group, group.running[0]))
                continue
            if group.done:
                for b in old:
                    self.drop_beam(b)
                outputs.append(group.output(self.tokenizer))
                self.parents.pop(group.request_id, None)
                continue
            new = [group.new_beam(origin.output_token_ids + [tok], score, entries) for origin, tok, score, entries in chosen]
            for (origin, *_), beam in zip(chosen, new):
                self.scheduler.fork_beam(origin, beam)
            for b in old:
                self.drop_beam(b)
            self.start_beams(group, new)
        return outputs

    def step_outputs(self, changed: list[Request], touched: list[Request], result: ModelRunnerOutput) -> list[RequestOutput]:
        """A step's outputs: the runner's logits outputs stored, each touched sequence's new tokens
        through the output processor (a stop string finishes it; its own failure ends its request
        alone), one output per changed user request, then the beam rounds the step completed."""
        self.output_processor.absorb(result)
        states, parent_of = self.output_processor.states, self.parent_of
        for req in touched:
            st = states.get(req.request_id)
            if st is not None and st.quiet and not req.is_finished and req.request_id not in parent_of:
                continue  # what `on_token` and `outputs` would make of it: nothing (256 a step offline)
            try:
                new = result.sampled[req.request_id][: req.num_new_tokens]  # > 1: accepted drafts
                for i, st in enumerate(new):
                    stop = self.output_processor.on_token(req, st, last=i == len(new) - 1)
                    if stop is not None and not req.is_finished:
                        self.scheduler.finish(req, FinishReason.STOP, stop)
                        if i + 1 < len(new):  # the tokens after it are not the output's (as one at a time)
                            req.drop_last([t.logprob for t in new[i + 1 :]])
                        break
            except Exception as e:  # its own output processing: fail it alone
                logger.exception("request %s: output processing failed", req.request_id)
                changed.extend(self.fail(req, f"engine error: {type(e).__name__}: {e}"))
                continue
            changed.append(req)
        return self.outputs(changed) + self.advance_beams(result.beam_logprobs, result.generation_logits)

    def fail(self, req: Request, error: str) -> list[Request]:
        """End the user request `req` belongs to, every sequence of it, with `error`."""
        group = self.parent_of.get(req.request_id)
        members = [req] if group is None else list(group.running if isinstance(group, BeamGroup) else group.children)
        for m in members:
            m.error = m.error or error
            if not m.is_finished:
                self.scheduler.finish(m, FinishReason.ABORT)
        return members

    def outputs(self, changed: list[Request], error: str | None = None) -> list[RequestOutput]:
        """One output per changed user request (sibling sequences merge into their group's)."""
        outputs: list[RequestOutput] = []
        groups_done: set[str] = set()
        for req in changed:
            group = self.parent_of.get(req.request_id)
            if req.beam_group_id is not None:  # a beam ended from outside (abort, timeout): the search ends
                if isinstance(group, BeamGroup) and group.request_id not in groups_done:
                    groups_done.add(group.request_id)
                    outputs.append(self.end_beams(group, req))
                continue  # its siblings were retired with the search: no output of their own
            if group is None:  # (most: one sequence, no group's bookkeeping)
                if req.inputs.final_only and not req.is_finished:
                    continue
                out = self.output_processor.make_output(req)
                out.error, out.serial = error or req.error or None, req.serial
                outputs.append(out)
                continue
            if group.request_id in groups_done:
                continue
            groups_done.add(group.request_id)
            merged = group.make_output(self.output_processor)
            if merged is None:
                continue
            members = group.children if isinstance(group, SequenceGroup) else [req]
            merged.error = error or next((m.error for m in members if m.error), None)
            merged.serial = group.request.serial
            outputs.append(merged)
        for out in outputs:  # after the loop: later siblings must still find their group
            if out.finished:
                self.forget(out.request_id)
        return outputs

    def end_beams(self, group: BeamGroup, cause: Request) -> RequestOutput:
        reason = cause.finish_reason.value if cause.finish_reason else "abort"
        for b in group.running:  # first: their work joins the search's figures
            self.drop_beam(b)
        out = group.output(self.tokenizer, finish_reason=reason)
        out.error, out.serial = cause.error, group.request.serial
        self.parents.pop(group.request_id, None)
        return out

    def forget(self, request_id: str) -> None:
        group = self.parents.pop(request_id, None)
        for child in group.children if isinstance(group, SequenceGroup) else []:
            self.parent_of.pop(child.request_id, None)
            self.requests.pop(child.request_id, None)
            self.output_processor.drop(child.request_id)
        self.requests.pop(request_id, None)
        self.output_processor.drop(request_id)
        self.on_forget()

    def add_one(self, request: Request) -> None:
        self.output_processor.start(request)
        self.scheduler.add_request(request)
        self.requests[request.request_id] = request
