"""Compression strategies against budgets, end to end: each question with its gold at each position is
compressed to each budget by each strategy, scored by forced choice among every document's answer (so a
lost gold can only be guessed), and checked for whether its evidence survived."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .compression import METHODS, compress, plan_budget, survival
from .data import generate_fictional_qa
from .errors import ConfigError, check_distinct
from .models import DEFAULT_MODEL, LoadedModel, load_model
from .ordering import gold_at
from .prompts import Variant, render
from .retrieval import bm25_scores
from .runner import target
from .study import Item, Study
from .types import Example

NONE = "none"  # the uncompressed prompt, for reference


@dataclass(frozen=True)
class CompressionConfig:
    """A compression study on the generated fictional QA: budgets are prompt-token ceilings."""

    model: str = DEFAULT_MODEL
    num_docs: int = 10
    positions: tuple[int, ...] = (0, 4, 9)
    budgets: tuple[int, ...] = (250, 450)
    strategies: tuple[str, ...] = METHODS
    reserve: int = 32
    limit: int = 3
    seed: int = 0
    sentences_per_doc: int = 3
    template: str = "ours"
    chat: bool | None = None
    batch_size: int = 4
    results_dir: str = "results"
    progress: bool = True

    def __post_init__(self):
        for name in ("positions", "budgets", "strategies"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_distinct(positions=self.positions, budgets=self.budgets, strategies=self.strategies)
        bad = [s for s in self.strategies if s not in METHODS]
        if bad:
            raise ConfigError(f"unknown compression strategies {bad}: use {list(METHODS)}.")
        bad = [p for p in self.positions if not 0 <= p < self.num_docs]
        if bad:
            raise ConfigError(f"gold positions {bad} are out of range for {self.num_docs} documents.")
        if not self.positions or self.limit < 1:
            raise ConfigError("give at least one gold position and a limit of at least 1.")
        if self.num_docs < 2:
            raise ConfigError("forced choice among one document's answer is always right (chance is 100%); use at "
                              "least two documents.")

    def conditions(self) -> list[tuple[str, int | None, int]]:
        out = [(NONE, None, p) for p in self.positions]
        return out + [(s, b, p) for s in self.strategies for b in self.budgets for p in self.positions]


class Compression(Study):
    """The compression study on the one loop: a condition per strategy x budget x gold position, scored by
    forced choice among every document's answer (compression cannot shrink the candidates)."""

    kind = "compression"
    listing = ("positions", "budgets", "strategies")
    scoring = "choice"

    def __init__(self, config: CompressionConfig, compressor: LoadedModel | None = None):
        super().__init__(config)
        self.compressor = compressor
        self.cache: dict = {}  # LM strategies' per-document work, shared across gold positions
        self.variant = Variant(template=config.template, chat=config.chat)

    def hashed(self) -> dict:
        return {**super().hashed(), "data": "generated-qa",
                "compressor": self.compressor.name if self.compressor is not None else None}

    def conditions(self) -> list[dict]:
        return [{"strategy": s, "budget": b, "position": p} for s, b, p in self.config.conditions()]

    @functools.cache
    def units(self) -> list[Example]:
        c = self.config
        return generate_fictional_qa(c.limit, c.num_docs, c.seed, c.sentences_per_doc)

    def prepare(self, lm, todo) -> None:
        for b in self.config.budgets:  # a budget the model cannot hold fails before anything runs
            plan_budget(lm, self.units()[0], self.variant, self.config.reserve, b)

    def item(self, lm, condition: dict, example: Example) -> Item:
        s, b, p = condition["strategy"], condition["budget"], condition["position"]
        e = gold_at(example, p)
        if s == NONE:
            shown, extra = e, {"seconds": 0.0}
        else:
            budget = plan_budget(lm, e, self.variant, self.config.reserve, b)
            scores = bm25_scores(e.question, e.documents) if s == "drop_lowest" else None
            c = compress(lm, e, budget, s, self.variant, scores, self.compressor, self.cache)
            shown, extra = c.example, {"seconds": round(c.seconds, 4),
                                       "kept_docs": sum(k["status"] != "dropped" for k in c.kept)}
        prompt = render(shown, lm.tokenizer, self.variant, allow_empty=True)
        # position: where the gold was placed; gold_position (from survival): where it is after compression
        fields = {"condition": f"{s}@{b}:{p}" if b else f"{s}:{p}", **condition, **survival(e, shown), **extra}
        return Item(e.id, prompt, target(e, "choice"), fields)


def run(config: CompressionConfig, model: LoadedModel | None = None, compressor: LoadedModel | None = None):
    """Run (or resume) every condition; one row per question, strategy, budget and gold position.
    LM strategies use `compressor` (default: the model itself); their per-document work is shared across
    gold positions, which only reorder the documents."""
    return Compression(config, compressor).run(model or load_model(config.model))


def summarize(df):
    """Per strategy and budget: accuracy (Wilson 95%), prompt tokens kept, how often the answer string and
    the gold's answer sentence survived, accuracy with the evidence kept and with it lost, and seconds of
    compression per example."""
    import pandas as pd

    from .stats import proportion_interval

    rows = []
    for (s, b), g in df.groupby(["strategy", "budget"], sort=False, dropna=False):
        acc, lo, hi = proportion_interval(g["correct"])
        kept, lost = g[g["sentence_kept"]], g[~g["sentence_kept"]]
        rows.append({"strategy": s, "budget": None if pd.isna(b) else int(b), "n": len(g), "accuracy": acc,
                     "ci_low": lo, "ci_high": hi, "prompt_tokens": float(g["prompt_tokens"].mean()),
                     "answer_survival": float(g["answer_kept"].mean()),
                     "evidence_survival": float(g["sentence_kept"].mean()),
                     "accuracy_evidence_kept": float(kept["correct"].mean()) if len(kept) else float("nan"),
                     "n_evidence_lost": len(lost),
                     "accuracy_evidence_lost": float(lost["correct"].mean()) if len(lost) else float("nan"),
                     "seconds": float(g["seconds"].mean())})
    return pd.DataFrame(rows)


def effects(df):
    """Each strategy at each budget minus the uncompressed prompt, on every measure the records hold, paired
    over questions (each question's gold positions averaged; `stats.versus_baseline`)."""
    from .stats import versus_baseline

    return versus_baseline(arms(df), NONE, condition="arm")


def arms(df):
    """The records with an `arm` column: the strategy and budget (`extractive@250`), or `none` uncompressed."""
    return df.assign(arm=[s if s == NONE else f"{s}@{int(b)}" for s, b in zip(df["strategy"], df["budget"])])


def by_position(df):
    """Accuracy (Wilson 95%) by gold position for each strategy and budget: does compression flatten the
    position curve?"""
    import pandas as pd

    from .stats import proportion_interval

    rows = []
    for (s, b, p), g in df.groupby(["strategy", "budget", "position"], sort=False, dropna=False):
        acc, lo, hi = proportion_interval(g["correct"])
        rows.append({"strategy": s, "budget": None if pd.isna(b) else int(b), "position": int(p), "n": len(g),
                     "accuracy": acc, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)
