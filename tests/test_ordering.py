"""Ordering strategies give exact orders; bad pools and scores are clear errors."""
import pytest

from litm.errors import ConfigError
from litm.ordering import (ORDERINGS, arrange, evidence_first, langchain, random_order, ranked_top_k, reorder,
                           reverse, u_shape)
from litm.types import Document, Example


def ranks(n):
    return list(range(1, n + 1))  # rank r stands for the r-th most relevant document


def langchain_reference(ranked):
    """LangChain's LongContextReorder procedure as documented: reverse the list, then insert the items
    at even steps at the front and append those at odd steps."""
    out = []
    for i, d in enumerate(list(reversed(ranked))):
        if i % 2 == 1:
            out.append(d)
        else:
            out.insert(0, d)
    return out


def test_u_shape_sandwiches_the_least_relevant_in_the_middle():
    assert u_shape(ranks(6)) == [1, 3, 5, 6, 4, 2]
    assert u_shape(ranks(5)) == [1, 3, 5, 4, 2]
    assert u_shape(ranks(1)) == [1]
    assert reverse(ranks(4)) == [4, 3, 2, 1]


@pytest.mark.parametrize("n, expected", [
    (5, [1, 3, 5, 4, 2]),
    (6, [2, 4, 6, 5, 3, 1]),
    (7, [1, 3, 5, 7, 6, 4, 2]),
    (20, [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1]),
])
def test_langchain_flips_with_parity(n, expected):
    assert langchain(ranks(n)) == expected == langchain_reference(ranks(n))
    top_first = expected[0] == 1
    assert top_first == (n % 2 == 1)  # odd: rank 1 first; even: rank 1 last


def test_random_is_seeded_and_a_permutation():
    a, b, c = random_order(ranks(10), 3), random_order(ranks(10), 3), random_order(ranks(10), 4)
    assert a == b and a != c and sorted(a) == ranks(10)


def test_evidence_first_moves_the_m_most_evident_and_keeps_rank_order():
    assert evidence_first(ranks(5), [0.1, 0.0, 0.9, 0.2, 0.8], m=2) == [3, 5, 1, 2, 4]
    assert evidence_first(ranks(3), [0, 0, 0], m=1) == [1, 2, 3]
    with pytest.raises(ConfigError, match="m must"):
        evidence_first(ranks(3), [0, 0, 0], m=4)


def _docs(n):
    return [Document(id=f"d{i}", title=f"T{i}", text=f"text {i}", is_gold=i == 2) for i in range(n)]


def test_reorder_keeps_the_top_k_by_score_then_orders_them():
    ex = Example("q", "Q?", ("a",), tuple(_docs(6)), "qa")
    scores = [0.1, 0.5, 0.9, 0.3, 0.7, 0.5]  # rank: d2, d4, d1, d5 (tie keeps input order), d3, d0
    assert [d.id for d in ranked_top_k(ex.documents, scores, 4)] == ["d2", "d4", "d1", "d5"]
    got = reorder(ex, scores, "u_shape", k=4)
    assert [d.id for d in got.documents] == ["d2", "d1", "d5", "d4"]
    ev = [0, 0, 0, 0, 0, 1.0]  # d5 is the most evident
    assert [d.id for d in reorder(ex, scores, "evidence_first", k=4, evidence=ev).documents] == ["d5", "d2", "d4", "d1"]
    assert set(ORDERINGS) == {"rank", "reverse", "u_shape", "langchain", "random", "evidence_first"}


def test_bad_pools_and_scores_are_clear_errors():
    docs = _docs(3)
    with pytest.raises(ConfigError, match="unknown ordering strategy 'zigzag'"):
        arrange(docs, "zigzag")
    with pytest.raises(ConfigError, match="missing"):
        ranked_top_k(docs, None)
    with pytest.raises(ConfigError, match="got 2 scores for 3"):
        ranked_top_k(docs, [1, 2])
    with pytest.raises(ConfigError, match="missing value"):
        ranked_top_k(docs, [1, float("nan"), 2])
    with pytest.raises(ConfigError, match="duplicate document ids \\['d0'\\]"):
        ranked_top_k(docs + [docs[0]], [1, 2, 3, 4])
    with pytest.raises(ConfigError, match="k=4 but the pool holds 3"):
        ranked_top_k(docs, [1, 2, 3], k=4)
    with pytest.raises(ConfigError, match="empty"):
        ranked_top_k([], [])
