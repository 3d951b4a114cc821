"""Core value types: a document, and an example (a question over documents)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Document:
    """One retrieved passage (QA) or one key-value pair (KV: title is the key, text the value)."""

    id: str
    title: str
    text: str
    is_gold: bool = False
    score: float | None = None
    answer: str | None = None  # the answer this document supports, when known (fictional QA, KV)
    kind: str | None = None  # distractors: "outdated", "other_region", "contradicting" (adversarial), or None


@dataclass(frozen=True)
class Example:
    """A question, its accepted answers and its documents in their original order."""

    id: str
    question: str
    answers: tuple[str, ...]
    documents: tuple[Document, ...]
    task: str  # "qa" or "kv"
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def gold_index(self) -> int:
        """Index of the (first) gold document."""
        for i, d in enumerate(self.documents):
            if d.is_gold:
                return i
        raise ValueError(f"example {self.id} has no gold document")

    @property
    def gold(self) -> Document:
        return self.documents[self.gold_index]
