"""Prompt rendering: exact texts for each variant, the paper's template files, and the token manifest.

Expected prompt strings are written out by hand.  The manifest checks use a tiny byte-level BPE
tokenizer trained in memory (no model download), with and without a small chat template.
"""
from __future__ import annotations

import json
import random
import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from litm.errors import ConfigError, DataError
from litm.data import generate_fictional_qa
from litm.ordering import gold_at
from litm.prompts import Manifest, Prompt, Variant, render, render_text
from litm.types import Document, Example

# ------------------------------------------------------------------------------------ examples
QA = Example(
    id="qa-1", question="who wrote moby dick", answers=("Herman Melville",), task="qa",
    documents=(
        Document("d1", "Nantucket", "Nantucket is an island south of Cape Cod."),
        Document("g", "Moby-Dick", "Moby-Dick is an 1851 novel by Herman Melville.", is_gold=True,
                 answer="Herman Melville"),
    ))

K1, V1 = "2a8f3c1e-6b7d-4e90-a1b2-c3d4e5f60718", "0f9e8d7c-6b5a-4493-8271-605f4e3d2c1b"
K2, V2 = "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e", "d1e2f3a4-b5c6-47d8-99e0-f1a2b3c4d5e6"
K3, V3 = "e5d4c3b2-a190-4f8e-b7d6-c5b4a3928170", "13579bdf-2468-4ace-8024-68ace0246813"
KV = Example(
    id="kv-1", question=K2, answers=(V2,), task="kv",
    documents=(Document(K1, K1, V1, answer=V1), Document(K2, K2, V2, is_gold=True, answer=V2),
               Document(K3, K3, V3, answer=V3)))

QA_INTRO = ("Use only the search results below to answer the question. "
            "Some of the search results may not be relevant to it.\n\n")
LINE_NANTUCKET = "Document [1](Title: Nantucket) Nantucket is an island south of Cape Cod."
LINE_MOBY_2 = "Document [2](Title: Moby-Dick) Moby-Dick is an 1851 novel by Herman Melville."

EXPECTED_QA = (
    "Use only the search results below to answer the question. Some of the search results may not be relevant "
    "to it.\n"
    "\n"
    "Document [1](Title: Nantucket) Nantucket is an island south of Cape Cod.\n"
    "Document [2](Title: Moby-Dick) Moby-Dick is an 1851 novel by Herman Melville.\n"
    "\n"
    "Question: who wrote moby dick\n"
    "Answer:")

EXPECTED_QA_QUERY_AWARE = (
    "Use only the search results below to answer the question. Some of the search results may not be relevant "
    "to it.\n"
    "\n"
    "Question: who wrote moby dick\n"
    "\n"
    "Document [1](Title: Nantucket) Nantucket is an island south of Cape Cod.\n"
    "Document [2](Title: Moby-Dick) Moby-Dick is an 1851 novel by Herman Melville.\n"
    "\n"
    "Question: who wrote moby dick\n"
    "Answer:")

EXPECTED_QA_CLOSEDBOOK = "Answer the question below.\n\nQuestion: who wrote moby dick\nAnswer:"

EXPECTED_QA_ORACLE = (
    "Use only the search results below to answer the question. Some of the search results may not be relevant "
    "to it.\n"
    "\n"
    "Document [1](Title: Moby-Dick) Moby-Dick is an 1851 novel by Herman Melville.\n"
    "\n"
    "Question: who wrote moby dick\n"
    "Answer:")

EXPECTED_KV_BLOCK = (
    '{"2a8f3c1e-6b7d-4e90-a1b2-c3d4e5f60718": "0f9e8d7c-6b5a-4493-8271-605f4e3d2c1b",\n'
    ' "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e": "d1e2f3a4-b5c6-47d8-99e0-f1a2b3c4d5e6",\n'
    ' "e5d4c3b2-a190-4f8e-b7d6-c5b4a3928170": "13579bdf-2468-4ace-8024-68ace0246813"}')

EXPECTED_KV = (
    "The JSON object below maps keys to values. Find the value stored under the given key.\n"
    "\n"
    "JSON data:\n"
    '{"2a8f3c1e-6b7d-4e90-a1b2-c3d4e5f60718": "0f9e8d7c-6b5a-4493-8271-605f4e3d2c1b",\n'
    ' "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e": "d1e2f3a4-b5c6-47d8-99e0-f1a2b3c4d5e6",\n'
    ' "e5d4c3b2-a190-4f8e-b7d6-c5b4a3928170": "13579bdf-2468-4ace-8024-68ace0246813"}\n'
    "\n"
    'Key: "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e"\n'
    "Corresponding value:")

EXPECTED_KV_QUERY_AWARE = (
    "The JSON object below maps keys to values. Find the value stored under the given key.\n"
    "\n"
    'Key: "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e"\n'
    "\n"
    "JSON data:\n"
    '{"2a8f3c1e-6b7d-4e90-a1b2-c3d4e5f60718": "0f9e8d7c-6b5a-4493-8271-605f4e3d2c1b",\n'
    ' "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e": "d1e2f3a4-b5c6-47d8-99e0-f1a2b3c4d5e6",\n'
    ' "e5d4c3b2-a190-4f8e-b7d6-c5b4a3928170": "13579bdf-2468-4ace-8024-68ace0246813"}\n'
    "\n"
    'Key: "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e"\n'
    "Corresponding value:")

EXPECTED_KV_CLOSEDBOOK = ('Give the value stored under the key below.\n\n'
                          'Key: "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e"\nCorresponding value:')


# ------------------------------------------------------------------------------------ render_text
def test_qa_text():
    text, shown, doc_spans, q_spans, name = render_text(QA, Variant())
    assert text == EXPECTED_QA
    assert name == "qa"
    assert [d.id for d in shown] == ["d1", "g"]
    assert [text[s:e] for s, e in doc_spans] == [LINE_NANTUCKET, LINE_MOBY_2]
    assert [text[s:e] for s, e in q_spans] == ["who wrote moby dick"]


def test_default_variant_is_ours_documents():
    assert render_text(QA)[0] == EXPECTED_QA


def test_qa_query_aware_text():
    text, shown, doc_spans, q_spans, name = render_text(QA, Variant(query_aware=True))
    assert text == EXPECTED_QA_QUERY_AWARE
    assert name == "qa_with_query_aware_contextualization"
    assert [text[s:e] for s, e in doc_spans] == [LINE_NANTUCKET, LINE_MOBY_2]
    assert len(q_spans) == 2
    assert [text[s:e] for s, e in q_spans] == ["who wrote moby dick"] * 2
    assert q_spans[0][1] < doc_spans[0][0] < doc_spans[-1][1] < q_spans[1][0]


def test_qa_closedbook_text():
    text, shown, doc_spans, q_spans, name = render_text(QA, Variant(condition="closedbook"))
    assert text == EXPECTED_QA_CLOSEDBOOK
    assert name == "closedbook_qa"
    assert tuple(shown) == ()
    assert list(doc_spans) == []
    assert [text[s:e] for s, e in q_spans] == ["who wrote moby dick"]


def test_qa_oracle_text_shows_only_the_gold():
    text, shown, doc_spans, _, name = render_text(QA, Variant(condition="oracle"))
    assert text == EXPECTED_QA_ORACLE
    assert name == "qa"
    assert [d.id for d in shown] == ["g"]
    assert [text[s:e] for s, e in doc_spans] == ["Document [1](Title: Moby-Dick) Moby-Dick is an 1851 novel by "
                                                  "Herman Melville."]


def test_document_numbering_follows_the_order():
    text = render_text(gold_at(QA, 0))[0]
    assert text == (QA_INTRO + "Document [1](Title: Moby-Dick) Moby-Dick is an 1851 novel by Herman Melville.\n"
                    "Document [2](Title: Nantucket) Nantucket is an island south of Cape Cod.\n\n"
                    "Question: who wrote moby dick\nAnswer:")


def test_kv_text():
    text, shown, pair_spans, q_spans, name = render_text(KV, Variant())
    assert text == EXPECTED_KV
    assert name == "kv_retrieval"
    # the JSON block: "{" first, one leading space on later lines, ",\n" between pairs, "}" at the end
    block = text.split("JSON data:\n", 1)[1].split("\n\nKey:", 1)[0]
    assert block == EXPECTED_KV_BLOCK
    lines = block.split("\n")
    assert len(lines) == 3
    assert lines[0].startswith('{"') and not lines[0].startswith("{ ")
    assert all(line.startswith(' "') and not line.startswith('  ') for line in lines[1:])
    assert all(line.endswith('",') for line in lines[:-1]) and lines[-1].endswith('"}')
    assert block.count(",\n") == 2
    assert json.loads(block) == {K1: V1, K2: V2, K3: V3}
    assert [text[s:e] for s, e in pair_spans] == [f'"{K1}": "{V1}"', f'"{K2}": "{V2}"', f'"{K3}": "{V3}"']
    assert [text[s:e] for s, e in q_spans] == [K2]


def test_kv_single_pair_block():
    ex = Example("kv-2", K1, (V1,), (Document(K1, K1, V1, is_gold=True),), "kv")
    text = render_text(ex)[0]
    assert f'JSON data:\n{{"{K1}": "{V1}"}}\n\nKey:' in text


def test_kv_query_aware_text():
    text, _, _, q_spans, name = render_text(KV, Variant(query_aware=True))
    assert text == EXPECTED_KV_QUERY_AWARE
    assert name == "kv_retrieval_with_query_aware_contextualization"
    assert [text[s:e] for s, e in q_spans] == [K2, K2]


def test_kv_closedbook_text():
    text, shown, _, _, name = render_text(KV, Variant(condition="closedbook"))
    assert text == EXPECTED_KV_CLOSEDBOOK
    assert name == "closedbook_kv_retrieval"
    assert tuple(shown) == ()


def test_unknown_condition_and_family():
    with pytest.raises(ConfigError):
        render_text(QA, Variant(condition="shuffled"))
    with pytest.raises(ConfigError):
        render_text(QA, Variant(template="mine"))


def test_no_documents_is_a_data_error_except_closedbook():
    empty = Example("e", "q", ("a",), (), "qa")
    with pytest.raises(DataError):
        render_text(empty, Variant())
    assert render_text(empty, Variant(condition="closedbook"))[0] == "Answer the question below.\n\nQuestion: q\nAnswer:"


# ------------------------------------------------------------------------------------ paper templates
PAPER_QA = ("Write a high-quality answer for the given question using only the provided search results "
            "(some of which might be irrelevant).\n\n{search_results}\n\nQuestion: {question}\nAnswer:")


def _write_paper_template(root, name: str, body: str):
    d = root / "src" / "lost_in_the_middle" / "prompts"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.prompt").write_text(body, encoding="utf-8")


def test_paper_template_read_verbatim_trailing_newline_stripped(tmp_path):
    _write_paper_template(tmp_path, "qa", PAPER_QA + "\n")
    text, _, doc_spans, _, name = render_text(QA, Variant(template="paper", template_dir=str(tmp_path)))
    assert text == ("Write a high-quality answer for the given question using only the provided search results "
                    "(some of which might be irrelevant).\n\n"
                    "Document [1](Title: Nantucket) Nantucket is an island south of Cape Cod.\n"
                    "Document [2](Title: Moby-Dick) Moby-Dick is an 1851 novel by Herman Melville.\n\n"
                    "Question: who wrote moby dick\nAnswer:")
    assert name == "qa"
    assert [text[s:e] for s, e in doc_spans] == [LINE_NANTUCKET, LINE_MOBY_2]


def test_paper_template_keeps_everything_but_trailing_newlines(tmp_path):
    # read as the paper reads it: f.read().rstrip("\n") -- leading text and trailing spaces stay
    _write_paper_template(tmp_path, "qa_with_query_aware_contextualization",
                          "  Indented.\n{question}\n{search_results}\nQ: {question}\nAnswer: \n\n")
    text = render_text(QA, Variant(template="paper", template_dir=str(tmp_path), query_aware=True))[0]
    assert text == ("  Indented.\nwho wrote moby dick\n" + LINE_NANTUCKET + "\n" + LINE_MOBY_2 +
                    "\nQ: who wrote moby dick\nAnswer: ")


def test_paper_kv_template(tmp_path):
    _write_paper_template(tmp_path, "kv_retrieval",
                          "Extract the value.\n\nJSON data:\n{formatted_kv_records}\n\nKey: \"{key}\"\n"
                          "Corresponding value:\n")
    text = render_text(KV, Variant(template="paper", template_dir=str(tmp_path)))[0]
    assert text == ("Extract the value.\n\nJSON data:\n" + EXPECTED_KV_BLOCK +
                    '\n\nKey: "7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e"\nCorresponding value:')


def test_missing_paper_template(tmp_path):
    with pytest.raises(DataError) as info:
        render_text(QA, Variant(template="paper", template_dir=str(tmp_path)))
    msg = str(info.value)
    assert "python -m litm fetch liu2023" in msg
    assert "qa.prompt" in msg


def test_paper_has_no_closedbook_kv(tmp_path):
    with pytest.raises(ConfigError):
        render_text(KV, Variant(condition="closedbook", template="paper", template_dir=str(tmp_path)))


def test_template_with_unknown_field_is_rejected(tmp_path):
    _write_paper_template(tmp_path, "qa", "{search_results}\n{context}\n")
    with pytest.raises(ConfigError):
        render_text(QA, Variant(template="paper", template_dir=str(tmp_path)))


# ------------------------------------------------------------------------------------ tiny tokenizer
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CHAT_PREFIX = "<s><|user|>\n"
CHAT_SUFFIX = "</s>\n<|assistant|>\n"

_WORDS = ("the a of island novel by document title question answer search results use only below some may "
          "not be relevant to it who wrote what is capital south cape cod herman melville moby dick nantucket "
          "json object maps keys values find value stored under given key corresponding data river city "
          "north west east old new").split()


def _corpus(n: int = 400) -> list[str]:
    rng = random.Random(1234)
    out = []
    for i in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        if i % 3 == 0:
            words[0] = words[0].capitalize()
        s = " ".join(words) + rng.choice([".", "?", ":", ","])
        if i % 5 == 0:
            s = f"Document [{rng.randint(1, 30)}](Title: {s}"
        if i % 7 == 0:
            s += f' {{"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}": "{rng.getrandbits(32):08x}"}}\n'
        out.append(s)
    return out


def _backend() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def _wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(backend.to_str()), bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>", clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module")
def tokenizers_pair():
    backend = _backend()
    plain = _wrap(backend)
    chat = _wrap(backend)
    chat.chat_template = CHAT_TEMPLATE
    return plain, chat


@pytest.fixture(scope="module")
def tok(tokenizers_pair):
    return tokenizers_pair[0]


@pytest.fixture(scope="module")
def chat_tok(tokenizers_pair):
    return tokenizers_pair[1]


def test_tiny_tokenizer_is_sane(tok):
    # guards the fixture: fast, adds one BOS, and decodes back to the input text
    assert tok.is_fast
    ids = tok("who wrote moby dick")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids[1:]) == "who wrote moby dick"


# ------------------------------------------------------------------------------------ manifest
FOUR = Example(
    id="qa-4", question="what is the capital of the island", answers=("Port Wen",), task="qa",
    documents=(
        Document("g4", "Island", "The capital of the island is Port Wen.", is_gold=True, answer="Port Wen"),
        Document("a4", "River", "The river runs north of the old city."),
        Document("b4", "Cape", "Cape Cod is south of the island."),
        Document("c4", "Novel", "Some novel was written by someone."),
    ))


def _lines(ex: Example) -> list[str]:
    return [f"Document [{i + 1}](Title: {d.title}) {d.text}" for i, d in enumerate(ex.documents)]


def _check_spans(prompt: Prompt, tokenizer, rendered: list[str]):
    m = prompt.manifest
    ids = list(prompt.input_ids)
    assert m.num_tokens == len(ids)
    assert len(m.doc_spans) == len(rendered)
    for (s, e), line in zip(m.doc_spans, rendered):
        assert 0 <= s < e <= len(ids)
        assert line in tokenizer.decode(ids[s:e]), (line, tokenizer.decode(ids[s:e]))
    for (s1, e1), (s2, e2) in zip(m.doc_spans, m.doc_spans[1:]):
        assert e1 <= s2  # increasing and non-overlapping
    assert [prompt.text[s:e] for s, e in m.doc_char_spans] == rendered


@pytest.mark.parametrize("position", [0, 1, 2, 3])
def test_manifest_spans_and_gold(tok, position):
    ex = gold_at(FOUR, position)
    p = render(ex, tok, Variant())
    m = p.manifest
    assert isinstance(m, Manifest)
    assert p.example_id == "qa-4"
    assert p.text == QA_INTRO + "\n".join(_lines(ex)) + "\n\nQuestion: what is the capital of the island\nAnswer:"
    # ids are the tokenizer's own encoding of the text, with its BOS
    assert list(p.input_ids) == tok(p.text)["input_ids"]
    assert p.input_ids[0] == tok.bos_token_id
    _check_spans(p, tok, _lines(ex))
    assert m.doc_ids == tuple(d.id for d in ex.documents)
    assert m.gold_index == position
    assert m.doc_ids[m.gold_index] == "g4"
    assert m.gold_span == m.doc_spans[position]
    assert "Port Wen" in tok.decode(list(p.input_ids[m.gold_span[0]:m.gold_span[1]]))
    assert m.gold_rel_depth == pytest.approx(m.gold_span[0] / len(p.input_ids))
    assert 0 < m.gold_rel_depth < 1
    assert len(m.question_spans) == 1
    qs, qe = m.question_spans[0]
    assert "what is the capital of the island" in tok.decode(list(p.input_ids[qs:qe]))
    assert qs >= m.doc_spans[-1][1]
    assert m.template == "ours:qa"
    assert m.chat is False
    assert re.fullmatch(r"[0-9a-f]{64}", m.sha256)


def test_gold_depth_increases_with_position(tok):
    depths = [render(gold_at(FOUR, k), tok).manifest.gold_rel_depth for k in range(4)]
    assert depths == sorted(depths) and len(set(depths)) == 4


def test_sha256_stable_and_order_sensitive(tok):
    a = render(gold_at(FOUR, 1), tok)
    b = render(gold_at(FOUR, 1), tok)
    c = render(gold_at(FOUR, 2), tok)
    assert a.manifest.sha256 == b.manifest.sha256
    assert a.input_ids == b.input_ids
    assert a.manifest.sha256 != c.manifest.sha256


def test_manifest_to_dict(tok):
    m = render(gold_at(FOUR, 2), tok).manifest
    d = m.to_dict()
    assert d["gold_index"] == 2
    assert d["gold_span"] == list(m.doc_spans[2])
    assert d["doc_spans"] == [list(s) for s in m.doc_spans]
    assert d["num_tokens"] == m.num_tokens and d["sha256"] == m.sha256 and d["doc_format"] == "paper"
    json.dumps(d)  # serialisable


def test_manifest_kv(tok):
    p = render(KV, tok)
    _check_spans(p, tok, [f'"{K1}": "{V1}"', f'"{K2}": "{V2}"', f'"{K3}": "{V3}"'])
    assert p.manifest.gold_index == 1
    assert p.manifest.doc_ids == (K1, K2, K3)
    assert p.manifest.template == "ours:kv_retrieval"
    qs, qe = p.manifest.question_spans[0]
    assert K2 in tok.decode(list(p.input_ids[qs:qe]))


def test_manifest_query_aware(tok):
    p = render(gold_at(FOUR, 3), tok, Variant(query_aware=True))
    _check_spans(p, tok, _lines(gold_at(FOUR, 3)))
    (q1s, q1e), (q2s, q2e) = p.manifest.question_spans
    assert q1e <= p.manifest.doc_spans[0][0] and p.manifest.doc_spans[-1][1] <= q2s


def test_manifest_closedbook(tok):
    p = render(FOUR, tok, Variant(condition="closedbook"))
    m = p.manifest
    assert p.text == "Answer the question below.\n\nQuestion: what is the capital of the island\nAnswer:"
    assert m.doc_spans == () and m.doc_ids == ()
    assert m.gold_index is None and m.gold_span is None and m.gold_rel_depth is None
    assert m.num_tokens == len(p.input_ids)


def test_manifest_oracle(tok):
    p = render(gold_at(FOUR, 3), tok, Variant(condition="oracle"))
    _check_spans(p, tok, ["Document [1](Title: Island) The capital of the island is Port Wen."])
    assert p.manifest.gold_index == 0
    assert p.manifest.doc_ids == ("g4",)


def test_chat_template_wraps_the_prompt(tok, chat_tok):
    ex = gold_at(FOUR, 2)
    plain = render(ex, tok, Variant())
    p = render(ex, chat_tok, Variant())
    assert p.text == CHAT_PREFIX + plain.text + CHAT_SUFFIX
    assert p.manifest.chat is True
    # the template's own BOS is the only one: no special tokens added on top
    assert p.input_ids[0] == chat_tok.bos_token_id
    assert list(p.input_ids).count(chat_tok.bos_token_id) == 1
    assert list(p.input_ids) == chat_tok(p.text, add_special_tokens=False)["input_ids"]
    _check_spans(p, chat_tok, _lines(ex))
    assert p.manifest.gold_index == 2
    assert p.manifest.doc_char_spans[0][0] == plain.manifest.doc_char_spans[0][0] + len(CHAT_PREFIX)
    qs, qe = p.manifest.question_spans[0]
    assert "what is the capital of the island" in chat_tok.decode(list(p.input_ids[qs:qe]))
    assert p.manifest.num_tokens == len(p.input_ids)
    assert p.manifest.sha256 != plain.manifest.sha256


def test_chat_can_be_switched_off(tok, chat_tok):
    a = render(FOUR, chat_tok, Variant(chat=False))
    b = render(FOUR, tok, Variant())
    assert a.text == b.text and a.input_ids == b.input_ids and a.manifest.chat is False


def test_chat_true_without_template_is_an_error(tok):
    with pytest.raises(ConfigError):
        render(FOUR, tok, Variant(chat=True))


def test_chat_kv(chat_tok):
    p = render(KV, chat_tok)
    assert p.text == CHAT_PREFIX + EXPECTED_KV + CHAT_SUFFIX
    _check_spans(p, chat_tok, [f'"{K1}": "{V1}"', f'"{K2}": "{V2}"', f'"{K3}": "{V3}"'])


# ------------------------------------------------------------------------------------ continuation
def _prompt(text: str) -> Prompt:
    m = Manifest((), (), (), None, (), 0, "", "ours:qa", False)
    return Prompt("x", text, (), m)


@pytest.mark.parametrize("text, expected", [
    ("Answer:", " Paris"),
    ("Corresponding value:", " Paris"),
    ("Answer: ", "Paris"),
    ("<|assistant|>\n", "Paris"),
    ("tab\t", "Paris"),
    ("", "Paris"),
])
def test_continuation(text, expected):
    assert _prompt(text).continuation("Paris") == expected


def test_continuation_on_rendered_prompts(tok, chat_tok):
    assert render(FOUR, tok).continuation("Port Wen") == " Port Wen"
    assert render(FOUR, chat_tok).continuation("Port Wen") == "Port Wen"


# ------------------------------------------------------------------------------------ strategy variants
XML_AMP = Example(id="x", question="who?", answers=("B",), task="qa", documents=(
    Document("d&1", 'A "quoted" <title>', "Fish & chips < 5", is_gold=True),))


def test_grounded_repeat_with_citations_in_xml_text():
    text, _, doc_spans, q_spans, name = render_text(QA, Variant(repeat=True, cite=True, doc_format="xml"))
    assert name == "qa_with_grounded_repeat_with_citations"
    assert text == (
        "Use only the search results below to answer the question. Some of the search results may not be relevant "
        "to it. After the answer, give the number of the search result it comes from in square brackets, like [2]."
        "\n\nQuestion: who wrote moby dick\n\n"
        '<document index="1" id="d1" title="Nantucket">Nantucket is an island south of Cape Cod.</document>\n'
        '<document index="2" id="g" title="Moby-Dick">Moby-Dick is an 1851 novel by Herman Melville.</document>'
        "\n\nAnswer from the search results above only, not from memory.\n"
        "Question: who wrote moby dick\nAnswer:")
    assert [text[s:e] for s, e in doc_spans][1].startswith('<document index="2"')
    assert [text[s:e] for s, e in q_spans] == ["who wrote moby dick"] * 2


def test_xml_escapes_attributes_and_text():
    text = render_text(XML_AMP, Variant(doc_format="xml"))[0]
    assert ('<document index="1" id="d&amp;1" title=\'A "quoted" &lt;title&gt;\'>Fish &amp; chips &lt; 5'
            '</document>') in text


def test_citations_on_the_papers_layout():
    text, *_, name = render_text(QA, Variant(cite=True))
    assert name == "qa_with_citations"
    assert text == EXPECTED_QA.replace("relevant to it.", "relevant to it. After the answer, give the number of the "
                                       "search result it comes from in square brackets, like [2].")


def test_xml_manifest_spans_cover_each_element(tok):
    p = render(gold_at(FOUR, 2), tok, Variant(doc_format="xml"))
    elements = [f'<document index="{i + 1}" id="{d.id}" title="{d.title}">{d.text}</document>'
                for i, d in enumerate(gold_at(FOUR, 2).documents)]
    _check_spans(p, tok, elements)
    assert p.manifest.gold_index == 2 and p.manifest.doc_format == "xml"


def test_strategy_variants_refuse_what_they_cannot_do(tmp_path):
    with pytest.raises(ConfigError, match="drop query_aware"):
        render_text(QA, Variant(repeat=True, query_aware=True))
    with pytest.raises(ConfigError, match="QA prompts only"):
        render_text(KV, Variant(cite=True))
    with pytest.raises(ConfigError, match="unknown doc_format 'html'"):
        render_text(QA, Variant(doc_format="html"))
    with pytest.raises(ConfigError, match="repeat and cite are ours"):
        render_text(QA, Variant(cite=True, template="paper", template_dir=str(tmp_path)))


def test_user_template_renders_every_condition_and_locates_the_documents(tok):
    from litm.prompts import check_template

    text = "Help desk.\n{search_results}\n--\nQ: {question}\nA ({{short}}):"
    ex = gold_at(generate_fictional_qa(1, 4, seed=1)[0], 2)
    p = render(ex, tok, Variant(template_text=text, chat=False))
    assert p.text.startswith("Help desk.\nDocument [1](Title: ") and p.text.endswith("\nA ({short}):")
    assert p.manifest.template == "user:qa" and p.manifest.gold_index == 2
    s, e = p.manifest.doc_char_spans[2]
    assert p.text[s:e] == f"Document [3](Title: {ex.gold.title}) {ex.gold.text}"
    closed = render(ex, tok, Variant(template_text=text, condition="closedbook", chat=False))
    assert closed.text == f"Help desk.\n\n--\nQ: {ex.question}\nA ({{short}}):" and not closed.manifest.doc_ids
    oracle = render(ex, tok, Variant(template_text=text, condition="oracle", chat=False))
    assert oracle.manifest.doc_ids == (ex.gold.id,)
    assert check_template(text) == text


@pytest.mark.parametrize("text, message", [
    ("Docs: {search_results}\nAnswer:", r"lacks the placeholder\(s\) \{question\}"),
    ("Q: {question}", r"\{search_results\}"),
    ("{search_results} {question} {context}", r"\{context\} we cannot fill"),
    ("{search_results} {question} {", "not a valid template"),
])
def test_user_template_errors_say_what_to_fix(text, message):
    from litm.prompts import check_template

    with pytest.raises(ConfigError, match=message):
        check_template(text, "my.txt")
