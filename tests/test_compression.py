"""Budgets in the model's own tokens, strategies that respect them exactly, and gold-survival accounting on
constructed cases."""
from dataclasses import replace

import pytest

from litm.compression import (CUT_MIN_TOKENS, METHODS, compress, plan_budget, split_sentences, survival,
                              word_surprisal)
from litm.data import generate_fictional_qa
from litm.errors import ConfigError, DataError
from litm.prompts import Variant, render
from litm.types import Document, Example


def tokens(lm, example):
    return len(render(example, lm.tokenizer, Variant(), allow_empty=True).input_ids)


@pytest.fixture(scope="module")
def example():
    return generate_fictional_qa(1, 8, seed=11, sentences_per_doc=4)[0]


def test_split_sentences_gives_the_text_back():
    text = "One. Two words! Three? Four"
    assert split_sentences(text) == ["One. ", "Two words! ", "Three? ", "Four"]
    assert "".join(split_sentences(text)) == text


def test_budget_is_the_window_less_the_reserve_capped_by_the_ceiling(tiny_lm, example):
    b = plan_budget(tiny_lm, example, reserve=20)
    assert b.total == tiny_lm.window - 20 and b.fixed == tokens(tiny_lm, replace(example, documents=()))
    assert b.fixed < tokens(tiny_lm, example) and b.context == b.total - b.fixed
    assert plan_budget(tiny_lm, example, ceiling=500).total == 500
    with pytest.raises(ConfigError, match="larger than the model's window"):
        plan_budget(tiny_lm, example, ceiling=tiny_lm.window + 1)
    with pytest.raises(ConfigError, match="smaller than the prompt's fixed parts"):
        plan_budget(tiny_lm, example, ceiling=b.fixed)


@pytest.mark.parametrize("strategy", METHODS)
@pytest.mark.parametrize("slack", [10, 90, 250, 700])
def test_every_strategy_respects_the_budget_exactly(tiny_lm, example, strategy, slack):
    budget = plan_budget(tiny_lm, example, ceiling=plan_budget(tiny_lm, example).fixed + slack)
    scores = list(range(len(example.documents)))
    out = compress(tiny_lm, example, budget, strategy, scores=scores)
    assert out.prompt_tokens == tokens(tiny_lm, out.example) <= budget.total
    assert out.original_tokens == tokens(tiny_lm, example) > budget.total
    originals = {d.id: d for d in example.documents}
    for d in out.example.documents:
        if strategy == "lm_prune":  # words kept in their order
            words, source = d.text.split(), iter(originals[d.id].text.split())
            assert all(any(w == s for s in source) for w in words)
        elif strategy != "abstractive":  # nothing invented: the document's own sentences
            assert all(s.strip() in originals[d.id].text for s in split_sentences(d.text))


def test_truncate_keeps_whole_documents_then_cuts_at_a_sentence_only_with_room(tiny_lm, example):
    full = plan_budget(tiny_lm, example)
    three = tokens(tiny_lm, replace(example, documents=example.documents[:3]))
    first = replace(example.documents[3], text=split_sentences(example.documents[3].text)[0].strip())
    with_first = tokens(tiny_lm, replace(example, documents=example.documents[:3] + (first,)))
    assert with_first <= three + CUT_MIN_TOKENS, "its first sentence would fit: the rule, not the size, decides"
    tight = compress(tiny_lm, example, replace(full, ceiling=three + CUT_MIN_TOKENS), "truncate")
    assert [d.id for d in tight.example.documents] == [d.id for d in example.documents[:3]]
    four = tokens(tiny_lm, replace(example, documents=example.documents[:4]))
    assert four - 10 - three > CUT_MIN_TOKENS, "the fourth document is long enough to be cut with room to spare"
    roomy = compress(tiny_lm, example, replace(full, ceiling=four - 10), "truncate")
    docs = roomy.example.documents
    assert [d.id for d in docs[:3]] == [d.id for d in example.documents[:3]] and len(docs) == 4
    cut, whole = docs[3], example.documents[3]
    assert cut.text != whole.text and whole.text.startswith(cut.text)
    n = len(split_sentences(cut.text))
    one_more = replace(cut, text="".join(split_sentences(whole.text)[:n + 1]).rstrip())
    assert tokens(tiny_lm, replace(example, documents=docs[:3] + (one_more,))) > roomy.budget.total
    assert [k["status"] for k in roomy.kept][:5] == ["whole", "whole", "whole", "partial", "dropped"]


def test_drop_lowest_drops_the_least_relevant_and_keeps_the_order(tiny_lm, example):
    scores = [5, 1, 7, 3, 8, 2, 6, 4]
    budget = replace(plan_budget(tiny_lm, example),
                     ceiling=tokens(tiny_lm, replace(example, documents=example.documents[:4])))
    out = compress(tiny_lm, example, budget, "drop_lowest", scores=scores)
    kept = [example.documents.index(d) for d in out.example.documents]
    assert kept == sorted(kept)
    dropped = set(range(8)) - set(kept)
    assert max(scores[i] for i in dropped) < min(scores[i] for i in kept)
    with pytest.raises(ConfigError, match="one relevance score per document"):
        compress(tiny_lm, example, budget, "drop_lowest", scores=[1, 2])


def test_extractive_keeps_the_answer_sentence_at_a_tight_budget(tiny_lm, example):
    budget = replace(plan_budget(tiny_lm, example), ceiling=plan_budget(tiny_lm, example).fixed + 60)
    out = compress(tiny_lm, example, budget, "extractive")
    assert survival(example, out.example)["sentence_kept"]
    for d in out.example.documents:  # sentences stay in their original order
        original = next(o for o in example.documents if o.id == d.id).text
        positions = [original.index(s.strip()) for s in split_sentences(d.text)]
        assert positions == sorted(positions)


GOLD = Document("g", "City", "The fair opens in May. The fair is held in St. Louis every year. Tickets are cheap.",
                is_gold=True)
CASE = Example("c", "Where is the fair held?", ("St. Louis",), (Document("d", "Other", "Nothing here."), GOLD), "qa")


@pytest.mark.parametrize("gold_text, expected", [
    (GOLD.text, {"answer_kept": True, "sentence_kept": True, "gold_position": 1}),  # kept
    ("The fair opens in May.", {"answer_kept": False, "sentence_kept": False, "gold_position": 1}),  # cut
    ("The fair opens in May. The fair is held in St.", {"answer_kept": False, "sentence_kept": False,
                                                          "gold_position": 1}),  # split at a boundary
    (None, {"answer_kept": False, "sentence_kept": False, "gold_position": None}),  # dropped
])
def test_survival_on_constructed_cases(gold_text, expected):
    docs = (CASE.documents[0],) + (() if gold_text is None else (replace(GOLD, text=gold_text),))
    got = survival(CASE, replace(CASE, documents=docs))
    assert {k: got[k] for k in expected} == expected and got["gold_has_sentence"]
    moved = survival(CASE, replace(CASE, documents=(GOLD, Document("x", "X", "St. Louis is far."))))
    assert moved["gold_position"] == 0 and moved["answer_kept"] and moved["sentence_kept"]
    elsewhere = survival(CASE, replace(CASE, documents=(Document("x", "X", "St. Louis is far."),)))
    assert elsewhere["answer_kept"] and not elsewhere["sentence_kept"]  # the string, not the evidence


def test_bad_input_is_a_clear_error(tiny_lm, example):
    budget = plan_budget(tiny_lm, example)
    with pytest.raises(ConfigError, match="unknown compression strategy 'zip'"):
        compress(tiny_lm, example, budget, "zip")
    empty = replace(example, documents=example.documents[:1] + (replace(example.documents[1], text="  "),))
    with pytest.raises(DataError, match="empty"):
        compress(tiny_lm, empty, budget, "truncate")


def test_word_surprisal_adds_up_to_the_texts_negative_log_likelihood(tiny_lm):
    import torch

    question, text = "who built the mill?", "The old mill was built by Ada Brandt in 1820."
    words = word_surprisal(tiny_lm, question, text)
    assert "".join(w for w, _ in words) == text and all(v >= 0 for _, v in words)
    prefix = tiny_lm.tokenizer(f"Question: {question}\nPassage:\n")["input_ids"]
    full = tiny_lm.tokenizer(f"Question: {question}\nPassage:\n{text}")["input_ids"]
    assert full[:len(prefix)] == prefix
    with torch.no_grad():
        logp = torch.log_softmax(tiny_lm.model(input_ids=torch.tensor([full])).logits[0], -1)
    nll = -sum(float(logp[t - 1, full[t]]) for t in range(len(prefix), len(full)))
    assert sum(v for _, v in words) == pytest.approx(nll, rel=1e-4)


def test_lm_strategies_use_a_given_compressor(tiny_lm, example):
    budget = replace(plan_budget(tiny_lm, example), ceiling=plan_budget(tiny_lm, example).fixed + 120)
    calls = []

    class Spy:
        def __init__(self, lm):
            self.tokenizer, self.device, self.window, self.name = lm.tokenizer, lm.device, lm.window, "spy"
            self.model = lambda **kw: calls.append(1) or lm.model(**kw)

    spy, cache = Spy(tiny_lm), {}
    out = compress(tiny_lm, example, budget, "lm_prune", compressor=spy, cache=cache)
    assert len(calls) == len(example.documents) and out.prompt_tokens <= budget.total
    moved = replace(example, documents=example.documents[::-1])  # the same documents in another order
    again = compress(tiny_lm, moved, budget, "lm_prune", compressor=spy, cache=cache)
    assert len(calls) == len(example.documents), "the cache shares the per-document work"
    assert sorted(d.text for d in again.example.documents) == sorted(d.text for d in out.example.documents)


@pytest.mark.model
def test_extractive_with_dense_sentence_scores(tiny_lm, example):
    budget = replace(plan_budget(tiny_lm, example), ceiling=plan_budget(tiny_lm, example).fixed + 80)
    out = compress(tiny_lm, example, budget, "extractive", sentence_retriever="dense")
    assert out.prompt_tokens <= budget.total and survival(example, out.example)["sentence_kept"]
    with pytest.raises(ConfigError, match="unknown sentence retriever"):
        compress(tiny_lm, example, budget, "extractive", sentence_retriever="tfidf")
