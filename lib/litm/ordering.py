"""Where each document goes: choose the documents and move the gold to a position."""
from __future__ import annotations

from dataclasses import replace

from .errors import ConfigError
from .types import Example


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
    keep = {id(d) for d in [d for d in example.documents if d is not gold][: num_docs - 1]}
    docs = [d for d in example.documents if d is gold or id(d) in keep]
    return replace(example, documents=tuple(docs))


def gold_at(example: Example, position: int) -> Example:
    """Move the gold document to `position` (0-based); distractors keep their original order."""
    n = len(example.documents)
    if not 0 <= position < n:
        raise ConfigError(f"gold position {position} is out of range for {n} documents (0..{n - 1}).")
    gold = example.gold
    distractors = [d for d in example.documents if d is not gold]
    distractors.insert(position, gold)
    return replace(example, documents=tuple(distractors))
