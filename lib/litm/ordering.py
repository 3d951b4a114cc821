"""Where each document goes: choose the documents, move the gold to a position, order a ranked list
with a named strategy (rank, reverse, U-shape, LangChain's reorder, random, evidence first), or let the
model's own attention order them (attention sorting)."""
from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Callable, Sequence

from .errors import ConfigError
from .types import Document, Example


def with_num_documents(example: Example, num_docs: int) -> Example:
    """Keep the gold and the first `num_docs - 1` distractors, all in their original order."""
    n = len(example.documents)
    if num_docs < 1:
        raise ConfigError(f"num_docs must be at least 1, got {num_docs}.")
    if num_docs > n:
        raise ConfigError(f"example {example.id} has {n} documents; cannot use {num_docs}. "
                          "Pick a smaller number of documents or a file with more.")
    if num_docs == n:
        return example
    gold = example.gold
    keep = {id(gold)} | {id(d) for d in [d for d in example.documents if d is not gold][: num_docs - 1]}
    return replace(example, documents=tuple(d for d in example.documents if id(d) in keep))


def gold_at(example: Example, position: int) -> Example:
    """Move the gold document to `position` (0-based); distractors keep their original order."""
    n = len(example.documents)
    if not 0 <= position < n:
        raise ConfigError(f"gold position {position} is out of range for {n} documents (0..{n - 1}).")
    gold = example.gold
    distractors = [d for d in example.documents if d is not gold]
    distractors.insert(position, gold)
    return replace(example, documents=tuple(distractors))


# ----------------------------------------------------------------------------- strategies over a ranked list
# Each takes documents ranked by relevance (index 0 = most relevant) and returns them in prompt order.
def rank(ranked: Sequence) -> list:
    """Most relevant first (the retriever's order)."""
    return list(ranked)


def reverse(ranked: Sequence) -> list:
    """Most relevant last, next to the question."""
    return list(ranked)[::-1]


def u_shape(ranked: Sequence) -> list:
    """Sandwich: rank 1 first, rank 2 last, rank 3 second, rank 4 second to last, ... so the least
    relevant end up in the middle (six documents: 1, 3, 5, 6, 4, 2)."""
    ranked = list(ranked)
    return ranked[0::2] + ranked[1::2][::-1]


def langchain(ranked: Sequence) -> list:
    """LangChain's (and LlamaIndex's) LongContextReorder as it behaves: it walks the ranked list from
    the least relevant, alternately prepending and appending, so the outcome depends on parity.  With an
    odd count it equals `u_shape` (rank 1 first: 1, 3, 5, 4, 2); with an even count it is its mirror
    image, rank 1 *last* and rank 2 first (2, 4, 6, 5, 3, 1)."""
    backwards = list(ranked)[::-1]
    return backwards[0::2][::-1] + backwards[1::2]


def random_order(ranked: Sequence, seed: int = 0) -> list:
    """A seeded shuffle (the same seed gives the same order)."""
    return random.Random(seed).sample(list(ranked), len(ranked))


def evidence_first(ranked: Sequence, evidence: Sequence[float], m: int = 1) -> list:
    """Evidence-aware: the `m` documents with the highest `evidence` score (a second signal, e.g.
    calibrated attention; aligned with `ranked`) first, most evident first; the rest keep rank order."""
    ranked = list(ranked)
    _check_scores(ranked, evidence, "evidence")
    if not 0 <= m <= len(ranked):
        raise ConfigError(f"m must lie in 0..{len(ranked)}, got {m}.")
    top = sorted(range(len(ranked)), key=lambda i: (-evidence[i], i))[:m]
    return [ranked[i] for i in top] + [d for i, d in enumerate(ranked) if i not in top]


ORDERINGS = {"rank": rank, "reverse": reverse, "u_shape": u_shape, "langchain": langchain,
             "random": random_order, "evidence_first": evidence_first}


def _check_scores(docs: Sequence, scores, what: str = "scores") -> None:
    if scores is None:
        raise ConfigError(f"{what} are missing: give one number per document.")
    if len(scores) != len(docs):
        raise ConfigError(f"got {len(scores)} {what} for {len(docs)} documents; give one per document.")
    if any(s is None or s != s for s in scores):
        raise ConfigError(f"{what} contain a missing value (None or NaN); score every document.")


def ranked_top_k(documents: Sequence[Document], scores: Sequence[float], k: int | None = None) -> list[Document]:
    """The `k` highest-scoring documents, most relevant first (ties keep the input order)."""
    docs = list(documents)
    if not docs:
        raise ConfigError("the pool of documents is empty; retrieve at least one document.")
    _check_scores(docs, scores)
    ids = [d.id for d in docs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"duplicate document ids {dupes[:5]}: every document in a pool needs its own id.")
    k = len(docs) if k is None else k
    if not 1 <= k <= len(docs):
        raise ConfigError(f"k={k} but the pool holds {len(docs)} documents; choose k in 1..{len(docs)}.")
    order = sorted(range(len(docs)), key=lambda i: (-float(scores[i]), i))[:k]
    return [docs[i] for i in order]


def arrange(ranked: Sequence, strategy: str, seed: int = 0, evidence: Sequence[float] | None = None,
            m: int = 1) -> list:
    """Put a ranked list in prompt order with a named strategy (see `ORDERINGS`)."""
    if strategy not in ORDERINGS:
        raise ConfigError(f"unknown ordering strategy {strategy!r}: use one of {', '.join(ORDERINGS)}.")
    if strategy == "random":
        return random_order(ranked, seed)
    if strategy == "evidence_first":
        return evidence_first(ranked, evidence, m)
    return ORDERINGS[strategy](ranked)


def reorder(example: Example, scores: Sequence[float], strategy: str, k: int | None = None, seed: int = 0,
            evidence: Sequence[float] | None = None, m: int = 1) -> Example:
    """The example with its top-`k` documents by `scores` (aligned with `example.documents`) in the
    order `strategy` gives; `evidence`, for evidence_first, is aligned with the documents too."""
    ranked = ranked_top_k(example.documents, scores, k)
    if evidence is not None:
        _check_scores(example.documents, evidence, "evidence")
        by_id = {d.id: e for d, e in zip(example.documents, evidence)}
        evidence = [by_id[d.id] for d in ranked]
    return replace(example, documents=tuple(arrange(ranked, strategy, seed, evidence, m)))


# ----------------------------------------------------------------------------- attention sorting
# Not in ORDERINGS: `arrange` orders a ranked list without a model, while attention sorting needs the example
# and a scorer, and returns the orders it went through.  A study calls it directly.
def check_rounds(rounds, name: str = "rounds") -> None:
    """A ConfigError unless attention sorting's `rounds` is a whole number of at least 1."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"{name} must be a whole number of at least 1 (one scoring pass per round), got {rounds!r}.")


def attention_sort(example: Example, attend: Callable[[Example], Sequence[float]], rounds: int = 1,
                   bias: Sequence[float] | None = None) -> tuple[Example, list[tuple[str, ...]]]:
    """Attention sorting (Peysakhovich and Lerer 2023): score the prompt, move the most attended document last
    (next to the question) and the least attended first, and repeat `rounds` times.  `attend(example)` gives
    each document's attention mass in the example's order (`attention_study.document_masses`, or a stand-in);
    with `bias` (nats per position, e.g. `slot_bias` averaged over layers and heads) documents are sorted by
    log mass minus the bias at their position.  The sort is ascending and stable (ties keep their order).
    Returns the sorted example and the document ids' order before each round and after the last."""
    check_rounds(rounds)
    docs = list(example.documents)
    if not docs:
        raise ConfigError(f"example {example.id} has no documents to sort; give it at least one.")
    ids = [d.id for d in docs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"duplicate document ids {dupes[:5]}: attention sorting records orders by id, so every "
                          "document needs its own id.")
    if bias is not None:
        bias = _finite(bias, len(docs), "bias values", "one per document position (slot_bias averaged over layers "
                                                       "and heads, measured with this many documents)")
    orders = [tuple(ids)]
    for _ in range(rounds):
        mass = _finite(attend(replace(example, documents=tuple(docs))), len(docs), "attention masses",
                       "one per document, in the example's order")
        if bias is None:
            score = mass
        else:
            bad = [i for i, m in enumerate(mass) if m <= 0]
            if bad:
                raise ConfigError(f"attention masses at positions {bad} are not positive, so their log (for the "
                                  "bias calibration) is undefined; pass bias=None or a scorer whose masses are > 0.")
            score = [math.log(m) - b for m, b in zip(mass, bias)]
        docs = [docs[i] for i in sorted(range(len(docs)), key=lambda i: score[i])]  # stable: ties keep order
        orders.append(tuple(d.id for d in docs))
    return replace(example, documents=tuple(docs)), orders


def _finite(values, n: int, what: str, want: str) -> list[float]:
    """`values` as floats, checked to be `n` finite numbers (a ConfigError saying `want` otherwise)."""
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{what} must be numbers, {want}: {err}.") from err
    if len(out) != n:
        raise ConfigError(f"got {len(out)} {what} for {n} documents; give {want}.")
    bad = [i for i, v in enumerate(out) if not math.isfinite(v)]
    if bad:
        raise ConfigError(f"{what} at positions {bad} are not finite (NaN or infinite); give {want}, all finite.")
    return out
