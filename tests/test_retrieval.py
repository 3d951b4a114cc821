"""Retrievers: BM25 against the formula computed by hand, dense similarity against its defining
properties, the data's own scores, and clear errors."""
import math

import numpy as np
import pytest

from litm.errors import ConfigError, DataError
from litm.retrieval import bm25_scores, data_scores, dense_encoder, dense_scores, scores
from litm.types import Document, Example


def doc(i, text, score=None, title=""):
    return Document(id=f"d{i}", title=title, text=text, score=score)


def bm25_by_hand(query_terms, docs_terms, k1=1.5, b=0.75):
    n = len(docs_terms)
    avgdl = sum(len(d) for d in docs_terms) / n
    out = []
    for d in docs_terms:
        s = 0.0
        for q in query_terms:
            df = sum(q in x for x in docs_terms)
            tf = d.count(q)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            s += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
        out.append(s)
    return out


def test_bm25_matches_the_lucene_formula():
    texts = ["zebra zebra lion", "lion tiger", "tiger tiger tiger bear", "giraffe"]
    got = bm25_scores("Where is the zebra near the tiger?", [doc(i, t) for i, t in enumerate(texts)])
    # stopwords ("where", "is", "the", "near") are dropped; both query terms occur in the pool
    expected = bm25_by_hand(["zebra", "tiger"], [t.split() for t in texts])
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert got.argmax() == 0 and got[3] == 0


def test_bm25_with_no_shared_term_scores_zero():
    assert bm25_scores("quantum chromodynamics", [doc(0, "apple pie"), doc(1, "pear tart")]).tolist() == [0, 0]


@pytest.mark.model
def test_dense_scores_are_cosines_that_find_the_matching_passage():
    enc = dense_encoder()
    docs = [doc(0, "Bananas are a yellow fruit grown in the tropics."),
            doc(1, "Paris is the capital and largest city of France."),
            doc(2, "The violin has four strings tuned in fifths.")]
    s = dense_scores("What is the capital of France?", docs, enc)
    assert s.argmax() == 1 and s[1] > 0.5 > s[0]
    # padding must not change an embedding: alone and batched beside a much longer text
    short, long_ = "capital of France", "word " * 200
    alone = enc.encode([short])[0]
    batched = enc.encode([short, long_])[0]
    np.testing.assert_allclose(alone, batched, atol=1e-5)
    assert np.linalg.norm(alone) == pytest.approx(1.0, abs=1e-5)
    assert enc.encode(["the same text"])[0] @ enc.encode(["the same text"])[0] == pytest.approx(1.0, abs=1e-5)


def test_data_scores_and_errors():
    assert data_scores([doc(0, "a", 1.5), doc(1, "b", -2.0)]).tolist() == [1.5, -2.0]
    with pytest.raises(DataError, match="no retriever score"):
        data_scores([doc(0, "a", 1.5), doc(1, "b")])
    with pytest.raises(DataError, match="no text"):
        bm25_scores("q", [doc(0, "  ")])
    with pytest.raises(ConfigError, match="empty"):
        bm25_scores("q", [])
    ex = Example("e", "q", ("a",), (doc(0, "a"),), "qa")
    with pytest.raises(ConfigError, match="unknown retriever 'tfidf'"):
        scores(ex, "tfidf")
