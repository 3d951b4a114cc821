"""The design of a diagnosis: its config, and for each case the gold at fixed relative depths of the
document region among distractors in the orders of a cyclic Latin square (row r of a seed's square rotates
the seed's shuffled distractors by r, the same rows at every placement, so over a full square each
distractor sits next to the gold equally often at every placement), plus the oracle and closed-book
prompts."""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ..data.generate import ADVERSARIAL_KINDS
from ..errors import ConfigError, DataError, check_distinct
from ..models import DEFAULT_MODEL
from ..prompts import Variant, check_template
from ..types import Document, Example
from .cases import read_cases, with_adversarial

DEPTHS = (0.0, 0.25, 0.5, 0.75, 0.95)


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
    limit: int | None = None  # the first `limit` cases after `skip`
    skip: int = 0  # the first `skip` cases are left out, a pilot's (`planning.pilot_and_study`); they still pad
    batch_size: int = 4
    results_dir: str = "results/diagnose"
    progress: bool = True

    def __post_init__(self):
        for name in ("depths", "seeds", "lengths", "adversarial"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_distinct(depths=self.depths, seeds=self.seeds, lengths=self.lengths, adversarial=self.adversarial)
        if not self.depths or any(not 0 <= d <= 1 for d in self.depths) or list(self.depths) != sorted(set(self.depths)):
            raise ConfigError(f"depths must be increasing fractions in [0, 1], got {self.depths}.")
        if not self.seeds or not self.lengths or min(self.lengths) < 1 or self.lengths[0] != 1:
            raise ConfigError("seeds and lengths need at least one value; lengths start at 1 (the case as it is).")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be at least 1 (got {self.limit}); use None for all cases.")
        if self.orders is not None and self.orders < 1:
            raise ConfigError(f"orders must be at least 1 (or None for the full Latin square), got {self.orders}.")
        bad = [k for k in self.adversarial if k not in ADVERSARIAL_KINDS]
        if bad:
            raise ConfigError(f"unknown adversarial kinds {bad}: use {ADVERSARIAL_KINDS}.")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ConfigError("max_prompt_tokens must be positive (or None for no budget).")
        if self.scoring not in ("generate", "choice"):
            raise ConfigError(f"a diagnosis scores by 'generate' or 'choice', not {self.scoring!r} (a log-likelihood "
                              "alone does not say which answer the model gives).")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("max_new_tokens and batch_size must be at least 1.")
        if self.skip < 0:
            raise ConfigError(f"skip must be 0 or more, got {self.skip}.")
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


def prepare_cases(config: DiagnoseConfig, cases: list[Example] | None = None) -> tuple[list[Example], list[Example]]:
    """All cases (padding comes from all of them) and the ones to run (the first `limit` after `skip`), with
    the configured conflicting copies added."""
    if cases is None:
        if config.cases is None:
            raise ConfigError("no cases: give DiagnoseConfig(cases='file.jsonl') or pass them to run().")
        cases = read_cases(config.cases)
    if config.adversarial:
        answers = [a for c in cases for a in c.answers] + [d.answer for c in cases for d in c.documents if d.answer]
        cases = [with_adversarial(c, config.adversarial, answers) for c in cases]
    if len(cases) <= config.skip:
        raise ConfigError(f"{len(cases)} cases; skipping {config.skip} leaves none to run.")
    end = config.skip + config.limit if config.limit else None
    return cases, cases[config.skip:end]


def trials_for(config: DiagnoseConfig, cases: list[Example], chosen: list[Example]) -> list[Trial]:
    """Every trial of the `chosen` cases; padding documents come from all `cases`."""
    out = []
    for c in chosen:
        fillers = [d for o in cases if o.id != c.id for d in o.documents if not d.is_gold]
        out += design(c, config.depths, config.orders, config.seeds, config.lengths, fillers,
                      config.oracle, config.closedbook)
    return out

