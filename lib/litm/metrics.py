"""Scoring a prediction: the paper's best_subspan_em for QA, value match for KV."""
from __future__ import annotations

import re
import string
from typing import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace (the paper's order)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def first_line(prediction: str) -> str:
    """The prediction up to its first newline, stripped, as the paper scores it."""
    return prediction.split("\n", 1)[0].strip()


def best_subspan_em(prediction: str, answers: Iterable[str]) -> bool:
    """True when any normalised gold answer is a substring of the normalised first line of the prediction."""
    pred = normalize_answer(first_line(prediction))
    return any(normalize_answer(a) in pred for a in answers)


def kv_match(prediction: str, value: str) -> bool:
    """True when the gold value appears in the prediction, ignoring case."""
    return value.lower() in prediction.lower()


_CITATION = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]|\b(?:document|search result)\s+(?:\[)?(\d+)", re.IGNORECASE)


def parse_citations(prediction: str) -> list[int]:
    """Document numbers (1-based) cited in the first line of a prediction: "[3]", "[2, 5]", "Document 4",
    "search result 1"; in order of appearance, without repeats."""
    found = _CITATION.findall(first_line(prediction))
    return list(dict.fromkeys(int(n) for bracket, named in found for n in (bracket.split(",") if bracket else [named])))
