"""Readers for the data files of Liu et al. (TACL 2024): multi-document QA and key-value retrieval.

QA line: {"question", "answers", "ctxs": [{"title", "text", "hasanswer", "isgold", "id"?, "score"?,
"original_retrieval_index"?}], "nq_annotated_gold"}.  KV line: {"ordered_kv_records": [[k, v], ...],
"key", "value"}.  Both read from .jsonl or .jsonl.gz, eagerly or (through `datasets`) streamed.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import DataError
from ..types import Document, Example


FETCH_HINT = "The file may be truncated or corrupt: fetch it again (`python -m litm fetch liu2023`)."
FETCH_MISSING = "Run `python -m litm fetch liu2023` or pass the right path."


def _check_file(path: Path, missing: str = FETCH_MISSING) -> None:
    if not path.is_file():
        raise DataError(f"{path}: no such file. {missing}")


def check_unicode(obj, where: str) -> None:
    """A DataError when text in `obj` is not valid Unicode: a lone surrogate (JSON such as "\\ud800", left by text
    cut in half) cannot be tokenized.  Refused, not cleaned: cleaning would change what the model is shown."""
    try:
        json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start:exc.end].encode("unicode_escape").decode()
        raise DataError(f"{where}: holds text that is not valid Unicode (a lone surrogate {bad}, from text cut in "
                        "half); fix or remove it.") from None


def iter_json_lines(path: str | Path, hint: str = FETCH_HINT, missing: str = FETCH_MISSING) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-blank line; a bad line (not UTF-8, not JSON, not an object,
    text that is not valid Unicode) is a DataError naming it, ending with `hint` where the file may be cut."""
    path = Path(path)
    _check_file(path, missing)
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not UTF-8 (byte {raw[exc.start]:#04x} at column "
                                    f"{exc.start + 1}); save the file as UTF-8. {hint}") from None
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg}). {hint}") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}.")
                if "\\ud" in line.lower():  # a \\uXXXX escape in the surrogate range: check the text
                    check_unicode(obj, f"{path}:{lineno}")
                yield lineno, obj
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot be read ({exc}). {hint}") from None


def _require(obj: dict, field: str, kind: type, where: str):
    if obj.get(field) is None:  # streaming through `datasets` fills absent fields with None
        raise DataError(f"{where}: missing field {field!r}. Is this a Liu et al. file of the right task?")
    value = obj[field]
    if not isinstance(value, kind):
        raise DataError(f"{where}: field {field!r} should be {kind.__name__}, got {type(value).__name__}.")
    return value


def _score(value, where: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: ctx score {value!r} is not a number.") from None


def qa_example_from_obj(obj: dict, example_id: str, where: str) -> Example:
    """Build an Example from one QA object; documents keep the file's order."""
    question = _require(obj, "question", str, where)
    answers = _require(obj, "answers", list, where)
    ctxs = _require(obj, "ctxs", list, where)
    if not answers or not all(isinstance(a, str) for a in answers):
        raise DataError(f"{where}: 'answers' must be a non-empty list of strings.")
    if not ctxs:
        raise DataError(f"{where}: 'ctxs' is empty; an example needs at least its gold document.")
    docs = []
    for i, ctx in enumerate(ctxs):
        cw = f"{where} ctxs[{i}]"
        if not isinstance(ctx, dict):
            raise DataError(f"{cw}: expected an object.")
        is_gold = bool(ctx.get("isgold", False))
        docs.append(Document(id=str(ctx.get("id", f"{example_id}-ctx{i}")), title=_require(ctx, "title", str, cw),
                             text=_require(ctx, "text", str, cw), is_gold=is_gold, score=_score(ctx.get("score"), cw),
                             answer=answers[0] if is_gold else None))
    if not any(d.is_gold for d in docs):
        raise DataError(f"{where}: no ctx has \"isgold\": true; every example needs its gold document.")
    return Example(id=example_id, question=question, answers=tuple(answers), documents=tuple(docs),
                   task="qa", meta={"nq_annotated_gold": obj.get("nq_annotated_gold")})


def kv_example_from_obj(obj: dict, example_id: str, where: str) -> Example:
    """Build an Example from one KV object: each pair is a Document(title=key, text=value)."""
    records = _require(obj, "ordered_kv_records", list, where)
    key = _require(obj, "key", str, where)
    value = _require(obj, "value", str, where)
    if not records:
        raise DataError(f"{where}: 'ordered_kv_records' is empty.")
    stored: dict[str, str] = {}
    for i, rec in enumerate(records):
        if not (isinstance(rec, (list, tuple)) and len(rec) == 2 and all(isinstance(x, str) for x in rec)):
            raise DataError(f"{where}: ordered_kv_records[{i}] is not a [key, value] pair of strings.")
        k, v = rec
        if k in stored:
            raise DataError(f"{where}: key {k!r} appears twice in ordered_kv_records.")
        stored[k] = v
    if key not in stored:
        raise DataError(f"{where}: the key {key!r} is not among ordered_kv_records (no gold pair).")
    if stored[key] != value:
        raise DataError(f"{where}: 'value' does not match the value stored with the key.")
    docs = tuple(Document(id=k, title=k, text=v, is_gold=(k == key), answer=v) for k, v in stored.items())
    return Example(id=example_id, question=key, answers=(value,), documents=docs, task="kv")


_BUILDERS = {"qa": qa_example_from_obj, "kv": kv_example_from_obj}


def _check_args(task: str, limit: int | None) -> None:
    if task not in _BUILDERS:
        raise DataError(f"unknown task {task!r}: use 'qa' or 'kv'.")
    if limit is not None and limit < 1:
        raise DataError(f"limit must be at least 1 (got {limit}); use None for all examples.")


def _examples(objs: Iterable[tuple[str, dict]], task: str, name: str, limit: int | None) -> Iterator[Example]:
    """Examples from (location, object) pairs; ids count records (blank lines skipped) from 1."""
    build = _BUILDERS[task]
    for n, (where, obj) in enumerate(objs, 1):
        yield build(obj, f"{name}#{n}", where)
        if limit is not None and n >= limit:
            return


def read_examples(path: str | Path, task: str, limit: int | None = None) -> list[Example]:
    """Read a Liu et al. QA or KV file (.jsonl or .jsonl.gz) into Examples; ids are `<file>#<record>`."""
    path = Path(path)
    _check_args(task, limit)
    lines = ((f"{path}:{lineno}", obj) for lineno, obj in iter_json_lines(path))
    examples = list(_examples(lines, task, path.name, limit))
    if not examples:
        raise DataError(f"{path}: holds no examples.")
    return examples


def stream_examples(path: str | Path, task: str, limit: int | None = None) -> Iterator[Example]:
    """Stream a large file through `datasets` (load_dataset("json", streaming=True))."""
    path = Path(path)
    _check_args(task, limit)
    _check_file(path)
    from datasets import load_dataset

    ds = load_dataset("json", data_files=str(path), split="train", streaming=True)

    def numbered():
        try:
            for i, obj in enumerate(ds, 1):
                check_unicode(obj, f"{path} record {i}")
                yield f"{path} record {i}", obj
        except Exception as exc:  # pyarrow/json errors differ between versions
            raise DataError(f"{path}: cannot be parsed as JSON lines ({exc}).") from None

    return _examples(numbered(), task, path.name, limit)
