"""Sentence embeddings (``POST /v1/embeddings``): our BERT encoder + sentence-transformers pooling."""

from inflight.embeddings.bert import BertConfig, BertModel
from inflight.embeddings.model import EmbeddingModel, EmbeddingResult, default_model_path

__all__ = ["BertConfig", "BertModel", "EmbeddingModel", "EmbeddingResult", "default_model_path"]
