"""Running a diagnosis on the one loop: each trial of the design packed into a prompt (under the user's
budget), answered by generation or by forced choice among the answer, the distractors' answers and "I don't
know", and scored for accuracy, citation support, wrong-source answers and abstentions."""
from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import asdict, replace

from ..data.generate import ADVERSARIAL_KINDS
from ..errors import ConfigError
from ..metrics import best_subspan_em, first_line, normalize_answer, parse_citations
from ..models import LoadedModel, load_model
from ..prompts import Prompt, Variant, render
from ..runner import target
from ..study import Item, Study
from ..types import Document, Example
from .design import DiagnoseConfig, Trial, neighbours, prepare_cases, trials_for

ABSTAIN_ANSWER = "I don't know"  # forced choice: the abstaining candidate
_ABSTAIN = re.compile(
    r"\b(i do ?n[o']?t know|i don'?t know|not (?:mentioned|stated|provided|given|specified|available|found)|"
    r"(?:can ?not|can'?t|unable to) (?:be )?(?:answer|determine|find|say|tell)|no (?:information|answer)|"
    r"unknown|unanswerable|not enough (?:information|context))\b", re.IGNORECASE)


def _packed(trial: Trial, lm, variant: Variant, budget: int | None) -> tuple[Example, Prompt]:
    """Render a trial; with a budget, drop documents from the end until the prompt fits (as a pipeline that
    packs documents in order would); the gold may be among them.  Returns the example as shown."""
    ex = trial.example
    prompt = render(ex, lm.tokenizer, variant, allow_empty=True)
    if budget is not None and prompt.manifest.num_tokens > budget:
        empty = render(replace(ex, documents=()), lm.tokenizer, variant, allow_empty=True)
        if empty.manifest.num_tokens > budget:
            raise ConfigError(f"max_prompt_tokens={budget} is smaller than the prompt without any document "
                              f"({empty.manifest.num_tokens} tokens for case {trial.case_id!r}); raise it.")
    while budget is not None and ex.documents and prompt.manifest.num_tokens > budget:
        ex = replace(ex, documents=ex.documents[:-1])
        prompt = render(ex, lm.tokenizer, variant, allow_empty=True)
    return ex, prompt


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


def _digest(cases: list[Example]) -> str:
    blob = json.dumps([[c.id, c.question, c.answers, [asdict(d) for d in c.documents]] for c in cases], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class DiagnoseStudy(Study):
    """A diagnosis on the one loop: one run config (the config and the cases' content), its trials as units,
    keyed by trial id."""

    kind = "diagnose"
    listing = ("oracle", "closedbook")
    key = "trial_id"

    def __init__(self, config: DiagnoseConfig, cases: list[Example] | None = None):
        super().__init__(config)
        self.all_cases, self.chosen = prepare_cases(config, cases)
        self.variants = {c: config.variant(c) for c in ("documents", "oracle", "closedbook")}

    def hashed(self) -> dict:
        c = self.config
        return {**super().hashed(), "cases": _digest(self.all_cases),
                "template": None if c.template is None else hashlib.sha256(c.template_text().encode()).hexdigest()}

    @functools.cache
    def units(self) -> list[Trial]:
        return trials_for(self.config, self.all_cases, self.chosen)

    def item(self, lm, condition: dict, trial: Trial) -> Item:
        ex, prompt = _packed(trial, lm, self.variants[trial.condition], self.config.max_prompt_tokens)
        m = prompt.manifest
        span = m.gold_span
        region = (m.doc_spans[0][0], m.doc_spans[-1][1]) if m.doc_spans else None
        near = neighbours(ex) if m.gold_index is not None and trial.condition == "documents" else []
        fields = {"case_id": trial.case_id, "condition": trial.condition, "depth": trial.depth,
                  "placement": trial.placement, "slot": trial.slot, "seed": trial.seed, "order": trial.order,
                  "length": trial.length, "num_docs": len(ex.documents),
                  "region_start": region[0] if region else None, "region_end": region[1] if region else None,
                  "gold_region_depth": (span[0] - region[0]) / max(region[1] - region[0], 1) if span and region
                  else None,
                  "neighbours": [d.id for d in near], "neighbour_kinds": [d.kind for d in near],
                  "conflict_adjacent": any(d.kind in ADVERSARIAL_KINDS for d in near), "doc_ids": list(m.doc_ids)}
        # forced choice: the case's own candidates among the documents the prompt kept
        tgt = target(ex, self.scoring, (choices(ex)[0], 0) if self.scoring == "choice" else None)
        return Item(trial.id, prompt, tgt, fields, example=ex)

    def outcome(self, item: Item, scored) -> dict:
        ex = item.example
        if self.scoring == "choice":
            chosen = item.target.candidates[scored.chosen]
            return {"prediction": chosen, **score_choice(chosen, ex)}
        return score_answer(scored.prediction, ex, self.config.asks_citations)


def run(config: DiagnoseConfig, model: LoadedModel | None = None, cases: list[Example] | None = None):
    """Run (or resume) the diagnosis of `config` on one model; one row per prompt.  Records are appended one
    at a time under a hash of the config, the cases' content and the model's run identity, so a killed run
    resumes."""
    study = DiagnoseStudy(config, cases)
    study.units()
    return study.run(model or load_model(config.model))
