"""Fitting documents to a context budget, counted in the model's own tokens, and accounting for whether
the gold evidence survived.  Every strategy re-renders the prompt it builds, so the budget holds exactly."""
from __future__ import annotations

import bisect
import re
import time
from dataclasses import dataclass, replace
from typing import Sequence

from .errors import ConfigError, DataError
from .metrics import normalize_answer
from .prompts import Variant, render
from .types import Document, Example

METHODS = ("truncate", "drop_lowest", "extractive", "lm_prune", "abstractive")
CUT_MIN_TOKENS = 100  # truncate cuts the last document only when more than this many tokens remain


@dataclass(frozen=True)
class Budget:
    """Prompt tokens: the model's window less a reserve for the answer, capped by `ceiling`; `fixed` is
    the prompt without any document (instruction, question, template, chat wrapping)."""

    window: int
    reserve: int
    ceiling: int | None
    fixed: int

    @property
    def total(self) -> int:
        cap = self.window - self.reserve
        return cap if self.ceiling is None else min(cap, self.ceiling)

    @property
    def context(self) -> int:
        """Tokens left for the documents."""
        return self.total - self.fixed


def _tokens(lm, example: Example, variant: Variant) -> int:
    return len(render(example, lm.tokenizer, variant, allow_empty=True).input_ids)


def plan_budget(lm, example: Example, variant: Variant = Variant(), reserve: int = 32,
                ceiling: int | None = None) -> Budget:
    """The budget for `example`'s prompt on `lm` (its window and tokenizer)."""
    if reserve < 0:
        raise ConfigError(f"reserve must be at least 0, got {reserve}.")
    if ceiling is not None and ceiling > lm.window:
        raise ConfigError(f"a ceiling of {ceiling} tokens is larger than the model's window of {lm.window}; "
                          "use at most the window.")
    fixed = _tokens(lm, replace(example, documents=()), variant)
    budget = Budget(lm.window, reserve, ceiling, fixed)
    if budget.context <= 0:
        raise ConfigError(f"a budget of {budget.total} tokens is smaller than the prompt's fixed parts ({fixed} "
                          "tokens: instruction, question, template), leaving nothing for documents; raise the "
                          "ceiling or lower the reserve.")
    return budget


_SENTENCE = re.compile(r"[^.!?]*(?:[.!?]+|$)\s*")


def split_sentences(text: str) -> list[str]:
    """Sentences with their trailing spaces, so that joining them gives the text back."""
    return [s for s in _SENTENCE.findall(text) if s]


@dataclass(frozen=True)
class Compressed:
    """A compressed example and what was kept of each original document."""

    example: Example
    strategy: str
    budget: Budget
    prompt_tokens: int
    original_tokens: int
    kept: tuple[dict, ...]  # per original document: id, status (whole | partial | dropped), kept characters
    seconds: float


def _kept(original: Example, compressed: Example) -> tuple[dict, ...]:
    now = {d.id: d for d in compressed.documents}
    out = []
    for d in original.documents:
        c = now.get(d.id)
        status = "dropped" if c is None else ("whole" if c.text == d.text else "partial")
        out.append({"id": d.id, "status": status, "chars": 0 if c is None else len(c.text), "of": len(d.text)})
    return tuple(out)


def _fits(lm, example: Example, variant: Variant, budget: Budget) -> bool:
    return _tokens(lm, example, variant) <= budget.total


def _with_texts(example: Example, texts: Sequence[str]) -> Example:
    """`example` with its documents' texts replaced by `texts`; documents left empty are dropped."""
    return replace(example, documents=tuple(replace(d, text=t) for d, t in zip(example.documents, texts) if t))


def _truncate(lm, example: Example, budget: Budget, variant: Variant) -> Example:
    kept: list[Document] = []
    for d in example.documents:
        if _fits(lm, replace(example, documents=tuple(kept + [d])), variant, budget):
            kept.append(d)
            continue
        if budget.total - _tokens(lm, replace(example, documents=tuple(kept)), variant) > CUT_MIN_TOKENS:
            sentences = split_sentences(d.text)
            lo, hi = 0, len(sentences)  # the most leading sentences that fit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                cut = replace(d, text="".join(sentences[:mid]).rstrip())
                if _fits(lm, replace(example, documents=tuple(kept + [cut])), variant, budget):
                    lo = mid
                else:
                    hi = mid - 1
            if lo:
                kept.append(replace(d, text="".join(sentences[:lo]).rstrip()))
        break
    return replace(example, documents=tuple(kept))


def _drop_lowest(lm, example: Example, budget: Budget, variant: Variant, scores: Sequence[float]) -> Example:
    order = sorted(range(len(example.documents)), key=lambda i: (scores[i], -i))  # least relevant first
    for t in range(len(order)):  # drop the t least relevant until the rest fits
        dropped = set(order[:t])
        out = replace(example, documents=tuple(d for j, d in enumerate(example.documents) if j not in dropped))
        if _fits(lm, out, variant, budget):
            return out
    return replace(example, documents=())


def _extractive(lm, example: Example, budget: Budget, variant: Variant, retriever: str = "bm25") -> Example:
    from .retrieval import bm25_scores, dense_scores

    units = [(i, j, s) for i, d in enumerate(example.documents) for j, s in enumerate(split_sentences(d.text))]
    pool = [Document(id=f"{i}:{j}", title=example.documents[i].title, text=s) for i, j, s in units]
    if retriever not in ("bm25", "dense"):
        raise ConfigError(f"unknown sentence retriever {retriever!r}: use 'bm25' or 'dense'.")
    s = (bm25_scores if retriever == "bm25" else dense_scores)(example.question, pool)
    chosen: set[int] = set()

    def build(sel: set[int]) -> Example:
        return _with_texts(example, ["".join(units[u][2] for u in sorted(sel) if units[u][0] == i).rstrip()
                                     for i in range(len(example.documents))])

    for u in sorted(range(len(units)), key=lambda u: (-s[u], u)):  # most relevant sentence first
        if _fits(lm, build(chosen | {u}), variant, budget):
            chosen.add(u)
    return build(chosen)


_WORD = re.compile(r"\S+\s*")


def _memo(cache: dict | None, key, make):
    """`make()`, remembered in `cache` under `key` when a cache is given (work shared across calls)."""
    if cache is None:
        return make()
    if key not in cache:
        cache[key] = make()
    return cache[key]


def word_surprisal(lm, question: str, text: str) -> list[tuple[str, float]]:
    """Each word of `text` (with its trailing space) and its surprisal in nats under `lm`, conditioned on
    the question: the sum over the word's tokens of -log p(token | question, text so far)."""
    import torch

    prefix = f"Question: {question}\nPassage:\n"
    enc = lm.tokenizer(prefix + text, return_offsets_mapping=True, add_special_tokens=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([ids], device=lm.device)).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:], device=lm.device)[:, None])[:, 0]
    words = list(_WORD.finditer(text))
    starts = [m.start() for m in words]
    surprisal = [0.0] * len(words)
    for t in range(1, len(ids)):
        s, e = offsets[t]
        if e <= len(prefix) or e == s:
            continue
        k = bisect.bisect_right(starts, max(s, len(prefix)) - len(prefix)) - 1
        if k >= 0:
            surprisal[k] -= float(logp[t - 1])
    return [(m.group(), v) for m, v in zip(words, surprisal)]


def _lm_prune(lm, example: Example, budget: Budget, variant: Variant, compressor=None, cache=None) -> Example:
    """Question-conditioned pruning in the manner of LongLLMLingua: keep the words the compressor LM finds
    most surprising given the question (the informative ones), the same threshold for every document,
    the lowest that fits the budget; words keep their order."""
    scorer = compressor or lm
    scored = [_memo(cache, ("surprisal", scorer.name, example.question, d.text),
                    lambda d=d: word_surprisal(scorer, example.question, d.text)) for d in example.documents]
    levels = sorted({v for doc in scored for _, v in doc})

    def build(threshold: float) -> Example:
        return _with_texts(example, ["".join(w for w, v in words if v >= threshold).strip() for words in scored])

    # the lowest threshold (most words) whose prompt fits; len(levels) keeps none
    lo = bisect.bisect_left(range(len(levels)), True, key=lambda k: _fits(lm, build(levels[k]), variant, budget))
    return build(levels[lo]) if lo < len(levels) else replace(example, documents=())


ABSTRACT_PROMPT = ("Rewrite the passage below so that it keeps only what bears on the question, in at most "
                   "{words} words. Write one line.\n\nQuestion: {question}\nPassage: {title}. {text}")


def _abstractive(lm, example: Example, budget: Budget, variant: Variant, compressor=None, cache=None) -> Example:
    """Each document rewritten by a local LM told to keep only what bears on the question, within a
    per-document share of the budget; the result is then fitted exactly as `truncate` does."""
    from .prompts import Prompt
    from .runner import generate

    gen = compressor or lm
    per_doc = max(8, budget.context // max(1, len(example.documents)))
    key = lambda d: ("abstract", gen.name, example.question, d.title, d.text, per_doc)  # noqa: E731
    todo = [d for d in example.documents if cache is None or key(d) not in cache]
    prompts = []
    for d in todo:
        text = ABSTRACT_PROMPT.format(words=max(4, int(per_doc * 0.7)), question=example.question, title=d.title,
                                      text=d.text)
        if getattr(gen.tokenizer, "chat_template", None):
            ids = gen.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=True)["input_ids"]
        else:
            ids = gen.tokenizer(text + "\nRewritten passage:")["input_ids"]
        prompts.append(Prompt(d.id, text, tuple(ids), None))
    outs = generate(gen, prompts, max_new_tokens=per_doc, batch_size=4) if prompts else []
    written = {id(d): o.prediction.split("\n")[0].strip() for d, o in zip(todo, outs)}
    texts = [_memo(cache, key(d), lambda d=d: written[id(d)]) for d in example.documents]
    return _truncate(lm, _with_texts(example, texts), budget, variant)


def compress(lm, example: Example, budget: Budget, strategy: str, variant: Variant = Variant(),
             scores: Sequence[float] | None = None, compressor=None, cache: dict | None = None,
             sentence_retriever: str = "bm25") -> Compressed:
    """Fit `example`'s documents into `budget` with a named strategy:

    - "truncate": whole documents in their given order until the budget; the last one cut at a sentence
      boundary when more than 100 tokens remain;
    - "drop_lowest": drop the least relevant documents (`scores`, aligned with the documents) until it fits;
    - "extractive": the question's most relevant sentences (`sentence_retriever`: BM25 or dense similarity
      over the sentences) while they fit, kept in their original order within their documents;
    - "lm_prune": question-conditioned word pruning by a small LM's surprisal (LongLLMLingua's idea);
    - "abstractive": each document rewritten by a local LM to what bears on the question, then fitted.
    `compressor` is the LM that prunes or rewrites (default: `lm` itself); `cache`, a dict kept across calls,
    shares their per-document work between prompts that hold the same documents.
    """
    if strategy not in METHODS:
        raise ConfigError(f"unknown compression strategy {strategy!r}: use one of {', '.join(METHODS)}.")
    empty = [d.id for d in example.documents if not d.text.strip()]
    if empty:
        raise DataError(f"documents {empty[:5]} of example {example.id} are empty; drop them before compressing.")
    t0 = time.perf_counter()
    if strategy == "truncate":
        out = _truncate(lm, example, budget, variant)
    elif strategy == "drop_lowest":
        if scores is None or len(scores) != len(example.documents):
            raise ConfigError(f"drop_lowest needs one relevance score per document ({len(example.documents)}).")
        out = _drop_lowest(lm, example, budget, variant, scores)
    elif strategy == "extractive":
        out = _extractive(lm, example, budget, variant, sentence_retriever)
    elif strategy == "lm_prune":
        out = _lm_prune(lm, example, budget, variant, compressor, cache)
    else:
        out = _abstractive(lm, example, budget, variant, compressor, cache)
    seconds = time.perf_counter() - t0
    return Compressed(out, strategy, budget, _tokens(lm, out, variant), _tokens(lm, example, variant),
                      _kept(example, out), seconds)


def _answer_sentence(doc: Document, answers: Sequence[str]) -> str | None:
    """The shortest run of consecutive sentences holding an answer (an answer like "St. Louis" spans
    what a sentence splitter sees as two)."""
    sentences = split_sentences(doc.text)
    for length in range(1, len(sentences) + 1):
        for start in range(len(sentences) - length + 1):
            run = "".join(sentences[start:start + length])
            if any(normalize_answer(a) in normalize_answer(run) for a in answers):
                return run.strip()
    return None


def survival(original: Example, compressed: Example) -> dict:
    """Did the gold evidence survive compression: the answer string anywhere in the kept documents, the
    gold document's answer-bearing sentence intact, and where the gold document now sits (0-based)."""
    gold = original.gold
    text = " ".join(normalize_answer(d.text) for d in compressed.documents)
    answer_kept = any(normalize_answer(a) in text for a in original.answers)
    sentence = _answer_sentence(gold, original.answers)
    now = next((i for i, d in enumerate(compressed.documents) if d.id == gold.id), None)
    sentence_kept = sentence is not None and now is not None and sentence in compressed.documents[now].text
    return {"answer_kept": answer_kept, "sentence_kept": bool(sentence_kept), "gold_position": now,
            "gold_has_sentence": sentence is not None}
