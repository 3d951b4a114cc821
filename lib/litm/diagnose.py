"""Diagnose position sensitivity on your own RAG prompts (notebook 07, `python -m litm diagnose`).

For each case (a question, its accepted answers, the documents as they went into the prompt and the id of
the one that holds the answer) the gold document is placed at fixed relative depths of the document region
while everything else stays: the same question, evidence and distractors, so the prompt length barely
moves.  Distractor orders follow a cyclic Latin square: row r of a seed's square puts the seed's shuffled
distractors rotated by r around the gold, and every placement uses the same rows, so over a full square
each distractor sits next to the gold equally often at every placement.  Oracle (the gold alone) and
closed-book prompts are the baselines.  The model generates; the answers are scored for accuracy,
citation support, wrong-source answers and abstentions, and a rule-based verdict names the likeliest
cause: packing/truncation, position, a reasoning or evidence problem, interference or length.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from . import runner, stats
from .data.generate import ADVERSARIAL_KINDS
from .errors import ConfigError, DataError
from .experiment import config_hash, score_prompts
from .metrics import best_subspan_em, first_line, normalize_answer, parse_citations
from .models import DEFAULT_MODEL, LoadedModel, load_model
from .prompts import Prompt, Variant, check_template, render
from .store import ResultStore
from .types import Document, Example

DEPTHS = (0.0, 0.25, 0.5, 0.75, 0.95)
SCORINGS = ("generate", "choice")
ABSTAIN_ANSWER = "I don't know"  # forced choice: the abstaining candidate
DOC_KINDS = (None, "distractor") + ADVERSARIAL_KINDS
_META = ("version", "date", "authority")
_ABSTAIN = re.compile(
    r"\b(i do ?n[o']?t know|i don'?t know|not (?:mentioned|stated|provided|given|specified|available|found)|"
    r"(?:can ?not|can'?t|unable to) (?:be )?(?:answer|determine|find|say|tell)|no (?:information|answer)|"
    r"unknown|unanswerable|not enough (?:information|context))\b", re.IGNORECASE)


# ----------------------------------------------------------------------------------------- cases
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
    answers = obj.get("answers")
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, (list, tuple)) or not [a for a in answers if isinstance(a, str) and a.strip()]:
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
    return Example(case_id, question, tuple(a for a in answers if isinstance(a, str) and a.strip()), tuple(docs),
                   "qa", {"source": where})


def read_cases(source, limit: int | None = None) -> list[Example]:
    """Cases from a JSONL file (one case per line) or any iterable of mappings, e.g. a `datasets.Dataset`.

    A case: {"id", "question", "answers": [...], "gold_id", "documents": [{"id", "title", "text",
    optional "version", "date", "authority", "answer" (what this document would answer), "kind"
    ("outdated", "other_region", "contradicting" or "distractor")}]}."""
    if isinstance(source, (str, Path)):
        from .data.liu import iter_json_lines

        rows: Iterable = ((f"{source}:{lineno}", obj) for lineno, obj in iter_json_lines(source))
    else:
        rows = ((f"row {i + 1}", obj) for i, obj in enumerate(source))
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


# ---------------------------------------------------------------------------------------- design
@dataclass(frozen=True)
class Trial:
    """One prompt of the design: a case with its documents in the order they are shown."""

    id: str
    case_id: str
    condition: str  # documents | oracle | closedbook
    example: Example
    depth: float | None = None
    placement: int | None = None  # index into the depths
    slot: int | None = None  # 0-based position of the gold among the documents
    seed: int | None = None
    order: int | None = None  # row of the Latin square
    length: int = 1  # multiple of the case's own documents (padded with other cases' documents)


def slots_for(depths, num_docs: int, case_id: str = "") -> list[int]:
    """The gold's 0-based slot for each relative depth (round half up of depth x (documents - 1));
    different depths must land on different slots."""
    slots = [int(math.floor(d * (num_docs - 1) + 0.5)) for d in depths]
    if len(set(slots)) < len(slots):
        need = next(n for n in range(num_docs, 10_000) if len({int(math.floor(d * (n - 1) + 0.5))
                                                                 for d in depths}) == len(depths))
        raise DataError(f"case {case_id!r} has {num_docs} documents: the depths {list(depths)} fall on slots "
                        f"{slots}, not one slot each. Give it at least {need} documents or use fewer depths.")
    return slots


def latin_rows(num_distractors: int, orders: int | None) -> list[int]:
    """Rows (rotations) of the cyclic Latin square to use: all of them, or `orders` evenly spaced ones."""
    m = num_distractors
    if orders is None or orders >= m:
        return list(range(m))
    return sorted({i * m // orders for i in range(orders)})


def design(case: Example, depths=DEPTHS, orders: int | None = None, seeds=(0,), lengths=(1,),
           fillers: list[Document] = (), oracle: bool = True, closedbook: bool = True) -> list[Trial]:
    """Every prompt of one case: for each length, seed, Latin-square row and depth, the gold at its slot
    among the rotated distractors; plus the oracle and closed-book prompts."""
    gold = case.gold
    own = [d for d in case.documents if not d.is_gold]
    out = []
    for length in lengths:
        extra = [replace(d, id=f"{d.id}~pad{j}", kind=None, is_gold=False)  # other cases' kinds mean nothing here
                 for j, d in enumerate(fillers[:(length - 1) * len(case.documents)])]
        if len(extra) < (length - 1) * len(case.documents):
            raise ConfigError(f"length x{length} needs {(length - 1) * len(case.documents)} padding documents from "
                              f"other cases, only {len(extra)} are there; use more cases or shorter lengths.")
        distractors = own + extra
        slots = slots_for(depths, len(distractors) + 1, case.id)
        for seed in seeds:
            base = list(distractors)
            random.Random(f"diagnose-{seed}-{case.id}-{length}").shuffle(base)
            for r in latin_rows(len(base), orders):
                seq = base[r:] + base[:r]
                for p, (depth, k) in enumerate(zip(depths, slots)):
                    docs = tuple(seq[:k] + [gold] + seq[k:])
                    out.append(Trial(f"{case.id}|x{length}|s{seed}|r{r}|d{p}", case.id, "documents",
                                     replace(case, documents=docs), depth, p, k, seed, r, length))
    if oracle:
        out.append(Trial(f"{case.id}|oracle", case.id, "oracle", case))
    if closedbook:
        out.append(Trial(f"{case.id}|closedbook", case.id, "closedbook", case))
    return out


def neighbours(example: Example) -> list[Document]:
    """The documents right before and after the gold."""
    i = example.gold_index
    return [example.documents[j] for j in (i - 1, i + 1) if 0 <= j < len(example.documents)]


# ---------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class DiagnoseConfig:
    """A diagnosis: which cases, model and template, and the design."""

    cases: str | None = None  # a JSONL file; None when the cases are passed to `run` directly
    model: str = DEFAULT_MODEL
    template: str | None = None  # a template file of yours ({search_results}, {question}); None: ours
    cite: bool = True  # our template asks for the supporting document's number (supported accuracy)
    depths: tuple[float, ...] = DEPTHS
    orders: int | None = None  # Latin-square rows per placement; None = all (exact balance)
    seeds: tuple[int, ...] = (0, 1)  # each seed shuffles the distractors anew: a Latin square per seed
    lengths: tuple[int, ...] = (1,)  # 2 = the case's documents plus as many from other cases, and so on
    adversarial: tuple[str, ...] = ()  # add conflicting copies of each gold (see `with_adversarial`)
    max_prompt_tokens: int | None = None  # your pipeline's budget: documents that do not fit are dropped
    oracle: bool = True
    closedbook: bool = True
    scoring: str = "generate"  # generate (citations, free abstention) | choice (answer vs distractors' vs abstain)
    max_new_tokens: int = 32
    chat: bool | None = None
    limit: int | None = None  # the first `limit` cases
    batch_size: int = 4
    results_dir: str = "results/diagnose"
    n_boot: int = 2000
    progress: bool = True

    def __post_init__(self):
        for name in ("depths", "seeds", "lengths", "adversarial"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.depths or any(not 0 <= d <= 1 for d in self.depths) or list(self.depths) != sorted(set(self.depths)):
            raise ConfigError(f"depths must be increasing fractions in [0, 1], got {self.depths}.")
        if not self.seeds or not self.lengths or min(self.lengths) < 1 or self.lengths[0] != 1:
            raise ConfigError("seeds and lengths need at least one value; lengths start at 1 (the case as it is).")
        if self.orders is not None and self.orders < 1:
            raise ConfigError(f"orders must be at least 1 (or None for the full Latin square), got {self.orders}.")
        bad = [k for k in self.adversarial if k not in ADVERSARIAL_KINDS]
        if bad:
            raise ConfigError(f"unknown adversarial kinds {bad}: use {ADVERSARIAL_KINDS}.")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ConfigError("max_prompt_tokens must be positive (or None for no budget).")
        if self.scoring not in SCORINGS:
            raise ConfigError(f"unknown scoring {self.scoring!r}: use one of {SCORINGS}.")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("max_new_tokens and batch_size must be at least 1.")
        if self.template is not None:
            check_template(self.template_text(), self.template)

    def template_text(self) -> str | None:
        if self.template is None:
            return None
        path = Path(self.template)
        if not path.is_file():
            raise ConfigError(f"template file {path} does not exist.")
        return path.read_text(encoding="utf-8").rstrip("\n")

    def variant(self, condition: str = "documents") -> Variant:
        text = self.template_text()
        return Variant(condition=condition, template_text=text, cite=self.cite and text is None
                       and self.scoring == "generate", chat=self.chat)

    @property
    def asks_citations(self) -> bool:
        """Whether the prompt asks for citations: ours with cite=True; a template of yours when it mentions
        citing or shows a bracketed number such as [2]."""
        if self.scoring == "choice":
            return False
        text = self.template_text()
        return self.cite if text is None else bool(re.search(r"\bcit(e|ing|ation)|\[\d+\]|\[n\]", text, re.IGNORECASE))


_NOT_HASHED = {"limit", "batch_size", "results_dir", "n_boot", "progress", "oracle", "closedbook"}


def run_config(config: DiagnoseConfig, cases_digest: str) -> dict:
    d = {k: v for k, v in asdict(config).items() if k not in _NOT_HASHED}
    d["cases"] = cases_digest
    d["template"] = None if config.template is None else hashlib.sha256(config.template_text().encode()).hexdigest()
    d["kind"] = "diagnose"
    return json.loads(json.dumps(d))  # as the manifest stores it (tuples become lists), so a rerun matches


def _digest(cases: list[Example]) -> str:
    blob = json.dumps([[c.id, c.question, c.answers, [asdict(d) for d in c.documents]] for c in cases], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# ------------------------------------------------------------------------------------------ run
def _packed(trial: Trial, lm, variant: Variant, budget: int | None) -> tuple[Trial, Prompt]:
    """Render a trial; with a budget, drop documents from the end until the prompt fits (as a pipeline that
    packs documents in order would); the gold may be among them."""
    prompt = render(trial.example, lm.tokenizer, variant, allow_empty=True)
    if budget is None or prompt.manifest.num_tokens <= budget:
        return trial, prompt
    docs = list(trial.example.documents)
    empty = render(replace(trial.example, documents=()), lm.tokenizer, variant, allow_empty=True)
    if empty.manifest.num_tokens > budget:
        raise ConfigError(f"max_prompt_tokens={budget} is smaller than the prompt without any document "
                          f"({empty.manifest.num_tokens} tokens for case {trial.case_id!r}); raise it.")
    while docs and prompt.manifest.num_tokens > budget:
        docs.pop()
        ex = replace(trial.example, documents=tuple(docs))
        prompt = render(ex, lm.tokenizer, variant, allow_empty=True)
    return replace(trial, example=ex), prompt


def score_answer(prediction: str, example: Example, asks_citations: bool) -> dict:
    """Correct, supported, wrong-source and abstained for one generated answer (first line)."""
    correct = best_subspan_em(prediction, example.answers)
    cites = parse_citations(prediction)
    gold_no = next((i + 1 for i, d in enumerate(example.documents) if d.is_gold), None)
    accepted = {normalize_answer(a) for a in example.answers}
    matched = [d for d in example.documents if not d.is_gold and d.answer
               and normalize_answer(d.answer) not in accepted and best_subspan_em(prediction, [d.answer])]
    cited_other = bool(cites) and gold_no not in cites
    wrong_source = not correct and (bool(matched) or (asks_citations and cited_other))
    source = matched[0] if matched else (example.documents[cites[0] - 1] if wrong_source and cited_other
                                         and 0 < cites[0] <= len(example.documents) else None)
    line = first_line(prediction)
    return {"correct": correct, "citations": cites,
            "cited_gold": gold_no is not None and gold_no in cites,
            "supported": (correct and gold_no in cites) if asks_citations else None,
            "wrong_source": wrong_source, "wrong_source_kind": (source.kind or "distractor") if source else None,
            "abstained": not correct and (not line or bool(_ABSTAIN.search(line)))}


def choices(example: Example) -> tuple[list[str], dict[str, Document]]:
    """Forced-choice candidates of a case: the first accepted answer, every other document's answer (when
    the case gives one) and the abstaining answer; and which document each distractor answer comes from."""
    accepted = {normalize_answer(a) for a in example.answers}
    source: dict[str, Document] = {}
    for d in example.documents:
        if not d.is_gold and d.answer and normalize_answer(d.answer) not in accepted:
            source.setdefault(d.answer, d)
    return [example.answers[0], *source, ABSTAIN_ANSWER], source


def score_choice(chosen: str, example: Example) -> dict:
    """The same measures as `score_answer` for a forced choice: right, a distractor's answer, or abstained."""
    _, source = choices(example)
    doc = source.get(chosen)
    return {"correct": chosen == example.answers[0], "citations": [], "cited_gold": None, "supported": None,
            "wrong_source": doc is not None, "wrong_source_kind": (doc.kind or "distractor") if doc else None,
            "abstained": chosen == ABSTAIN_ANSWER}


def _record(trial: Trial, prompt: Prompt) -> dict:
    m = prompt.manifest
    ex = trial.example
    span = m.gold_span
    region = (m.doc_spans[0][0], m.doc_spans[-1][1]) if m.doc_spans else None
    near = neighbours(ex) if m.gold_index is not None and trial.condition == "documents" else []
    return {"example_id": trial.id, "case_id": trial.case_id, "condition": trial.condition, "depth": trial.depth,
            "placement": trial.placement, "slot": trial.slot, "seed": trial.seed, "order": trial.order,
            "length": trial.length, "num_docs": len(ex.documents), "prompt_tokens": m.num_tokens,
            "gold_in_prompt": m.gold_index is not None, "gold_index": m.gold_index,
            "gold_token_start": span[0] if span else None, "gold_token_end": span[1] if span else None,
            "region_start": region[0] if region else None, "region_end": region[1] if region else None,
            "gold_region_depth": ((span[0] - region[0]) / max(region[1] - region[0], 1)) if span and region else None,
            "neighbours": [d.id for d in near], "neighbour_kinds": [d.kind for d in near],
            "conflict_adjacent": any(d.kind in ADVERSARIAL_KINDS for d in near),
            "doc_ids": list(m.doc_ids)}


def _score(lm, trials: list[Trial], prompts: list[Prompt], config: DiagnoseConfig) -> list[dict]:
    """Generate (or choose) each prompt's answer and score it."""
    if config.scoring == "choice":
        cands = [choices(t.example)[0] for t in trials]  # every case's own, whatever documents the prompt kept
        out = runner.choice(lm, prompts, cands, [0] * len(trials), config.batch_size)
        return [{"prediction": c[int(np.argmax(s.candidate_logliks))], "gold_rank": s.gold_rank,
                 "latency_s": round(s.latency_s, 4), **score_choice(c[int(np.argmax(s.candidate_logliks))], t.example)}
                for t, c, s in zip(trials, cands, out)]
    out = score_prompts(lm, [t.example for t in trials], prompts, config)  # transformers or vLLM
    return [{"prediction": s.prediction, "latency_s": round(s.latency_s, 4),
             **score_answer(s.prediction, t.example, config.asks_citations)} for t, s in zip(trials, out)]


def prepare_cases(config: DiagnoseConfig, cases: list[Example] | None = None) -> tuple[list[Example], list[Example]]:
    """All cases (padding comes from all of them) and the ones to run (the first `limit`), with the
    configured conflicting copies added."""
    if cases is None:
        if config.cases is None:
            raise ConfigError("no cases: give DiagnoseConfig(cases='file.jsonl') or pass them to run().")
        cases = read_cases(config.cases)
    if config.adversarial:
        answers = [a for c in cases for a in c.answers] + [d.answer for c in cases for d in c.documents if d.answer]
        cases = [with_adversarial(c, config.adversarial, answers) for c in cases]
    return cases, cases[:config.limit] if config.limit else cases


def trials_for(config: DiagnoseConfig, cases: list[Example], chosen: list[Example]) -> list[Trial]:
    out = []
    for c in chosen:
        fillers = [d for o in cases if o.id != c.id for d in o.documents if not d.is_gold]
        out += design(c, config.depths, config.orders, config.seeds, config.lengths, fillers,
                      config.oracle, config.closedbook)
    return out


def run(config: DiagnoseConfig, model: LoadedModel | None = None, cases: list[Example] | None = None):
    """Run (or resume) the diagnosis of `config` on one model; one row per prompt.  Records are appended one
    at a time under a hash of the config and the cases' content, so a killed run resumes."""
    import pandas as pd
    from tqdm.auto import tqdm

    all_cases, chosen = prepare_cases(config, cases)
    if model is not None and model.name != config.model:
        config = replace(config, model=model.name)
    trials = trials_for(config, all_cases, chosen)
    lm = model or load_model(config.model)
    rc = run_config(config, _digest(all_cases))
    store = ResultStore(config.results_dir, config_hash(rc), rc, lm.identity)
    variants = {c: config.variant(c) for c in ("documents", "oracle", "closedbook")}
    pending = [t for t in trials if t.id not in store]
    window = lm.window
    with tqdm(total=len(pending), desc=f"diagnose {config.model}", disable=not config.progress or not pending) as bar:
        for start in range(0, len(pending), config.batch_size):
            chunk = [_packed(t, lm, variants[t.condition], config.max_prompt_tokens)
                     for t in pending[start:start + config.batch_size]]
            fits = [p.manifest.num_tokens + config.max_new_tokens <= window for _, p in chunk]
            run_ = [(t, p) for (t, p), f in zip(chunk, fits) if f]
            outs = iter(_score(lm, [t for t, _ in run_], [p for _, p in run_], config) if run_ else [])
            for (t, p), f in zip(chunk, fits):
                rec = _record(t, p)
                if f:
                    rec.update(status="ok", **next(outs))
                else:
                    rec.update(status="too_long", prediction=None, correct=None, window=window)
                store.append(rec)
                bar.update(1)
    rows = [{**r, "model": config.model, "config_hash": store.dir.name} for r in store.records([t.id for t in trials])]
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------- measures
def measures(df):
    """Per placement (and length) and for the baselines: accuracy with its Wilson interval, supported
    accuracy, wrong-source and abstention rates, how often the gold made it into the prompt, where it
    started (token offset, and depth within the document region) and the prompt length."""
    import pandas as pd

    rows = []
    ok = df[df["status"] == "ok"]
    docs = df[df["condition"] == "documents"]
    for (length, p), g in docs.groupby(["length", "placement"]):
        rows.append(_measure_row(g, ok.loc[ok.index.intersection(g.index)], f"{100 * g['depth'].iloc[0]:.0f}%",
                                 int(length), int(p)))
    for cond in ("oracle", "closedbook"):
        g = df[df["condition"] == cond]
        if len(g):
            rows.append(_measure_row(g, ok.loc[ok.index.intersection(g.index)], cond, 1, None))
    return pd.DataFrame(rows)


def _measure_row(g, ok, label, length, placement) -> dict:
    acc, lo, hi = stats.proportion_interval(ok["correct"].astype(bool))  # scored prompts: never None
    sup = ok["supported"].dropna() if "supported" in ok else []
    return {"condition": label, "length": length, "placement": placement, "n": len(g), "scored": len(ok),
            "accuracy": acc, "ci_low": lo, "ci_high": hi,
            "supported": float(np.mean(sup.astype(bool))) if len(sup) else float("nan"),
            "wrong_source": float(ok["wrong_source"].mean()) if len(ok) else float("nan"),
            "abstained": float(ok["abstained"].mean()) if len(ok) else float("nan"),
            "gold_in_prompt": float(g["gold_in_prompt"].mean()),
            "gold_token_start": float(g["gold_token_start"].mean()) if g["gold_token_start"].notna().any() else float("nan"),
            "gold_region_depth": float(g["gold_region_depth"].mean()) if g["gold_region_depth"].notna().any() else float("nan"),
            "prompt_tokens": float(g["prompt_tokens"].mean()), "tokens_min": int(g["prompt_tokens"].min()),
            "tokens_max": int(g["prompt_tokens"].max())}


def adjacency_counts(df, length: int = 1):
    """How often each distractor sat right next to the gold, per placement (the Latin square's balance)."""
    import pandas as pd

    d = df[(df["condition"] == "documents") & (df["length"] == length)]
    rows = [{"case_id": r.case_id, "placement": r.placement, "document": n}
            for r in d.itertuples() for n in r.neighbours]
    return pd.DataFrame(rows).groupby(["case_id", "placement", "document"]).size().unstack("placement", fill_value=0)


def length_spread(df):
    """Per case and length: how far apart (tokens, and as a share of the mean) its prompts with documents are
    across placements and orders; only the order of the documents differs, so this stays small."""
    d = df[df["condition"] == "documents"]
    g = d.groupby(["case_id", "length"])["prompt_tokens"]
    out = (g.max() - g.min()).rename("tokens").to_frame()
    out["share"] = out["tokens"] / g.mean()
    return out.reset_index()


def case_table(df, length: int = 1) -> stats.PairedTable:
    """Cases x placements: each case's accuracy at each placement (mean over seeds and orders), cases with
    a prompt at every placement only."""
    d = df[(df["condition"] == "documents") & (df["length"] == length) & (df["status"] == "ok")]
    d = d[d["gold_in_prompt"]]
    wide = d.pivot_table(index="case_id", columns="placement", values="correct", aggfunc="mean")
    placements = sorted(df.loc[df["condition"] == "documents", "placement"].dropna().astype(int).unique())
    wide = wide.reindex(columns=placements).astype(float)
    full = wide.dropna()
    return stats.PairedTable(tuple(full.index), tuple(int(p) for p in placements), full.to_numpy(),
                             dropped=len(wide) - len(full))


def placement_effects(rows, n_boot: int = 2000, seed: int = 0) -> dict | None:
    """Accuracy by placement adjusted for a conflicting neighbour: a linear probability model of correctness
    on one indicator per placement plus "a conflicting document is next to the gold", fitted to every
    scored prompt with the gold, with a bootstrap over cases (each case's prompts resampled together).

    Returns the middle penalty (mean of the edge placements' coefficients minus the middle's), the
    neighbour's effect (None when it never varies or cannot be told apart from placement) and the adjusted
    edge and middle accuracies; None when fewer than 2 cases or 3 placements are there."""
    placements = sorted(int(p) for p in rows["placement"].dropna().unique())
    cases = sorted(rows["case_id"].unique())
    if len(placements) < 3 or len(cases) < 2:
        return None
    complete = [c for c in cases if set(rows.loc[rows["case_id"] == c, "placement"].astype(int)) == set(placements)]
    if len(complete) < 2:
        return None
    rows = rows[rows["case_id"].isin(complete)]
    adjacent = rows["conflict_adjacent"].astype(bool).to_numpy()
    X = np.stack([(rows["placement"].astype(int) == p).to_numpy() for p in placements], axis=1).astype(float)
    note, with_adj = "adjusted for a conflicting neighbour", adjacent.any() and not adjacent.all()
    if with_adj:
        Xa = np.column_stack([X, adjacent.astype(float)])
        if np.linalg.matrix_rank(Xa) < Xa.shape[1]:
            with_adj, note = False, "a conflicting neighbour goes with the placement itself, so it is not adjusted for"
        else:
            X = Xa
    else:
        note = "no conflicting documents to adjust for" if not adjacent.any() else "every prompt has a conflicting neighbour"
    y = rows["correct"].astype(float).to_numpy()
    case_of = rows["case_id"].to_numpy()
    index = {c: np.flatnonzero(case_of == c) for c in complete}
    edges, middle = stats.edges_and_middle(placements)
    e = [placements.index(p) for p in edges]
    mid = [placements.index(p) for p in middle]

    def fit(idx):
        beta = np.linalg.lstsq(X[idx], y[idx], rcond=None)[0]
        return beta[e].mean() - beta[mid].mean(), beta[-1] if with_adj else np.nan, beta

    point_pen, point_adj, beta = fit(np.arange(len(y)))
    rng = np.random.default_rng(seed)
    pens, adjs = [], []
    for _ in range(n_boot):
        idx = np.concatenate([index[c] for c in rng.choice(complete, size=len(complete))])
        if np.linalg.matrix_rank(X[idx]) < X.shape[1]:
            continue  # a draw without some placement or without variation in the neighbour: skip it
        pen, a, _ = fit(idx)
        pens.append(pen)
        adjs.append(a)
    if len(pens) < n_boot // 2:
        return None
    return {"penalty": stats.estimate_from_draws(point_pen, np.array(pens), len(complete)),
            "adjacent": stats.estimate_from_draws(point_adj, np.array(adjs), len(complete)) if with_adj else None,
            "note": note,
            "edges": float(beta[e].mean()), "middle": float(beta[mid].mean())}


# ------------------------------------------------------------------------------------- verdict
MISSING_SHARE = 0.2  # gold missing from at least this share of the prompts: packing or truncation
EDGE_MIN = 0.5  # position: the edges at least this accurate
WRONG_MAX = 0.25  # wrong everywhere: no placement above this accuracy
APART_MIN = 0.5  # interference: with no conflicting neighbour at least this accurate
LENGTH_BASE_MIN = 0.5  # length: the case's own length at least this accurate


@dataclass
class Rule:
    name: str
    fired: bool | None  # None: not testable with this design or data
    rule: str
    evidence: str
    next_step: str


@dataclass
class Diagnosis:
    model: str
    records: object  # DataFrame, one row per prompt
    measures: object  # DataFrame (`measures`)
    penalty: stats.Estimate | None
    rules: list[Rule] = field(default_factory=list)

    @property
    def verdict(self) -> list[str]:
        return [r.name for r in self.rules if r.fired]


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.0f}%"


def _ci(e: stats.Estimate) -> str:
    return f"{100 * e.value:+.1f} points [{100 * e.low:+.1f}, {100 * e.high:+.1f}], p = {e.p_value:.3g}"


def diagnose(df, n_boot: int = 2000, seed: int = 0) -> Diagnosis:
    """Measures, the middle penalty and the verdict rules for one model's records."""
    m = measures(df)
    docs = df[df["condition"] == "documents"]
    base = docs[docs["length"] == 1]
    ok_base = base[(base["status"] == "ok") & base["gold_in_prompt"]]
    rules = []

    missing = 1 - float(docs["gold_in_prompt"].mean())
    rules.append(Rule(
        "gold missing from the prompt (packing or truncation, not position)", missing >= MISSING_SHARE - 1e-9,
        f"the gold is missing from at least {_pct(MISSING_SHARE)} of the prompts with documents",
        f"gold missing from {_pct(missing)} of {len(docs)} prompts" + "".join(
            f"; {r['condition']} {_pct(1 - r['gold_in_prompt'])}" for _, r in m[m["placement"].notna()].iterrows()
            if r["gold_in_prompt"] < 1),
        "raise the context budget, compress or drop low-ranked documents before packing, or put the best-ranked "
        "documents first so truncation cuts the weakest ones."))

    eff = placement_effects(ok_base, n_boot, seed)
    penalty = eff["penalty"] if eff else None
    position_fired = None
    if eff is None:
        evidence = (f"not testable: {ok_base['case_id'].nunique()} cases with the gold in the prompt at every placement "
                    "(needs 2 cases and 3 placements)")
    else:
        position_fired = penalty.low > 0 and eff["edges"] >= EDGE_MIN
        evidence = (f"middle penalty {_ci(penalty)} over {penalty.n} cases ({eff['note']}); edge accuracy "
                    f"{_pct(eff['edges'])}, middle {_pct(eff['middle'])}")
    rules.append(Rule(
        "position sensitivity", position_fired,
        f"the edges are at least {_pct(EDGE_MIN)} accurate and the middle penalty (edges minus middle, paired "
        "bootstrap over cases, adjusted for a conflicting neighbour) has a 95% interval above 0",
        evidence,
        "put the best evidence first or last (reorder, e.g. u_shape / langchain in notebook 04), repeat the question "
        "after the documents, or cut the number of documents."))

    by_place = ok_base.groupby("placement")["correct"].mean()
    oracle = df[(df["condition"] == "oracle") & (df["status"] == "ok")]["correct"]
    oracle_acc = float(oracle.mean()) if len(oracle) else float("nan")
    fired = bool(len(by_place)) and float(by_place.max()) <= WRONG_MAX
    rules.append(Rule(
        "wrong everywhere (evidence, question or reasoning, not position)", fired if len(by_place) else None,
        f"no placement is more than {_pct(WRONG_MAX)} accurate",
        (f"accuracy by placement {', '.join(_pct(v) for v in by_place)}; oracle (gold alone) {_pct(oracle_acc)}"
         if len(by_place) else "not testable: no scored prompt with the gold"),
        ("even the gold alone fails: check that the gold document really states the answer in words the question "
         "uses, that the accepted answers are complete, and whether the model can do this task (try a larger one)."
         if oracle_acc != oracle_acc or oracle_acc <= WRONG_MAX else
         "the gold alone works but not among the other documents: filter or rerank distractors, or shorten the "
         "context.")))

    adj = eff["adjacent"] if eff else None
    if adj is not None:
        apart = float(ok_base.loc[~ok_base["conflict_adjacent"].astype(bool), "correct"].mean())
        fired = adj.high < 0 and apart >= APART_MIN  # may fire beside position: both can be at work
        evidence = (f"accuracy {_pct(apart)} with no conflicting neighbour, "
                    f"{_pct(float(ok_base.loc[ok_base['conflict_adjacent'].astype(bool), 'correct'].mean()))} next to "
                    f"one; effect of a conflicting neighbour at the same placement {_ci(adj)} over {adj.n} cases")
    else:
        fired = None
        evidence = "not testable: " + (eff["note"] if eff else "too few cases or placements with the gold")
    kinds = ok_base.loc[ok_base["wrong_source"].astype(bool), "wrong_source_kind"].value_counts()
    if len(kinds):
        evidence += "; wrong-source answers came from: " + ", ".join(f"{k} {v}" for k, v in kinds.items())
    rules.append(Rule(
        "interference from a conflicting document", fired,
        f"at least {_pct(APART_MIN)} accurate with no conflicting document next to the gold, significantly less "
        "accurate with one next to it at the same placement (bootstrap over cases)",
        evidence,
        "remove superseded versions at indexing time, filter by metadata (region, role, date) before retrieval, "
        "or tell the model how to resolve conflicts (newest version wins) in the instruction."))

    lengths = sorted(docs["length"].unique())
    if len(lengths) > 1:
        long = int(lengths[-1])
        okl = docs[(docs["status"] == "ok") & docs["gold_in_prompt"]]
        wide = okl.pivot_table(index="case_id", columns="length", values="correct", aggfunc="mean")
        wide = wide.reindex(columns=[1, long]).dropna()
        if len(wide) >= 2:
            tl = stats.PairedTable(tuple(wide.index), (1, long), wide.to_numpy().astype(float))
            diff = stats.difference(tl, 1, long, n_boot=n_boot, seed=seed)
            base_acc = float(tl.column(1).mean())
            fired = diff.low > 0 and base_acc >= LENGTH_BASE_MIN and not position_fired
            evidence = (f"accuracy {_pct(base_acc)} at the cases' own length, {_pct(float(tl.column(long).mean()))} "
                        f"at x{long}; difference {_ci(diff)} over {len(tl.ids)} cases")
        else:
            fired, evidence = None, "not testable: fewer than 2 cases scored at both lengths"
    else:
        fired, evidence = None, "not testable: one length only (run with lengths=(1, 2))"
    rules.append(Rule(
        "length, not position", fired,
        f"at least {_pct(LENGTH_BASE_MIN)} accurate at the cases' own length, significantly less accurate at the "
        "longest (paired bootstrap over cases), and no position sensitivity at the own length",
        evidence,
        "send fewer or shorter documents (compression, notebook 05), or use a model trained for longer contexts."))
    return Diagnosis(str(df["model"].iloc[0]) if "model" in df and len(df) else "", df, m, penalty, rules)


def compare_models(a: Diagnosis, b: Diagnosis, n_boot: int = 2000, seed: int = 0):
    """Do two models differ in their position profile on the same cases?  (`report.compare_tables` on
    each case's accuracy by placement.)"""
    from .report import compare_tables

    ta, tb = case_table(a.records), case_table(b.records)
    return compare_tables(ta, tb, a.model, b.model, n_boot=n_boot, seed=seed, unit="points", what="cases",
                          where="placements")


# -------------------------------------------------------------------------------------- report
def to_markdown(diagnoses: list[Diagnosis], config: DiagnoseConfig, comparison=None, figures=()) -> str:
    d0 = diagnoses[0]
    docs = d0.records[d0.records["condition"] == "documents"]
    own = docs[docs["length"] == 1]
    rows = own.groupby("case_id")["order"].nunique()
    spread = length_spread(d0.records)
    lines = [f"# Position diagnosis: {config.cases or 'cases'}", "",
             f"{docs['case_id'].nunique()} cases; gold at depths {', '.join(f'{100 * x:.0f}%' for x in config.depths)} "
             f"of the document region; {rows.min()}{'' if rows.min() == rows.max() else f'-{rows.max()}'} distractor orders (Latin-square rows) x "
             f"{len(config.seeds)} seed(s) per placement; lengths {', '.join(f'x{x}' for x in config.lengths)}; "
             f"template: {config.template or 'ours' + (' (asks for citations)' if config.cite else '')}; "
             f"{len(d0.records)} prompts per model.", "",
             f"Prompt length within a case, across placements and orders: at most {spread['tokens'].max():.0f} tokens "
             f"({100 * spread['share'].max():.1f}%) apart. Depth is set by the gold's slot among the documents; the table "
             "gives the token offset where the gold actually starts and its depth within the document region."]
    for d in diagnoses:
        lines += ["", f"## {d.model}", "", "### Measures by placement", "",
                  "| condition | x | n | accuracy [95% CI] | supported | wrong source | abstained | gold in prompt "
                  "| gold starts at token | depth in region | prompt tokens (min-max) |",
                  "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
        for _, r in d.measures.iterrows():
            start = "" if r["gold_token_start"] != r["gold_token_start"] else f"{r['gold_token_start']:.0f}"
            depth = "" if r["gold_region_depth"] != r["gold_region_depth"] else f"{r['gold_region_depth']:.2f}"
            lines.append(f"| {r['condition']} | {r['length']} | {r['n']} | {_pct(r['accuracy'])} [{_pct(r['ci_low'])}, "
                         f"{_pct(r['ci_high'])}] | {_pct(r['supported'])} | {_pct(r['wrong_source'])} | "
                         f"{_pct(r['abstained'])} | {_pct(r['gold_in_prompt'])} | {start} | {depth} | "
                         f"{r['prompt_tokens']:.0f} ({r['tokens_min']}-{r['tokens_max']}) |")
        if d.penalty is not None:
            lines += ["", f"Middle penalty (edges minus middle, adjusted for a conflicting neighbour, bootstrap "
                               f"over cases): {_ci(d.penalty)}."]
        lines += ["", "### Verdict", ""]
        fired = [r for r in d.rules if r.fired]
        lines.append("**" + ("; ".join(r.name for r in fired) if fired else
                             "no rule fired: no clear failure pattern at this sample size") + "**")
        lines += ["", "| rule | fired | when it fires | evidence | next step |", "|---|---|---|---|---|"]
        for r in d.rules:
            state = {True: "**yes**", False: "no", None: "not testable"}[r.fired]
            lines.append(f"| {r.name} | {state} | {r.rule} | {r.evidence} | {r.next_step if r.fired else ''} |")
    if comparison is not None:
        lines += ["", "## Comparison of the two models", "", "```", comparison.text, "```"]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures if str(f).endswith(".png")]
    return "\n".join(lines) + "\n"


def write_report(diagnoses: list[Diagnosis], config: DiagnoseConfig, out_dir: str | Path, comparison=None) -> dict:
    """report.md and figures (accuracy and failure rates by placement, one line per model) in `out_dir`."""
    from .plots import diagnosis_curves, save_figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = save_figure(diagnosis_curves([(d.model, d.measures) for d in diagnoses]), "diagnosis", out)
    text = to_markdown(diagnoses, config, comparison, figs)
    (out / "report.md").write_text(text, encoding="utf-8")
    return {"markdown": text, "figures": figs, "path": out / "report.md"}
