"""Reading Liu et al.'s data files, moving the gold document, and the seeded offline generators.

The fixture records follow the paper's schema (as written by its make_qa_data_from_retrieval_results.py
and make_kv_retrieval_data.py): distractor ctxs carry id, score (a string), hasanswer,
original_retrieval_index and isgold; the gold ctx carries only title, text, hasanswer and isgold.
All expected Examples are written out by hand.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from litm.data import (fictional_qa_records, generate_fictional_qa, generate_kv, kv_records, read_examples,
                       stream_examples)
from litm.errors import ConfigError, DataError
from litm.ordering import gold_at, with_num_documents
from litm.types import Document, Example

# ------------------------------------------------------------------------------------ fixtures
QA_RECORDS = [
    {
        "question": "who wrote the novel moby dick",
        "answers": ["Herman Melville", "Melville"],
        "ctxs": [
            {"id": "9001", "title": "Nantucket", "text": "Nantucket is an island south of Cape Cod.",
             "score": "1.25", "hasanswer": False, "original_retrieval_index": 0, "isgold": False},
            {"title": "Moby-Dick", "text": "Moby-Dick is an 1851 novel by Herman Melville.",
             "hasanswer": True, "isgold": True},
            {"id": "42", "title": "Whaling", "text": "Whaling is the hunting of whales.",
             "score": "0.5", "hasanswer": False, "original_retrieval_index": 3, "isgold": False},
        ],
        "nq_annotated_gold": {"title": "Moby-Dick", "long_answer": "Moby-Dick is an 1851 novel by Herman Melville.",
                              "chunked_long_answer": "Moby-Dick is an 1851 novel by Herman Melville.",
                              "short_answers": ["Herman Melville"]},
    },
    {
        "question": "what is the capital of france",
        "answers": ["Paris"],
        "ctxs": [
            {"title": "Paris", "text": "Paris is the capital of France.", "hasanswer": True, "isgold": True},
            {"id": "7", "title": "Lyon", "text": "Lyon is a city in France.",
             "score": "-2.75", "hasanswer": False, "original_retrieval_index": 1, "isgold": False},
            {"id": "8", "title": "Marseille", "text": "Marseille is a port city.",
             "score": "3", "hasanswer": False, "original_retrieval_index": 2, "isgold": False},
        ],
        "nq_annotated_gold": {"title": "Paris", "long_answer": "Paris is the capital of France.",
                              "chunked_long_answer": "Paris is the capital of France.", "short_answers": ["Paris"]},
    },
]

ORACLE_RECORDS = [
    {"question": "who wrote the novel moby dick", "answers": ["Herman Melville"],
     "ctxs": [{"title": "Moby-Dick", "text": "Moby-Dick is an 1851 novel by Herman Melville.",
               "hasanswer": True, "isgold": True}],
     "nq_annotated_gold": {"title": "Moby-Dick", "long_answer": "x", "chunked_long_answer": "x",
                           "short_answers": ["Herman Melville"]}},
]

KV_RECORDS = [
    {"ordered_kv_records": [["aaaa-1", "vvvv-1"], ["bbbb-2", "vvvv-2"], ["cccc-3", "vvvv-3"]],
     "key": "bbbb-2", "value": "vvvv-2"},
    {"ordered_kv_records": [["dddd-4", "vvvv-4"], ["eeee-5", "vvvv-5"], ["ffff-6", "vvvv-6"]],
     "key": "ffff-6", "value": "vvvv-6"},
]


def expected_qa(name: str) -> list[Example]:
    e1, e2 = f"{name}#1", f"{name}#2"
    return [
        Example(id=e1, question="who wrote the novel moby dick", answers=("Herman Melville", "Melville"), task="qa",
                documents=(
                    Document("9001", "Nantucket", "Nantucket is an island south of Cape Cod.", False, 1.25, None),
                    Document(f"{e1}-ctx1", "Moby-Dick", "Moby-Dick is an 1851 novel by Herman Melville.", True, None,
                             "Herman Melville"),
                    Document("42", "Whaling", "Whaling is the hunting of whales.", False, 0.5, None),
                )),
        Example(id=e2, question="what is the capital of france", answers=("Paris",), task="qa",
                documents=(
                    Document(f"{e2}-ctx0", "Paris", "Paris is the capital of France.", True, None, "Paris"),
                    Document("7", "Lyon", "Lyon is a city in France.", False, -2.75, None),
                    Document("8", "Marseille", "Marseille is a port city.", False, 3.0, None),
                )),
    ]


def expected_kv(name: str) -> list[Example]:
    return [
        Example(id=f"{name}#1", question="bbbb-2", answers=("vvvv-2",), task="kv", documents=(
            Document("aaaa-1", "aaaa-1", "vvvv-1", False, None, "vvvv-1"),
            Document("bbbb-2", "bbbb-2", "vvvv-2", True, None, "vvvv-2"),
            Document("cccc-3", "cccc-3", "vvvv-3", False, None, "vvvv-3"))),
        Example(id=f"{name}#2", question="ffff-6", answers=("vvvv-6",), task="kv", documents=(
            Document("dddd-4", "dddd-4", "vvvv-4", False, None, "vvvv-4"),
            Document("eeee-5", "eeee-5", "vvvv-5", False, None, "vvvv-5"),
            Document("ffff-6", "ffff-6", "vvvv-6", True, None, "vvvv-6"))),
    ]


def write_lines(path: Path, lines: list[str]) -> Path:
    data = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def write_records(path: Path, records: list[dict]) -> Path:
    return write_lines(path, [json.dumps(r) for r in records])


# ------------------------------------------------------------------------------------ reading
@pytest.mark.parametrize("name", ["nq-open-3_total_documents.jsonl", "nq-open-3_total_documents.jsonl.gz"])
def test_read_qa_exactly(tmp_path, name):
    path = write_records(tmp_path / name, QA_RECORDS)
    got = read_examples(path, "qa")
    want = expected_qa(name)
    assert got == want
    # field by field as well, so a failure says what differs
    for g, w in zip(got, want):
        assert g.id == w.id
        assert g.question == w.question
        assert g.answers == w.answers
        assert [d.title for d in g.documents] == [d.title for d in w.documents]
        assert [d.is_gold for d in g.documents] == [d.is_gold for d in w.documents]
        assert [d.score for d in g.documents] == [d.score for d in w.documents]
        assert all(isinstance(d.score, float) for d in g.documents if d.score is not None)
    assert got[0].gold_index == 1 and got[1].gold_index == 0
    assert got[0].meta["nq_annotated_gold"]["short_answers"] == ["Herman Melville"]
    assert got[1].meta["nq_annotated_gold"]["title"] == "Paris"


def test_read_accepts_str_path(tmp_path):
    path = write_records(tmp_path / "qa.jsonl", QA_RECORDS)
    assert read_examples(str(path), "qa") == expected_qa("qa.jsonl")


@pytest.mark.parametrize("name", ["nq-open-oracle.jsonl", "nq-open-oracle.jsonl.gz"])
def test_read_oracle_file(tmp_path, name):
    path = write_records(tmp_path / name, ORACLE_RECORDS)
    (ex,) = read_examples(path, "qa")
    assert ex == Example(id=f"{name}#1", question="who wrote the novel moby dick", answers=("Herman Melville",),
                         task="qa", documents=(Document(f"{name}#1-ctx0", "Moby-Dick",
                                                        "Moby-Dick is an 1851 novel by Herman Melville.",
                                                        True, None, "Herman Melville"),))
    assert ex.gold_index == 0


@pytest.mark.parametrize("name", ["kv-retrieval-3_keys.jsonl", "kv-retrieval-3_keys.jsonl.gz"])
def test_read_kv_exactly(tmp_path, name):
    path = write_records(tmp_path / name, KV_RECORDS)
    got = read_examples(path, "kv")
    assert got == expected_kv(name)
    assert got[0].gold_index == 1 and got[0].gold.title == "bbbb-2" and got[0].gold.text == "vvvv-2"
    assert got[1].gold_index == 2 and got[1].gold.text == "vvvv-6"


def test_blank_lines_are_skipped_and_ids_count_records(tmp_path):
    path = write_lines(tmp_path / "kv.jsonl", [json.dumps(KV_RECORDS[0]), "", "   ", json.dumps(KV_RECORDS[1])])
    got = read_examples(path, "kv")
    assert [e.id for e in got] == ["kv.jsonl#1", "kv.jsonl#2"]
    assert [e.question for e in got] == ["bbbb-2", "ffff-6"]


def test_limit(tmp_path):
    path = write_records(tmp_path / "qa.jsonl", QA_RECORDS)
    got = read_examples(path, "qa", limit=1)
    assert got == expected_qa("qa.jsonl")[:1]
    assert read_examples(path, "qa", limit=5) == expected_qa("qa.jsonl")


@pytest.mark.parametrize("name", ["qa.jsonl", "qa.jsonl.gz"])
def test_stream_gives_the_same_qa_examples(tmp_path, name):
    path = write_records(tmp_path / name, QA_RECORDS)
    assert list(stream_examples(path, "qa")) == expected_qa(name)


@pytest.mark.parametrize("name", ["kv.jsonl", "kv.jsonl.gz"])
def test_stream_gives_the_same_kv_examples(tmp_path, name):
    path = write_records(tmp_path / name, KV_RECORDS)
    assert list(stream_examples(path, "kv")) == expected_kv(name)


def test_stream_ids_match_read_with_blank_lines(tmp_path):
    path = write_lines(tmp_path / "kv.jsonl", [json.dumps(KV_RECORDS[0]), "", json.dumps(KV_RECORDS[1])])
    assert [e.id for e in read_examples(path, "kv")] == ["kv.jsonl#1", "kv.jsonl#2"]
    assert [e.id for e in stream_examples(path, "kv")] == ["kv.jsonl#1", "kv.jsonl#2"]


def test_stream_limit(tmp_path):
    path = write_records(tmp_path / "kv.jsonl", KV_RECORDS)
    assert list(stream_examples(path, "kv", limit=1)) == expected_kv("kv.jsonl")[:1]


# ------------------------------------------------------------------------------------ bad input
def _without(record: dict, field: str) -> dict:
    return {k: v for k, v in record.items() if k != field}


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl.gz"
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert str(path) in str(info.value)
    assert "litm fetch liu2023" in str(info.value)


def test_missing_file_stream(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as info:
        stream_examples(path, "qa")
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["qa.jsonl", "qa.jsonl.gz"])
def test_line_not_json_names_file_and_line(tmp_path, name):
    path = write_lines(tmp_path / name, [json.dumps(QA_RECORDS[0]), '{"question": "truncated', json.dumps(QA_RECORDS[1])])
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert f"{path}:2" in str(info.value)
    assert "JSON" in str(info.value)


def test_line_not_an_object(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", [json.dumps(QA_RECORDS[0]), "[1, 2, 3]"])
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert f"{path}:2" in str(info.value)


def test_line_not_json_stream(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", [json.dumps(QA_RECORDS[0]), "{not json"])
    with pytest.raises(DataError) as info:
        list(stream_examples(path, "qa"))
    assert "qa.jsonl" in str(info.value)


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "qa.jsonl.gz"
    path.write_bytes(b"this is not gzip data at all")
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert str(path) in str(info.value)


@pytest.mark.parametrize("field", ["question", "answers", "ctxs"])
def test_record_without_field(tmp_path, field):
    path = write_records(tmp_path / "qa.jsonl", [QA_RECORDS[0], _without(QA_RECORDS[1], field)])
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    msg = str(info.value)
    assert "qa.jsonl:2" in msg
    assert repr(field) in msg


def test_record_with_no_gold_document(tmp_path):
    rec = json.loads(json.dumps(QA_RECORDS[0]))
    rec["ctxs"][1]["isgold"] = False
    path = write_records(tmp_path / "qa.jsonl", [rec])
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert "qa.jsonl:1" in str(info.value)
    assert "isgold" in str(info.value)


def test_record_with_empty_ctxs(tmp_path):
    path = write_records(tmp_path / "qa.jsonl", [QA_RECORDS[0], QA_RECORDS[1], dict(QA_RECORDS[0], ctxs=[])])
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert "qa.jsonl:3" in str(info.value)
    assert "ctxs" in str(info.value)


def test_record_with_empty_answers(tmp_path):
    path = write_records(tmp_path / "qa.jsonl", [dict(QA_RECORDS[0], answers=[])])
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert "qa.jsonl:1" in str(info.value)


def test_ctx_score_not_a_number(tmp_path):
    rec = json.loads(json.dumps(QA_RECORDS[0]))
    rec["ctxs"][2]["score"] = "high"
    path = write_records(tmp_path / "qa.jsonl", [rec])
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert "qa.jsonl:1" in str(info.value) and "ctxs[2]" in str(info.value)


def test_kv_key_not_among_records(tmp_path):
    path = write_records(tmp_path / "kv.jsonl", [KV_RECORDS[0], dict(KV_RECORDS[1], key="zzzz-9")])
    with pytest.raises(DataError) as info:
        read_examples(path, "kv")
    assert "kv.jsonl:2" in str(info.value)
    assert "zzzz-9" in str(info.value)


def test_kv_value_does_not_match_stored_value(tmp_path):
    path = write_records(tmp_path / "kv.jsonl", [dict(KV_RECORDS[0], value="vvvv-1")])
    with pytest.raises(DataError) as info:
        read_examples(path, "kv")
    assert "kv.jsonl:1" in str(info.value)


def test_kv_duplicate_key(tmp_path):
    rec = {"ordered_kv_records": [["k", "v1"], ["k", "v2"]], "key": "k", "value": "v1"}
    path = write_records(tmp_path / "kv.jsonl", [rec])
    with pytest.raises(DataError, match="twice"):
        read_examples(path, "kv")


def test_qa_file_read_as_kv_names_missing_field(tmp_path):
    path = write_records(tmp_path / "qa.jsonl", QA_RECORDS)
    with pytest.raises(DataError) as info:
        read_examples(path, "kv")
    assert "qa.jsonl:1" in str(info.value) and "ordered_kv_records" in str(info.value)


def test_empty_file(tmp_path):
    path = write_lines(tmp_path / "qa.jsonl", [""])
    with pytest.raises(DataError) as info:
        read_examples(path, "qa")
    assert str(path) in str(info.value)


def test_unknown_task(tmp_path):
    path = write_records(tmp_path / "qa.jsonl", QA_RECORDS)
    with pytest.raises(DataError):
        read_examples(path, "summarisation")


@pytest.mark.parametrize("limit", [0, -1])
def test_limit_below_one(tmp_path, limit):
    path = write_records(tmp_path / "qa.jsonl", QA_RECORDS)
    with pytest.raises(DataError, match="limit"):
        read_examples(path, "qa", limit=limit)
    with pytest.raises(DataError, match="limit"):
        list(stream_examples(path, "qa", limit=limit))


# ------------------------------------------------------------------------------------ ordering
def _doc(i: str, gold: bool = False) -> Document:
    return Document(id=i, title=f"T{i}", text=f"text {i}", is_gold=gold)


def _example(ids: list[str], gold: str) -> Example:
    return Example(id="ex", question="q?", answers=("a",), task="qa",
                   documents=tuple(_doc(i, i == gold) for i in ids))


@pytest.mark.parametrize("position, expected", [
    (0, ["G", "d1", "d2", "d3", "d4"]),
    (1, ["d1", "G", "d2", "d3", "d4"]),
    (2, ["d1", "d2", "G", "d3", "d4"]),
    (3, ["d1", "d2", "d3", "G", "d4"]),
    (4, ["d1", "d2", "d3", "d4", "G"]),
])
@pytest.mark.parametrize("start", [
    ["G", "d1", "d2", "d3", "d4"],
    ["d1", "d2", "G", "d3", "d4"],
    ["d1", "d2", "d3", "d4", "G"],
])
def test_gold_at_keeps_distractor_order(start, position, expected):
    ex = _example(start, "G")
    moved = gold_at(ex, position)
    assert [d.id for d in moved.documents] == expected
    assert moved.gold_index == position
    assert moved.gold.id == "G"
    assert (moved.id, moved.question, moved.answers, moved.task) == (ex.id, ex.question, ex.answers, ex.task)
    assert [d.id for d in ex.documents] == start  # the input is untouched


@pytest.mark.parametrize("position", [-1, 5, 100])
def test_gold_at_out_of_range(position):
    with pytest.raises(ConfigError):
        gold_at(_example(["G", "d1", "d2", "d3", "d4"], "G"), position)


def test_gold_at_on_read_examples(tmp_path):
    path = write_records(tmp_path / "qa.jsonl", QA_RECORDS)
    ex = read_examples(path, "qa")[0]  # Nantucket, [gold], Whaling
    assert [d.title for d in gold_at(ex, 0).documents] == ["Moby-Dick", "Nantucket", "Whaling"]
    assert [d.title for d in gold_at(ex, 2).documents] == ["Nantucket", "Whaling", "Moby-Dick"]


@pytest.mark.parametrize("num, expected", [
    (1, ["G"]),
    (2, ["d1", "G"]),
    (3, ["d1", "d2", "G"]),
    (4, ["d1", "d2", "G", "d3"]),
    (5, ["d1", "d2", "G", "d3", "d4"]),
])
def test_with_num_documents(num, expected):
    ex = _example(["d1", "d2", "G", "d3", "d4"], "G")
    got = with_num_documents(ex, num)
    assert [d.id for d in got.documents] == expected
    assert got.gold.id == "G"


def test_with_num_documents_gold_last():
    ex = _example(["d1", "d2", "d3", "G"], "G")
    assert [d.id for d in with_num_documents(ex, 2).documents] == ["d1", "G"]
    assert [d.id for d in with_num_documents(ex, 3).documents] == ["d1", "d2", "G"]


@pytest.mark.parametrize("num", [0, -2, 6])
def test_with_num_documents_out_of_range(num):
    with pytest.raises(ConfigError):
        with_num_documents(_example(["d1", "d2", "G", "d3", "d4"], "G"), num)


# ------------------------------------------------------------------------------------ generators
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_kv_records_schema_and_gold_index():
    recs = kv_records(40, 6, seed=5)
    assert len(recs) == 40
    positions = set()
    for r in recs:
        assert set(r) == {"ordered_kv_records", "key", "value"}
        pairs = r["ordered_kv_records"]
        assert len(pairs) == 6
        keys = [k for k, _ in pairs]
        assert len(set(keys)) == 6
        for k, v in pairs:
            assert UUID_RE.match(k), k
            assert UUID_RE.match(v), v
        assert keys.count(r["key"]) == 1
        idx = keys.index(r["key"])
        assert pairs[idx][1] == r["value"]
        positions.add(idx)
    # 40 draws from 6 positions: all positions appear unless the index is not random (p of a miss < 1e-2)
    assert len(positions) >= 5


def test_kv_records_deterministic():
    assert kv_records(3, 4, seed=1) == kv_records(3, 4, seed=1)
    assert kv_records(3, 4, seed=1) != kv_records(3, 4, seed=2)


def test_generate_kv_matches_records():
    recs = kv_records(5, 4, seed=9)
    exs = generate_kv(5, 4, seed=9)
    assert len(exs) == 5
    for r, ex in zip(recs, exs):
        assert ex.task == "kv"
        assert ex.question == r["key"]
        assert ex.answers == (r["value"],)
        assert [(d.title, d.text) for d in ex.documents] == [tuple(p) for p in r["ordered_kv_records"]]
        assert [d.answer for d in ex.documents] == [p[1] for p in r["ordered_kv_records"]]
        keys = [p[0] for p in r["ordered_kv_records"]]
        assert ex.gold_index == keys.index(r["key"])
        assert sum(d.is_gold for d in ex.documents) == 1
        assert ex.gold.text == r["value"]
    assert len({ex.id for ex in exs}) == 5


def test_generate_kv_deterministic():
    assert generate_kv(3, 5, seed=0) == generate_kv(3, 5, seed=0)
    assert generate_kv(3, 5, seed=0) != generate_kv(3, 5, seed=1)


def test_generate_kv_prefix_stable():
    assert generate_kv(7, 4, seed=2)[:4] == generate_kv(4, 4, seed=2)


@pytest.mark.parametrize("n, k", [(0, 4), (2, 1)])
def test_generate_kv_bad_sizes(n, k):
    with pytest.raises(ConfigError):
        generate_kv(n, k)


def _entity(doc: Document) -> str:
    # titles are "<entity> (<kind>)"
    assert doc.title.endswith(")") and " (" in doc.title
    return doc.title.rsplit(" (", 1)[0]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_fictional_qa_properties(seed):
    exs = generate_fictional_qa(12, 6, seed=seed)
    assert len(exs) == 12
    for ex in exs:
        assert ex.task == "qa"
        assert len(ex.documents) == 6
        assert [d.is_gold for d in ex.documents] == [True, False, False, False, False, False]
        (answer,) = ex.answers
        assert ex.gold.answer == answer
        doc_answers = [d.answer for d in ex.documents]
        assert all(isinstance(a, str) and a for a in doc_answers)
        assert len(set(doc_answers)) == 6, doc_answers
        entities = [_entity(d) for d in ex.documents]
        assert len(set(entities)) == 6
        assert answer in ex.gold.text
        for d in ex.documents[1:]:
            assert answer not in d.text, (answer, d.text)
            assert d.answer in d.text  # each distractor states its own fact
        assert entities[0] in ex.question
        assert ex.question.endswith("?")
        assert len({d.id for d in ex.documents}) == 6


def test_fictional_qa_sentences_per_doc():
    ex = generate_fictional_qa(1, 3, seed=4, sentences_per_doc=1)[0]
    for d in ex.documents:
        assert d.text.count(". ") == 0 and d.text.endswith(".")  # exactly the fact sentence
        assert d.answer in d.text


def test_fictional_qa_deterministic():
    assert generate_fictional_qa(4, 5, seed=3) == generate_fictional_qa(4, 5, seed=3)
    assert generate_fictional_qa(4, 5, seed=3) != generate_fictional_qa(4, 5, seed=4)


def test_fictional_qa_prefix_stable():
    n = 6
    short, long = generate_fictional_qa(n, 5, seed=11), generate_fictional_qa(n + 5, 5, seed=11)
    assert len(long) == n + 5
    assert long[:n] == short
    assert [[d.answer for d in e.documents] for e in long[:n]] == [[d.answer for d in e.documents] for e in short]


def test_fictional_qa_records_round_trip_through_reader(tmp_path):
    recs = fictional_qa_records(3, 4, seed=2)
    path = write_records(tmp_path / "fqa.jsonl.gz", recs)
    got = read_examples(path, "qa")
    gen = generate_fictional_qa(3, 4, seed=2)
    for g, e in zip(got, gen):
        assert g.question == e.question and g.answers == e.answers
        assert [(d.id, d.title, d.text, d.is_gold) for d in g.documents] == \
               [(d.id, d.title, d.text, d.is_gold) for d in e.documents]


def test_fictional_qa_bad_sizes():
    with pytest.raises(ConfigError):
        generate_fictional_qa(0, 3)
    with pytest.raises(ConfigError):
        generate_fictional_qa(2, 0)


def test_adversarial_distractors_conflict_with_the_gold():
    from litm.data import generate_fictional_qa

    plain = generate_fictional_qa(3, 6, seed=2)
    adv = generate_fictional_qa(3, 6, seed=2, adversarial=("outdated", "other_region", "contradicting"))
    for p, e in zip(plain, adv):
        assert e.question == p.question and e.answers == p.answers and e.gold.text == p.gold.text
        assert e.documents[1:3] == p.documents[1:3]
        gold_entity = e.gold.title.split(" (")[0]
        kinds = {d.kind: d for d in e.documents if d.kind}
        assert set(kinds) == {"outdated", "other_region", "contradicting"}
        assert [d.kind for d in e.documents[:3]] == [None] * 3  # the first distractors stay ordinary
        answers = [d.answer for d in e.documents]
        assert len(set(answers)) == len(answers)  # every document supports its own answer
        for kind, d in kinds.items():
            assert d.answer in d.text and e.answers[0] not in d.text
        # outdated and contradicting speak of the gold's own entity; other_region of a near-identical one
        assert kinds["outdated"].text.count(gold_entity) >= 1 and kinds["contradicting"].title.startswith(gold_entity)
        region, _, rest = kinds["other_region"].title.partition(" ")
        assert rest.startswith(gold_entity + " (") and region in ("North", "South", "East", "West", "Upper",
                                                                    "Lower", "New", "Old")
        # versions: the gold is the newer one, the outdated one says so
        gv = int(e.gold.title.split("version 2, ")[1].rstrip("]"))
        ov = int(kinds["outdated"].title.split("version 1, ")[1].split(",")[0])
        assert ov < gv and "superseded" in kinds["outdated"].title


def test_adversarial_needs_room_and_known_kinds():
    from litm.data import generate_fictional_qa

    with pytest.raises(ConfigError, match="at least 4 documents"):
        generate_fictional_qa(1, 3, adversarial=("outdated", "other_region", "contradicting"))
    with pytest.raises(ConfigError, match="adversarial kinds"):
        generate_fictional_qa(1, 6, adversarial=("outdated", "misleading"))
