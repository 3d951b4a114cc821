"""Seeded generators of offline data: KV retrieval in the paper's format, and fictional multi-document QA.

Everything comes from `random.Random(seed)`; the same seed always gives the same examples.
"""
from __future__ import annotations

import gzip
import json
import random
import uuid
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError, DataError
from ..types import Example


def _check(num_examples: int, num_docs: int, min_docs: int = 2) -> None:
    if num_examples < 1:
        raise ConfigError(f"num_examples must be at least 1, got {num_examples}.")
    if num_docs < min_docs:
        raise ConfigError(f"need at least {min_docs} documents per example, got {num_docs}.")


def seeded_uuid(rng: random.Random) -> str:
    """A UUID-shaped string (version-4 layout) drawn from `rng`, so it is reproducible."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def kv_records(num_examples: int, num_keys: int, seed: int = 0) -> list[dict]:
    """KV objects in the paper's schema: ordered_kv_records, key, value; the gold index is uniform."""
    _check(num_examples, num_keys)
    rng = random.Random(f"kv-{seed}")
    out = []
    for _ in range(num_examples):
        stored: dict[str, str] = {}
        while len(stored) < num_keys:
            k, v = seeded_uuid(rng), seeded_uuid(rng)
            stored.setdefault(k, v)  # a repeated key is drawn again
        pairs = [[k, v] for k, v in stored.items()]
        key, value = pairs[rng.randrange(num_keys)]
        out.append({"ordered_kv_records": pairs, "key": key, "value": value})
    return out


def generate_kv(num_examples: int, num_keys: int, seed: int = 0) -> list[Example]:
    """KV Examples: each pair is a Document(title=key, text=value, answer=value)."""
    from .liu import kv_example_from_obj

    return [kv_example_from_obj(obj, f"kv-s{seed}-{i}", f"generated kv #{i}")
            for i, obj in enumerate(kv_records(num_examples, num_keys, seed))]


# ---------------------------------------------------------------- fictional multi-document QA
_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "k", "kh", "l", "m", "n", "p", "r", "s", "sh", "t",
           "th", "v", "z", "", ""]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ia", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd", "x", "sk"]


def _word(rng: random.Random, syllables: int) -> str:
    w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return w.capitalize()


def _person(rng: random.Random) -> str:
    return f"{_word(rng, rng.choice([2, 2, 3]))} {_word(rng, rng.choice([2, 3]))}"


def _place(rng: random.Random) -> str:
    return _word(rng, rng.choice([2, 3]))


def _year(rng: random.Random) -> str:
    return str(rng.randrange(1150, 1900))


# Each relation: (kind of entity, question, fact sentence, answer maker).  All documents of one
# example share the relation, so every distractor is on-topic but about another entity.
_RELATIONS = [
    ("island nation", "What is the capital of {e}?", "The capital of {e} is {a}.", _place),
    ("trading guild", "Who founded the {e} Guild?", "The {e} Guild was founded by {a}.", _person),
    ("mountain valley", "Which river flows through the {e} Valley?",
     "The river that flows through the {e} Valley is the {a}.", _place),
    ("observatory", "In what year was the {e} Observatory built?",
     "The {e} Observatory was built in {a}.", _year),
    ("steam engine", "Who invented the {e} engine?", "The {e} engine was invented by {a}.", _person),
    ("desert kingdom", "What is the highest peak in {e}?", "The highest peak in {e} is Mount {a}.", _place),
]

_FILLERS = [
    "Travellers describe {e} as {adj} and {adj2}.",
    "Records from {e} mention a long dispute with the neighbouring town of {p}.",
    "Scholars of {e} still argue about the meaning of its oldest {thing}.",
    "Each spring, people from {e} hold a festival of {thing} that lasts {n} days.",
    "The archives of {e} were moved to {p} after a fire.",
    "Most accounts of {e} come from the diaries of a merchant named {person}.",
    "Its emblem shows a {adj} {thing} over a field of {colour}.",
    "Visitors to {e} are warned about the {adj} winters.",
    "A survey once counted {n} hundred households connected with {e}.",
    "The name {e} is said to come from an old word for {thing}.",
]
_ADJ = ["quiet", "windswept", "prosperous", "remote", "crowded", "ancient", "rainy", "proud", "modest"]
_THINGS = ["lanterns", "bells", "maps", "songs", "boats", "looms", "orchards", "mirrors", "kites"]
_COLOURS = ["green", "silver", "blue", "amber", "crimson", "white"]


def _filler(rng: random.Random, entity: str) -> str:
    return rng.choice(_FILLERS).format(
        e=entity, adj=rng.choice(_ADJ), adj2=rng.choice(_ADJ), thing=rng.choice(_THINGS),
        p=_place(rng), person=_person(rng), n=rng.randrange(2, 12), colour=rng.choice(_COLOURS))


ADVERSARIAL_KINDS = ("outdated", "other_region", "contradicting")
_REGION_PREFIXES = ["North", "South", "East", "West", "Upper", "Lower", "New", "Old"]


def fictional_qa_records(num_examples: int, num_docs: int, seed: int = 0,
                         sentences_per_doc: int = 3, adversarial: tuple[str, ...] = ()) -> list[dict]:
    """QA objects in Liu et al.'s schema about invented entities; ctxs[0] is the gold document.

    Every distractor states the same kind of fact about another invented entity, with its own
    answer (kept in the ctx's `answer` field) so forced choice has a candidate per document.

    `adversarial` replaces the last distractors, one per kind, with documents built to conflict with the
    gold (kept in the ctx's `kind` field), each with an answer of its own:
    "outdated", the gold's fact about the same entity in an earlier, superseded version (the titles carry
    version numbers and years; the gold's is the newer); "other_region", the same fact about a near-identical
    entity ("North X" for X); "contradicting", the same entity with another answer and nothing to tell
    which is right.  The same seed gives the same questions, golds and ordinary distractors either way.
    """
    _check(num_examples, num_docs, min_docs=1 + len(adversarial))
    bad = [k for k in adversarial if k not in ADVERSARIAL_KINDS]
    if bad or len(set(adversarial)) != len(adversarial):
        raise ConfigError(f"adversarial kinds must be distinct ones of {ADVERSARIAL_KINDS}, got {adversarial}.")
    rng = random.Random(f"fqa-{seed}")
    out = []
    for i in range(num_examples):
        kind, question, fact, make_answer = _RELATIONS[rng.randrange(len(_RELATIONS))]
        entities: list[str] = []
        answers: list[str] = []
        while len(entities) < num_docs:
            e, a = _place(rng), make_answer(rng)
            if e not in entities and a not in answers and e != a and a not in entities:
                entities.append(e)
                answers.append(a)
        titles = [f"{e} ({kind})" for e in entities]
        kinds: list[str | None] = [None] * num_docs
        if adversarial:
            gold, arng = entities[0], random.Random(f"fqa-adversarial-{seed}-{i}")  # the plain stream stays as it was
            old, new = sorted(arng.sample(range(1700, 2000), 2))
            titles[0] = f"{gold} ({kind}) [version 2, {new}]"
            for t, adv in enumerate(adversarial):
                j = num_docs - len(adversarial) + t
                kinds[j] = adv
                if adv == "outdated":
                    entities[j], titles[j] = gold, f"{gold} ({kind}) [version 1, {old}, superseded]"
                else:  # other_region: a near-identical entity; contradicting: the gold's own
                    entities[j] = f"{arng.choice(_REGION_PREFIXES)} {gold}" if adv == "other_region" else gold
                    titles[j] = f"{entities[j]} ({kind})"
        ctxs = []
        for j, (e, a) in enumerate(zip(entities, answers)):
            sentences = [_filler(rng, e) for _ in range(max(0, sentences_per_doc - 1))]
            sentences.insert(rng.randrange(len(sentences) + 1), fact.format(e=e, a=a))
            ctx = {"id": f"fqa{seed}-{i}-{j}", "title": titles[j], "text": " ".join(sentences),
                   "hasanswer": j == 0, "isgold": j == 0, "answer": a}
            if kinds[j]:
                ctx["kind"] = kinds[j]
            ctxs.append(ctx)
        out.append({"question": question.format(e=entities[0]), "answers": [answers[0]], "ctxs": ctxs,
                    "nq_annotated_gold": {"title": ctxs[0]["title"], "short_answers": [answers[0]]}})
    return out


def generate_fictional_qa(num_examples: int, num_docs: int, seed: int = 0,
                          sentences_per_doc: int = 3, adversarial: tuple[str, ...] = ()) -> list[Example]:
    """Fictional QA Examples; gold first, distractors after it (move it with `ordering.gold_at`).
    `adversarial` adds conflicting distractors (see `fictional_qa_records`)."""
    from .liu import qa_example_from_obj

    examples = []
    for i, obj in enumerate(fictional_qa_records(num_examples, num_docs, seed, sentences_per_doc, adversarial)):
        ex = qa_example_from_obj(obj, f"fqa-s{seed}-{i}", f"generated qa #{i}")
        examples.append(replace(ex, documents=tuple(replace(d, answer=c["answer"], kind=c.get("kind"))
                                                    for d, c in zip(ex.documents, obj["ctxs"]))))
    return examples


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    """Write objects as JSON lines (gzipped when the name ends in .gz)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    return path


def shared_document_questions(example: Example) -> list[Example]:
    """For a generated fictional-QA example, one question per document over the same documents: the
    question of its relation asked about each document's entity, that document gold.  (Queries that share
    one document set, as a prefix cache sees them.)"""
    kinds = {kind: question for kind, question, _, _ in _RELATIONS}
    out = []
    for j, doc in enumerate(example.documents):
        entity, _, rest = doc.title.partition(" (")
        kind = rest.rstrip(")")
        if kind not in kinds or doc.answer is None:
            raise DataError(f"document {doc.id} is not a generated fictional-QA document; shared questions are "
                            "made for generate_fictional_qa's examples only.")
        docs = tuple(replace(d, is_gold=i == j) for i, d in enumerate(example.documents))
        out.append(Example(f"{example.id}/q{j}", kinds[kind].format(e=entity), (doc.answer,), docs, "qa",
                           {"shared_with": example.id}))
    return out
