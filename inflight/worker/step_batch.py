"""The runner's step object (worker/model_runner.py): a `StepBatch` (models/step.py) from
the step's inputs (worker/step_inputs.py) and the features its requests use."""

from __future__ import annotations

from typing import Any

import torch

from inflight.models.step import StepBatch
from inflight.outputs import ScheduledRequest
from inflight.worker.input_batch import RunnerRequest
from inflight.worker.vision import mrope_positions, needs_mrope

ModelRunner = Any  # worker/model_runner.py's, which imports this module: its batch, device, model, vision


def step_batch(
    runner: ModelRunner, pieces: list[ScheduledRequest], reqs: list[RunnerRequest], ids: list[int], positions: list[int],
    plain: bool = False,
) -> StepBatch:  # fmt: skip
    """The step object (models/step.py), once per step: the persistent batch's tables, then what
    each feature adds (input embeddings of p-tuning tables and images, M-RoPE, LoRA slots);
    `plain`: one-token decodes of plain requests (worker/step_inputs.py), which add none but LoRA."""
    table, slots = runner.batch.step_tables(pieces, reqs, positions if plain else None)
    step = StepBatch(
        token_ids=ids, positions=positions, query_lens=[1] * len(pieces) if plain else [sr.num_tokens for sr in pieces],
        context_lens=[p + 1 for p in positions] if plain else [sr.num_computed_tokens + sr.num_tokens for sr in pieces],
        slots=slots if runner.device.type == "cpu" else slots.to(runner.device, non_blocking=True), block_table=table,
        device=runner.device,
    )  # fmt: skip
    if plain:
        if any(sr.lora_slot >= 0 for sr in pieces):
            step.lora_slots = [sr.lora_slot for sr in pieces]
            step.plain = False
        return step
    if any(r.prompt_embedding_table is not None for r in reqs):
        step.inputs_embeds = virtual_embeddings(runner, pieces, reqs, step.input_ids)
        step.input_ids = step.input_ids.clamp(max=runner.config.model.vocab_size - 1)
    overlaps = runner.vision.reached(pieces, reqs) if runner.vision is not None else []
    if overlaps:
        embeds = runner.model.embed(step.input_ids) if step.inputs_embeds is None else step.inputs_embeds  # type: ignore[operator]
        runner.vision.scatter(embeds, overlaps)  # type: ignore[union-attr]
        step.inputs_embeds = embeds
    mrope = runner.vision is not None and needs_mrope(pieces, reqs)
    if mrope:
        step.position_ids = torch.from_numpy(mrope_positions(pieces, reqs)).to(runner.device)
    if any(sr.lora_slot >= 0 for sr in pieces):
        step.lora_slots = [sr.lora_slot for sr in pieces for _ in range(sr.num_tokens)]
    # after an image the rotary index is position + delta: the fast paths take position + 1 as the context
    step.plain = step.inputs_embeds is None and step.lora_slots is None and not mrope and not any(
        r.mrope_delta for r in reqs
    )  # fmt: skip
    return step


def virtual_embeddings(runner: ModelRunner, pieces: list[ScheduledRequest], reqs: list[RunnerRequest], input_ids: torch.Tensor) -> torch.Tensor:
    """p-tuning: token embeddings where ids >= vocab size come from the request's table."""
    vocab = runner.config.model.vocab_size
    embeds = runner.model.embed(input_ids.clamp(max=vocab - 1))  # type: ignore[operator]
    offset = 0
    for sr, req in zip(pieces, reqs):
        table = req.prompt_embedding_table
        if table is not None:
            piece = input_ids[offset : offset + sr.num_tokens]
            virtual = (piece >= vocab).nonzero()[:, 0]
            embeds[offset + virtual] = table[piece[virtual] - vocab]
        offset += sr.num_tokens
    return embeds
