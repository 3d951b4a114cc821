"""Scoring: the paper's answer normalisation and best_subspan_em, and the KV value match.

Every expected value below is written out by hand from Liu et al.'s definition: cut the prediction
at its first newline; lowercase; drop ASCII punctuation; drop the articles a/an/the as whole words;
collapse whitespace; correct when any normalised gold answer is a substring of the prediction.
"""
from __future__ import annotations

import pytest

from litm.metrics import best_subspan_em, first_line, kv_match, normalize_answer


# ------------------------------------------------------------------------ normalize_answer
@pytest.mark.parametrize("text, expected", [
    ("Paris", "paris"),
    ("  The   Eiffel\tTower  ", "eiffel tower"),
    ("U.S.", "us"),
    ("U.S. Army", "us army"),
    ("Hello, world!", "hello world"),
    ("a cat and an owl saw the dog", "cat and owl saw dog"),
    ("A", ""),
    ("The", ""),
    ("THE END", "end"),
    # articles are whole words only: these keep their letters
    ("Theodore", "theodore"),
    ("Anathema", "anathema"),
    ("banana", "banana"),
    ("other theme", "other theme"),
    ("Atheist and Anne", "atheist and anne"),
    # punctuation goes first, so hyphen/apostrophe joins (the paper's order)
    ("O'Neill", "oneill"),
    ("the-end", "theend"),
    ("rock 'n' roll", "rock n roll"),
    ("$1,000.50", "100050"),
    ("line\none", "line one"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_normalize_answer_article_between_punctuation_is_removed():
    # "(the)" -> "the" after punctuation removal -> removed as a whole word
    assert normalize_answer("in (the) end") == "in end"


# ------------------------------------------------------------------------ first_line
@pytest.mark.parametrize("text, expected", [
    ("Paris", "Paris"),
    ("  Paris  ", "Paris"),
    ("Paris\nLondon", "Paris"),
    ("Paris is the capital.\n\nIt is in France.", "Paris is the capital."),
    ("\nParis", ""),
    ("   \nParis", ""),
    ("", ""),
    ("a\r\nb", "a"),
])
def test_first_line(text, expected):
    assert first_line(text) == expected


# ------------------------------------------------------------------------ best_subspan_em
def test_exact_answer_matches():
    assert best_subspan_em("Paris", ["Paris"]) is True


def test_answer_inside_longer_prediction_matches():
    assert best_subspan_em("I think the answer is Paris, France.", ["paris"]) is True


def test_wrong_answer_does_not_match():
    assert best_subspan_em("London", ["Paris"]) is False


def test_answer_only_after_newline_is_not_matched():
    assert best_subspan_em("I am not sure.\nParis", ["Paris"]) is False
    assert best_subspan_em("\nParis", ["Paris"]) is False


def test_answer_on_first_line_with_more_lines_is_matched():
    assert best_subspan_em("Paris\nor maybe London", ["Paris"]) is True
    # only the first line counts: "London" sits on the second
    assert best_subspan_em("Paris\nor maybe London", ["London"]) is False


def test_punctuation_inside_answer():
    assert best_subspan_em("The U.S. Army", ["US"]) is True
    assert best_subspan_em("US Army", ["U.S."]) is True
    assert best_subspan_em("Shaquille O'Neal", ["Shaquille ONeal"]) is True


def test_case_and_articles_are_ignored():
    assert best_subspan_em("THE BEATLES", ["The Beatles"]) is True
    assert best_subspan_em("Beatles", ["the Beatles"]) is True
    assert best_subspan_em("an apple", ["Apple"]) is True


def test_articles_are_whole_words_only_in_matching():
    # gold "Theodore Roosevelt" must not be reduced to "odore roosevelt"
    assert best_subspan_em("Odore Roosevelt", ["Theodore Roosevelt"]) is False
    assert best_subspan_em("Theodore Roosevelt", ["Theodore Roosevelt"]) is True


def test_whitespace_is_collapsed():
    assert best_subspan_em("New    York\tCity", ["new york"]) is True


def test_multiple_answers_only_second_matches():
    assert best_subspan_em("It was Wilhelm Conrad Röntgen.", ["Marie Curie", "Röntgen"]) is True


def test_multiple_answers_none_matches():
    assert best_subspan_em("Albert Einstein", ["Marie Curie", "Röntgen"]) is False


def test_no_answers_is_not_correct():
    assert best_subspan_em("anything", []) is False


def test_answers_may_be_any_iterable():
    assert best_subspan_em("Paris", (a for a in ["Lyon", "Paris"])) is True


def test_substring_is_on_characters_not_words():
    # the paper's rule is a plain substring test of normalised strings
    assert best_subspan_em("Parisian", ["Paris"]) is True
    assert best_subspan_em("Par is", ["Paris"]) is False


def test_returns_a_real_bool():
    assert best_subspan_em("Paris", ["Paris"]) is True
    assert best_subspan_em("Lyon", ["Paris"]) is False


# ------------------------------------------------------------------------ kv_match
UUID_V = "9f1c2e4a-0b3d-4c5e-8f6a-7b8c9d0e1f2a"


def test_kv_exact():
    assert kv_match(UUID_V, UUID_V) is True


def test_kv_case_insensitive():
    assert kv_match(UUID_V.upper(), UUID_V) is True
    assert kv_match(UUID_V, UUID_V.upper()) is True


def test_kv_inside_longer_text():
    assert kv_match(f'The value is "{UUID_V}".\nDone.', UUID_V) is True


def test_kv_other_value_does_not_match():
    assert kv_match("9f1c2e4a-0b3d-4c5e-8f6a-7b8c9d0e1f2b", UUID_V) is False


def test_kv_partial_value_does_not_match():
    assert kv_match(UUID_V[:-1], UUID_V) is False
    assert kv_match("", UUID_V) is False


@pytest.mark.parametrize("text, expected", [
    ("Lamiskmial Felnothvaeth [3]", [3]),
    ("Paris [2, 5] and [2]", [2, 5]),
    ("It is in Document 4.", [4]),
    ("search result [7] says so", [7]),
    ("no citation here", []),
    ("Ada Lovelace\n[9]", []),  # only the first line counts, as for the answer
])
def test_parse_citations(text, expected):
    from litm.metrics import parse_citations

    assert parse_citations(text) == expected
