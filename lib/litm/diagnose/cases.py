"""A user's RAG cases: read from JSONL or a `datasets` table with one clear error per problem, and
conflicting copies of a case's gold for an interference test."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterable, Mapping

from ..data.generate import ADVERSARIAL_KINDS
from ..data.liu import check_unicode
from ..errors import ConfigError, DataError
from ..metrics import normalize_answer
from ..types import Document, Example

DOC_KINDS = (None, "distractor") + ADVERSARIAL_KINDS
_META = ("version", "date", "authority")


def _str(obj: Mapping, key: str, where: str, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise DataError(f"{where}: missing field {key!r}.")
        return None
    if not isinstance(value, (str, int, float)):
        raise DataError(f"{where}: field {key!r} should be text, got {type(value).__name__}.")
    return str(value)


def case_from_record(obj: Mapping, where: str, index: int) -> Example:
    """One case (a JSON object or a `datasets` row) as an Example; every problem is one DataError naming
    the case and what to fix."""
    case_id = _str(obj, "id", where, required=False) or f"case-{index + 1}"
    where = f"{where} (case {case_id!r})"
    question = _str(obj, "question", where)
    given = obj.get("answers")
    given = [given] if isinstance(given, str) else given
    answers = tuple(a for a in given if isinstance(a, str) and a.strip()) if isinstance(given, (list, tuple)) else ()
    if not answers:
        raise DataError(f"{where}: 'answers' must be a non-empty list of accepted answers, e.g. [\"20 weeks\"].")
    docs_in = obj.get("documents")
    if not isinstance(docs_in, (list, tuple)) or not docs_in:
        raise DataError(f"{where}: 'documents' must be a non-empty list of {{id, title, text}} objects.")
    gold_id = _str(obj, "gold_id", where)
    docs, seen = [], set()
    for j, d in enumerate(docs_in):
        dwhere = f"{where}, document #{j + 1}"
        if not isinstance(d, Mapping):
            raise DataError(f"{dwhere}: expected an object with id, title and text.")
        doc_id = _str(d, "id", dwhere, required=False)
        if doc_id is None:
            raise DataError(f"{dwhere}: has no 'id'; every document needs one (gold_id names the gold by it).")
        if doc_id in seen:
            raise DataError(f"{dwhere}: id {doc_id!r} appears twice in this case.")
        seen.add(doc_id)
        kind = d.get("kind")
        if kind not in DOC_KINDS:
            raise DataError(f"{dwhere}: kind {kind!r} is not one of {[k for k in DOC_KINDS if k]}.")
        title = _str(d, "title", dwhere, required=False) or ""
        meta = [f"version {d['version']}" if k == "version" else str(d[k]) for k in _META if d.get(k)]
        if meta:  # what a reader needs to tell versions apart goes into the prompt with the title
            title = f"{title} [{', '.join(meta)}]".strip()
        docs.append(Document(doc_id, title, _str(d, "text", dwhere), is_gold=doc_id == gold_id,
                             answer=_str(d, "answer", dwhere, required=False),
                             kind=None if kind == "distractor" else kind))
    if gold_id not in seen:
        raise DataError(f"{where}: gold_id {gold_id!r} is not among its documents' ids {sorted(seen)}.")
    if len(docs) < 2:
        raise DataError(f"{where}: needs the gold and at least one other document to move the gold among.")
    return Example(case_id, question, answers, tuple(docs), "qa", {"source": where})


def _checked_row(obj, where: str) -> Mapping:
    """A row given in memory: an object whose text is valid Unicode (`iter_json_lines` checks a file's lines)."""
    if not isinstance(obj, Mapping):
        raise DataError(f"{where}: expected a case (an object), got {type(obj).__name__}.")
    check_unicode(dict(obj), where)
    return obj


# CASES = "generated": fictional multi-document QA cases (seed 0) of ten documents, three of them conflicting
# copies of the gold fact (outdated, for another region, contradicting), as the paper profile diagnoses
GENERATED_CASES, GENERATED_DOCS = 60, 10


def read_cases(source, limit: int | None = None) -> list[Example]:
    """Cases from a JSONL file (one case per line), any iterable of mappings (e.g. a `datasets.Dataset`), or
    "generated" (`GENERATED_CASES` fictional cases with conflicting copies of each gold fact).

    A case: {"id", "question", "answers": [...], "gold_id", "documents": [{"id", "title", "text",
    optional "version", "date", "authority", "answer" (what this document would answer), "kind"
    ("outdated", "other_region", "contradicting" or "distractor")}]}."""
    if source == "generated":
        from ..data.generate import ADVERSARIAL_KINDS, generate_fictional_qa

        return generate_fictional_qa(limit or GENERATED_CASES, GENERATED_DOCS, 0, adversarial=ADVERSARIAL_KINDS)
    if isinstance(source, (str, Path)):
        from ..data.liu import iter_json_lines

        rows: Iterable = ((f"{source}:{lineno}", obj) for lineno, obj in iter_json_lines(
            source, hint="Fix that line of your cases file.", missing="Give the path of your cases file (JSONL)."))
    else:  # rows of a table or list: checked here as the file reader checks each line
        rows = ((f"row {i + 1}", _checked_row(obj, f"row {i + 1}")) for i, obj in enumerate(source))
    out, ids = [], set()
    for i, (where, obj) in enumerate(rows):
        if limit is not None and len(out) >= limit:
            break
        case = case_from_record(obj, where, i)
        if case.id in ids:
            raise DataError(f"{where}: case id {case.id!r} appears twice; ids must be unique.")
        ids.add(case.id)
        out.append(case)
    if not out:
        raise DataError(f"{source}: no cases.")
    return out


def with_adversarial(case: Example, kinds: Iterable[str], replacements: Iterable[str]) -> Example:
    """Add conflicting copies of the gold to a user's case: each kind gets the gold's text with the first
    accepted answer found in it replaced by the next of `replacements` ("outdated": marked superseded;
    "other_region": marked as applying to another region or role; "contradicting": unmarked)."""
    kinds = list(kinds)
    gold = case.gold
    found = next((a for a in case.answers if a in gold.text), None)
    if found is None:
        raise DataError(f"case {case.id!r}: none of its answers {list(case.answers)} appears verbatim in the gold "
                        "document, so no conflicting copy can be made from it; add conflicting documents yourself.")
    taken = {normalize_answer(a) for a in case.answers} | {normalize_answer(d.answer) for d in case.documents
                                                           if d.answer}
    pool = [r for r in dict.fromkeys(replacements) if normalize_answer(r) not in taken]
    if len(pool) < len(kinds):
        raise DataError(f"case {case.id!r}: not enough replacement answers for {kinds}.")
    marks = {"outdated": " [superseded earlier version]", "other_region": " [applies to a different region or role]",
             "contradicting": ""}
    extra = []
    for kind, answer in zip(kinds, pool):
        if kind not in ADVERSARIAL_KINDS:
            raise ConfigError(f"unknown adversarial kind {kind!r}: use {ADVERSARIAL_KINDS}.")
        extra.append(Document(f"{gold.id}~{kind}", gold.title + marks[kind], gold.text.replace(found, answer),
                              answer=answer, kind=kind))
    return replace(case, documents=case.documents + tuple(extra))

