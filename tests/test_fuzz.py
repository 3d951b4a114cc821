"""Property-based tests (hypothesis): whatever a data file, a cases file, a results folder or a command line
holds, reading or checking it gives a valid result or our one error type (LitmError), never another
exception.  Several hundred generated inputs per reader."""
import gzip
import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litm.data import read_examples
from litm.diagnose import read_cases
from litm.errors import LitmError
from litm.store import read_manifest, read_records

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "data" / "samples" / "rag_cases.jsonl"
EXAMPLES = settings(max_examples=300, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# text as users' files hold it, lone surrogates (which JSON can carry as "\ud800") included
pieces = st.sampled_from(["a", "Paris", "é", "名", "\ud800", "\udfff", "\n", " ", "", "[1]", "{question}", "\x00"])
texts = st.one_of(st.text(max_size=12), st.lists(pieces, max_size=4).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(texts, inner, max_size=4)), max_leaves=12)


def _maybe(field_values: dict):
    """An object with some of the fields a reader expects (each valid-looking or not) and some others."""
    return st.fixed_dictionaries({}, optional=field_values).flatmap(
        lambda d: st.dictionaries(texts, values, max_size=2).map(lambda extra: {**extra, **d}))


ctx = _maybe({"title": texts, "text": texts, "isgold": st.one_of(st.booleans(), values), "id": values,
              "score": st.one_of(st.floats(), texts, st.none())})
qa_obj = _maybe({"question": st.one_of(texts, values), "answers": st.one_of(st.lists(texts, max_size=3), values),
                 "ctxs": st.one_of(st.lists(ctx, max_size=4), values), "nq_annotated_gold": values})
kv_obj = _maybe({"key": st.one_of(texts, values), "value": st.one_of(texts, values),
                 "ordered_kv_records": st.one_of(st.lists(st.lists(texts, min_size=2, max_size=2), max_size=4),
                                                 values)})
doc = _maybe({"id": st.one_of(texts, st.integers(0, 3)), "title": texts, "text": texts, "answer": texts,
              "kind": st.one_of(st.sampled_from(["outdated", "distractor", "contradicting", "nope"]), values),
              "version": values, "date": values, "authority": values})
case_obj = _maybe({"id": st.one_of(texts, st.integers(0, 5)), "question": st.one_of(texts, values),
                   "answers": st.one_of(st.lists(texts, max_size=3), texts, values),
                   "gold_id": st.one_of(st.sampled_from(["d1", "d2"]), texts, values),
                   "documents": st.one_of(st.lists(doc, max_size=4), values)})


def _line(obj) -> st.SearchStrategy:
    """One line of a JSONL file: the object as JSON, or something a broken file holds instead."""
    return st.one_of(st.just(json.dumps(obj)), st.just(json.dumps(obj)[: len(json.dumps(obj)) // 2]),
                     st.just(""), st.just(json.dumps([obj])), texts)


def _file(objects) -> st.SearchStrategy:
    lines = st.lists(objects.flatmap(_line), max_size=5).map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass"))
    return st.one_of(lines, st.binary(max_size=200))


def _write(folder: Path, data: bytes, name: str) -> Path:
    path = folder / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@EXAMPLES
@given(data=_file(qa_obj), gz=st.booleans())
def test_qa_reader(folder, data, gz):
    path = _write(folder, data, "qa.jsonl.gz" if gz else "qa.jsonl")
    try:
        examples = read_examples(path, "qa")
    except LitmError:
        return
    assert examples and all(e.gold.is_gold and e.question == e.question.encode("utf-8").decode() for e in examples)


@EXAMPLES
@given(data=_file(kv_obj))
def test_kv_reader(folder, data):
    path = _write(folder, data, "kv.jsonl")
    try:
        examples = read_examples(path, "kv")
    except LitmError:
        return
    assert examples and all(e.answers[0] == e.gold.text for e in examples)


@EXAMPLES
@given(data=_file(case_obj), limit=st.one_of(st.none(), st.integers(1, 3)))
def test_cases_reader_on_files(folder, data, limit):
    path = _write(folder, data, "cases.jsonl")
    try:
        cases = read_cases(path, limit)
    except LitmError:
        return
    assert cases and len({c.id for c in cases}) == len(cases) and all(c.gold.is_gold for c in cases)


@EXAMPLES
@given(rows=st.lists(st.one_of(case_obj, values), max_size=4))
def test_cases_reader_on_rows(rows):
    try:
        cases = read_cases(rows)
    except LitmError:
        return
    assert cases and all(len(c.documents) >= 2 for c in cases)


@EXAMPLES
@given(data=st.one_of(_file(st.fixed_dictionaries({"example_id": texts}, optional={"status": texts})),
                      st.binary(max_size=200)))
def test_records_and_manifest_readers(folder, data):
    path = _write(folder, data, "records.jsonl")
    try:
        records, end = read_records(path)
        assert all(isinstance(r["example_id"], str) for r in records) and end <= len(data)
    except LitmError:
        pass
    run = folder / "run"
    run.mkdir(exist_ok=True)
    _write(run, data, "manifest.json")
    try:
        assert isinstance(read_manifest(run)["config"], dict)
    except LitmError:
        pass


# command lines: any value of the options that take one is a valid run or one LitmError, decided without a model

numbers = st.one_of(st.lists(st.integers(-3, 12), max_size=4).map(lambda xs: ",".join(map(str, xs))),
                    st.text(string.digits + ",.-x ", max_size=8))
fractions = st.one_of(st.lists(st.sampled_from([-0.5, 0, 0.25, 0.5, 0.75, 0.95, 1, 1.5]), max_size=5)
                      .map(lambda xs: ",".join(map(str, xs))), st.text(string.digits + ",.-e ", max_size=8))
small = st.one_of(st.integers(-2, 9).map(str), st.sampled_from(["all", "", "x", "1.5", "-0", "10**9"]))


def _options(spec: dict) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional=spec).map(
        lambda d: [f"{k}={v}" for k, v in d.items()])


sweep_options = _options({"--task": st.sampled_from(["qa", "kv", "xx"]), "--positions": numbers, "--limit": small,
                          "--docs": small, "--seed": small, "--batch-size": small, "--max-new-tokens": small,
                          "--scoring": st.sampled_from(["choice", "loglik", "generate", "rank"]),
                          "--shard": st.sampled_from(["0/2", "1/2", "2/2", "-1/2", "1", "a/b", "0/0"]),
                          "--dtype": st.sampled_from(["float32", "bfloat16", "float16", "int8", "torch.float32", ""]),
                          "--device": st.sampled_from(["cpu", "cuda", "cuda:1", "banana", "mps", "meta", ""]),
                          "--backend": st.sampled_from(["transformers", "vllm", "tf"]),
                          "--template": st.sampled_from(["ours", "paper"]), "--tensor-parallel": small})
diagnose_options = _options({"--depths": fractions, "--seeds": numbers, "--lengths": numbers, "--orders": small,
                             "--limit": small, "--max-prompt-tokens": small, "--max-new-tokens": small,
                             "--batch-size": small, "--scoring": st.sampled_from(["generate", "choice", "loglik"]),
                             "--adversarial": st.sampled_from(["", "outdated", "outdated,outdated", "x", ",,"]),
                             "--primary": st.sampled_from(["accuracy", "margin", "loglik"]),
                             "--dtype": st.sampled_from(["float32", "int8"]),
                             "--device": st.sampled_from(["cpu", "banana"])})


def _prepared(argv):
    from litm.cli import prepare

    try:
        work = prepare(argv)
    except LitmError:
        return None
    assert callable(work)
    return work


@EXAMPLES
@given(options=sweep_options)
def test_sweep_command_lines(folder, options):
    _prepared(["sweep", "--task", "kv", *options, "--results", str(folder / "res"), "--model", "smollm2-135m"])


@EXAMPLES
@given(options=diagnose_options)
def test_diagnose_command_lines(folder, options):
    _prepared(["diagnose", str(CASES), *options, "--results", str(folder / "d"), "--out", str(folder / "o")])
