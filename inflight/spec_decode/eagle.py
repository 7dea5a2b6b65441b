"""EAGLE proposer (methods eagle, eagle3): a one-layer head over the target's hidden states, run
by the target's runner on the driver rank, on its own paged KV pool laid out like the target's
(same block tables; the pool is sized for both, like the draft model's: draft_model.py).

The head's entry at position p reads (h_p, x_{p+1}): the target's state at p and the token
after it, at rotary position p; its output predicts x_{p+2}. Each step, after sampling:
  1. catch-up: the head runs the step's flat batch with the ids shifted left by one (the last
     row of a piece gets the token after it: the next prompt token, or the token just sampled)
     and the target's states of the same rows (EAGLE-1: the final normed hidden state; EAGLE-3:
     the inputs of three layers, captured by the target's forward). Rows after a rejected draft
     read wrong inputs; their KV slots are rewritten when the target computes those positions.
  2. for pieces asking for proposals (`num_lookahead` K): the row of the last accepted position
     b - 1 gives d1; then K - 1 single-row steps feed the head its own output feature and the
     previous draft at b, b + 1, ... (KV written into the lookahead slots the scheduler holds).
Drafts are chosen by spec_decode/picker.py (argmax, or drawn from q for sampled requests).
Stale head KV (a prefix-cache block written for a request whose next token differed) only
lowers acceptance: verification never trusts a draft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from inflight.models.attention import select_backend
from inflight.models.step import StepBatch
from inflight.outputs import SampledToken, ScheduledRequest
from inflight.spec_decode.eagle_head import load_head
from inflight.spec_decode.picker import pick_drafts
from inflight.worker.kv_cache import allocate_kv_cache, bytes_per_block


class EagleProposer:
    def __init__(self, spec: Any, target: torch.nn.Module, block_size: int) -> None:
        self.cfg = spec.draft  # the head's ModelConfig (SpeculativeConfig.resolve)
        self.eagle3 = spec.method == "eagle3"
        self.aux_layers: tuple[int, ...] = spec.aux_layers  # EAGLE-3: the target layers it reads
        self.target = target
        self.device = self.cfg.device
        self.block_size = block_size
        self.head = load_head(self.cfg, int(target.spec.hidden), self.eagle3)  # type: ignore[union-attr]
        # tensor parallel: the target's embedding and lm_head hold this rank's vocabulary rows and
        # gather over the ranks, which the head (rank 0 alone) cannot join: whole copies of both
        self.tables = _whole_tables(spec.target_path, target, self.cfg) if target.tp.size > 1 else None  # type: ignore[union-attr]
        self.attention = select_backend(self.cfg, block_size, self.head.spec.sliding_window)
        self.kv_caches: list[torch.Tensor] = []

    def bytes_per_block(self) -> int:
        return bytes_per_block(self.cfg, self.block_size)

    def allocate(self, num_blocks: int) -> None:
        self.pool, self.kv_caches = allocate_kv_cache(self.cfg, num_blocks, self.block_size)

    def _run(self, ids: list[int], feature: torch.Tensor, step: StepBatch) -> tuple[torch.Tensor, torch.Tensor]:
        meta = self.attention.build_metadata(step)
        vocab = self.cfg.vocab_size  # p-tuning's virtual ids have no row: any token will do
        tokens = torch.tensor(ids, device=self.device).clamp(max=vocab - 1)
        embeds = self.target.embed(tokens) if self.tables is None else F.embedding(tokens, self.tables[0])  # type: ignore[operator]
        return self.head(embeds, feature, step.position_ids, self.kv_caches[0], meta)  # type: ignore[no-any-return]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.tables is None or self.eagle3:  # EAGLE-3 has its own lm_head
            return self.head.logits(hidden, self.target)
        return F.linear(hidden, self.tables[1]).float()

    def step(
        self, step: StepBatch, pieces: list[ScheduledRequest], reqs: list[Any], hidden: torch.Tensor,
        aux: list[torch.Tensor] | None, sampled: dict[str, list[SampledToken]], tables: dict[str, np.ndarray],
    ) -> dict[str, list[int]]:  # fmt: skip
        """Catch up on the step's flat batch (`pieces` in its order, `reqs` their RunnerRequests),
        then propose for the pieces with num_lookahead > 0: {request id: drafts}."""
        feature = torch.cat(aux, dim=-1) if self.eagle3 else hidden  # type: ignore[arg-type]  # (T, 3H) | (T, H)
        ids: list[int] = []
        todo: list[tuple[int, int, Any, int]] = []  # (flat row, position of it, request, lookahead)
        offset = 0
        for sr, req in zip(pieces, reqs):
            n, k = sr.num_tokens, sr.num_draft_tokens
            toks = step.token_ids[offset : offset + n]
            got = sampled.get(sr.request_id) if sr.samples else None
            if got:
                ids += toks[1 : n - k] + [t.token_id for t in got[: k + 1]]
                kept = next((i for i in range(k) if got[i].token_id != sr.draft_token_ids[i]), k)
                if sr.num_lookahead:  # the row of the last accepted position b - 1
                    todo.append((offset + n - 1 - k + kept, step.positions[offset + n - 1 - k + kept], req, sr.num_lookahead))
            else:  # a prompt chunk: the token after it is known
                end = sr.num_computed_tokens + n
                ids += toks[1:] + [req.all_token_ids[end] if end < len(req.all_token_ids) else 0]
            offset += n
        out_hidden, feat = self._run(ids, feature, step)
        if not todo:
            return {}
        rows = torch.tensor([t[0] for t in todo], device=self.device)
        todo_reqs = [t[2] for t in todo]
        for r in todo_reqs:
            r.draft_q = None  # this step's drafts replace any earlier ones
        tokens = pick_drafts(self._logits(out_hidden[rows]), todo_reqs)
        out = {r.request_id: [t] for r, t in zip(todo_reqs, tokens)}
        return self._extend(todo, tokens, feat[rows], tables, out)

    def _extend(
        self, todo: list[tuple[int, int, Any, int]], tokens: list[int], feat: torch.Tensor,
        tables: dict[str, np.ndarray], out: dict[str, list[int]],
    ) -> dict[str, list[int]]:  # fmt: skip
        """Drafts 2..K: single-row steps at positions b, b + 1, ... fed the head's own feature."""
        bs = self.block_size
        live = list(range(len(todo)))
        for j in range(1, max(t[3] for t in todo)):
            live = [i for i in live if j < todo[i][3]]
            if not live:
                break
            pos = [todo[i][1] + j for i in live]  # rotary index (token index + M-RoPE delta)
            idx = [todo[i][1] - todo[i][2].mrope_delta + j for i in live]  # token index: its slot
            rids = [todo[i][2].request_id for i in live]
            slots = [int(tables[rid][x // bs]) * bs + x % bs for rid, x in zip(rids, idx)]
            width = max(x // bs + 1 for x in idx)
            ids = [tokens[i] for i in live]
            step = StepBatch(
                token_ids=ids, positions=pos, query_lens=[1] * len(live), context_lens=[x + 1 for x in idx],
                slots=torch.tensor(slots, device=self.device), block_table=torch.from_numpy(np.stack([tables[r][:width] for r in rids])),
                device=self.device,
            )  # fmt: skip
            hidden, nxt = self._run(ids, feat[torch.tensor(live, device=self.device)], step)
            feat = feat.clone()
            feat[torch.tensor(live, device=self.device)] = nxt
            picked = pick_drafts(self._logits(hidden), [todo[i][2] for i in live])
            for i, t in zip(live, picked):
                tokens[i] = t
                out[todo[i][2].request_id].append(t)
        return out



def _whole_tables(path: str, target: torch.nn.Module, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding, lm_head) of the target's checkpoint, whole, in the head's dtype and device (the
    lm_head is the embedding when tied)."""
    from safetensors import safe_open

    from inflight.models.safetensors_io import checkpoint_files

    want = {"model.embed_tokens.weight", "lm_head.weight"}
    found: dict[str, torch.Tensor] = {}
    for f in checkpoint_files(Path(path)):
        with safe_open(str(f), framework="pt") as sf:
            for name in want & set(sf.keys()):
                found[name] = sf.get_tensor(name).to(device=cfg.device, dtype=cfg.dtype)
    embed = found["model.embed_tokens.weight"]
    return embed, embed if target.spec.tie_embeddings else found["lm_head.weight"]  # type: ignore[union-attr]
