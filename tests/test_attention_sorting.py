"""Attention sorting: exact orders from a stand-in scorer whose attention is known (relevance times a positional
weight), one clear error per bad input, and the model-backed masses checked against eager attention."""
import math

import numpy as np
import pytest

from litm.attention_study import document_masses
from litm.data import generate_fictional_qa
from litm.errors import ConfigError
from litm.ordering import ORDERINGS, attention_sort
from litm.prompts import Variant, render
from litm.types import Document, Example

from test_attention import eager_reference

# Relevance of five documents; the relevance order, least first, is b (1), d (2), c (3), e (4), a (10).
RELEVANCE = {"a": 10.0, "b": 1.0, "c": 3.0, "d": 2.0, "e": 4.0}
BY_RELEVANCE = ("b", "d", "c", "e", "a")
FLAT = [1.0] * 5
RECENCY = [1.0, 2.0, 4.0, 8.0, 16.0]  # each position doubles the attention a document gets


def example(order="abcde"):
    docs = tuple(Document(i, f"title {i}", f"text {i}", i == "a") for i in order)
    return Example("q", "who?", ("x",), docs, "qa")


def scorer(weight, calls=None):
    """Known attention: the document at position p gets relevance * weight[p]."""
    def attend(ex):
        if calls is not None:
            calls.append(tuple(d.id for d in ex.documents))
        return [RELEVANCE[d.id] * weight[p] for p, d in enumerate(ex.documents)]
    return attend


def test_one_round_without_a_positional_weight_sorts_by_relevance_most_relevant_last():
    out, orders = attention_sort(example(), scorer(FLAT), rounds=1)
    assert tuple(d.id for d in out.documents) == BY_RELEVANCE
    assert orders == [tuple("abcde"), BY_RELEVANCE]
    assert out.id == "q" and out.question == "who?" and out.answers == ("x",)
    assert sorted(out.documents, key=lambda d: d.id) == sorted(example().documents, key=lambda d: d.id)


def test_ties_keep_their_current_order():
    tied = lambda ex: [1.0 if d.id in "bd" else 2.0 for d in ex.documents]  # b, d tie low; a, c, e tie high
    _, orders = attention_sort(example("edcba"), tied, rounds=1)
    assert orders[1] == ("d", "b", "e", "c", "a")


def test_raw_sorting_under_strong_recency_locks_in_a_wrong_order():
    # Worked by hand, scores = relevance * 2**position, sorted ascending:
    # abcde: a 10, b 2, c 12, d 16, e 64    -> b a c d e
    # bacde: b 1, a 20, c 12, d 16, e 64    -> b c d a e
    # bcdae: b 1, c 6, d 8, a 80, e 64      -> b c d e a
    # bcdea: b 1, c 6, d 8, e 32, a 160     -> b c d e a (a fixed point: c stays before d, as 3 * 4 < 2 * 8)
    calls = []
    out, orders = attention_sort(example(), scorer(RECENCY, calls), rounds=4)
    assert orders == [tuple("abcde"), tuple("bacde"), tuple("bcdae"), tuple("bcdea"), tuple("bcdea")]
    assert tuple(d.id for d in out.documents) == tuple("bcdea") != BY_RELEVANCE
    assert calls == orders[:-1]  # one scoring pass per round, on the order of that round


@pytest.mark.parametrize("shift", [0.0, -math.log(16) / 2, 3.0])  # the bias is defined up to a constant
def test_calibrated_sorting_removes_a_known_recency_bias(shift):
    bias = [math.log(w) + shift for w in RECENCY]
    out, orders = attention_sort(example(), scorer(RECENCY), rounds=1, bias=bias)
    assert tuple(d.id for d in out.documents) == BY_RELEVANCE
    _, orders = attention_sort(example(), scorer(RECENCY), rounds=3, bias=np.array(bias))
    assert len(orders) == 4 and orders[0] == tuple("abcde") and set(orders[1:]) == {BY_RELEVANCE}


def test_a_partial_bias_correction_gives_the_order_worked_by_hand():
    # bias log 2 per position against a true 2**position * 2**position: calibrated score log r + p log 2
    # abcde: a 10, b 2, c 12, d 16, e 64 (in exp units) -> b a c d e, as the raw first round above
    bias = [p * math.log(2) for p in range(5)]
    weight = [4.0 ** p for p in range(5)]
    _, orders = attention_sort(example(), scorer(weight), rounds=1, bias=bias)
    assert orders == [tuple("abcde"), tuple("bacde")]


@pytest.mark.parametrize("rounds", [0, -1, 1.5, True, "2"])
def test_rounds_must_be_a_positive_whole_number(rounds):
    with pytest.raises(ConfigError, match="rounds must be"):
        attention_sort(example(), scorer(FLAT), rounds=rounds)


def test_a_wrong_length_attention_vector_is_an_error():
    with pytest.raises(ConfigError, match="got 4 attention masses for 5 documents"):
        attention_sort(example(), lambda ex: [1.0, 2.0, 3.0, 4.0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_mass_is_an_error(bad):
    with pytest.raises(ConfigError, match=r"attention masses at positions \[2\] are not finite"):
        attention_sort(example(), lambda ex: [1.0, 2.0, bad, 4.0, 5.0])


def test_a_wrong_length_bias_is_an_error():
    with pytest.raises(ConfigError, match="got 4 bias values for 5 documents"):
        attention_sort(example(), scorer(FLAT), bias=[0.0, 0.1, 0.2, 0.3])


def test_a_nan_bias_is_an_error():
    with pytest.raises(ConfigError, match=r"bias values at positions \[0\] are not finite"):
        attention_sort(example(), scorer(FLAT), bias=[float("nan"), 0.0, 0.0, 0.0, 0.0])


def test_a_non_positive_mass_is_an_error_only_where_its_log_is_taken():
    masses = lambda ex: [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ConfigError, match=r"positions \[0\] are not positive"):
        attention_sort(example(), masses, bias=[0.0] * 5)
    _, orders = attention_sort(example(), masses)  # raw masses may be zero
    assert orders[1] == tuple("abcde")


def test_duplicate_ids_and_no_documents_are_errors():
    with pytest.raises(ConfigError, match="duplicate document ids"):
        attention_sort(example("abca"), lambda ex: [1.0] * 4)
    with pytest.raises(ConfigError, match="no documents"):
        attention_sort(Example("q", "who?", ("x",), (), "qa"), lambda ex: [])


def test_attention_sort_is_not_a_named_arrangement():
    assert "attention_sort" not in ORDERINGS  # it needs a scorer, so arrange() cannot run it


def test_document_masses_on_a_tiny_model_match_eager_attention(tiny_model_dir, tiny_lm):
    ex = generate_fictional_qa(1, 5, seed=3, sentences_per_doc=2)[0]
    attend = document_masses(tiny_lm)
    masses = attend(ex)
    assert len(masses) == 5 and all(math.isfinite(m) and m > 0 for m in masses)
    prompt = render(ex, tiny_lm.tokenizer, Variant())
    _, keys = eager_reference(str(tiny_model_dir), prompt, [prompt.manifest.num_tokens - 1])  # [layer, head, key]
    eager = np.array([keys[:, :, s:e].sum(-1).mean() for s, e in prompt.manifest.doc_spans])
    np.testing.assert_allclose(masses, eager, rtol=1e-4)
    np.testing.assert_allclose(document_masses(tiny_lm, layers=[1])(ex),
                               [keys[1, :, s:e].sum(-1).mean() for s, e in prompt.manifest.doc_spans], rtol=1e-4)

    out, orders = attention_sort(ex, attend, rounds=2)
    ids = tuple(d.id for d in ex.documents)
    assert len(orders) == 3 and orders[0] == ids and orders[-1] == tuple(d.id for d in out.documents)
    assert sorted(out.documents, key=lambda d: d.id) == sorted(ex.documents, key=lambda d: d.id)
    assert all(sorted(o) == sorted(ids) for o in orders)
    # the first round's order is decided: the masses are further apart than twice profile's distance from eager
    assert np.diff(np.sort(eager)).min() > 2 * np.abs(np.array(masses) - eager).max()
    assert orders[1] == tuple(ids[i] for i in np.argsort(eager, kind="stable"))
    # a zero bias sorts by log mass: the same orders
    assert attention_sort(ex, attend, rounds=2, bias=[0.0] * 5)[1] == orders


def test_document_masses_refuses_layers_out_of_range_and_parallel_prompts(tiny_lm):
    with pytest.raises(ConfigError, match="layers"):
        document_masses(tiny_lm, layers=[7])
    with pytest.raises(ConfigError, match="parallel"):
        document_masses(tiny_lm, Variant(parallel=True))
    ex = generate_fictional_qa(1, 3, seed=3, sentences_per_doc=2)[0]
    with pytest.raises(ConfigError, match="condition='documents'"):
        document_masses(tiny_lm, Variant(condition="oracle"))(ex)
