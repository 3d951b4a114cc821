"""Compression strategies against budgets, end to end: each question with its gold at each position is
compressed to each budget by each strategy, scored by forced choice among every document's answer (so a
lost gold can only be guessed), and checked for whether its evidence survived."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .compression import STRATEGIES, compress, plan_budget, survival
from .errors import ConfigError
from .experiment import candidates, config_hash
from .models import DEFAULT_MODEL, LoadedModel, load_model
from .ordering import gold_at
from .prompts import Variant, render
from .runner import choice
from .store import ResultStore

NONE = "none"  # the uncompressed prompt, for reference


@dataclass(frozen=True)
class CompressionConfig:
    """A compression study on the generated fictional QA: budgets are prompt-token ceilings."""

    model: str = DEFAULT_MODEL
    num_docs: int = 10
    positions: tuple[int, ...] = (0, 4, 9)
    budgets: tuple[int, ...] = (250, 450)
    strategies: tuple[str, ...] = STRATEGIES
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
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            raise ConfigError(f"unknown compression strategies {bad}: use {list(STRATEGIES)}.")
        bad = [p for p in self.positions if not 0 <= p < self.num_docs]
        if bad:
            raise ConfigError(f"gold positions {bad} are out of range for {self.num_docs} documents.")
        if not self.positions or self.limit < 1:
            raise ConfigError("give at least one gold position and a limit of at least 1.")

    def conditions(self) -> list[tuple[str, int | None, int]]:
        out = [(NONE, None, p) for p in self.positions]
        return out + [(s, b, p) for s in self.strategies for b in self.budgets for p in self.positions]


_NOT_HASHED = {"limit", "batch_size", "results_dir", "progress", "positions", "budgets", "strategies"}


def run(config: CompressionConfig, model: LoadedModel | None = None, compressor: LoadedModel | None = None):
    """Run (or resume) every condition; one row per question, strategy, budget and gold position.
    LM strategies use `compressor` (default: the model itself); their per-document work is shared across
    gold positions, which only reorder the documents."""
    import pandas as pd
    from tqdm.auto import tqdm

    from .data import generate_fictional_qa
    from .retrieval import bm25_scores

    if model is not None and model.name != config.model:
        config = replace(config, model=model.name)
    lm = model or load_model(config.model)
    variant = Variant(template=config.template, chat=config.chat)
    examples = generate_fictional_qa(config.limit, config.num_docs, config.seed, config.sentences_per_doc)
    for b in config.budgets:  # a budget the model cannot hold fails before anything runs
        plan_budget(lm, examples[0], variant, config.reserve, b)
    base = {k: v for k, v in asdict(config).items() if k not in _NOT_HASHED}
    base.update(data="generated-qa", kind="compression",
                compressor=(compressor or lm).name if compressor is not None else None)
    stores = {}
    for s, b, p in config.conditions():
        rc = {**base, "strategy": s, "budget": b, "position": p}
        stores[(s, b, p)] = ResultStore(config.results_dir, config_hash(rc), rc, lm.identity)
    todo = [(c, e) for c in stores for e in examples if e.id not in stores[c]]
    bar = tqdm(total=len(todo), desc="compression", disable=not config.progress or not todo)
    cache: dict = {}
    for (s, b, p), store in stores.items():
        pending = [e for e in examples if e.id not in store]
        for start in range(0, len(pending), config.batch_size):
            chunk = [gold_at(e, p) for e in pending[start:start + config.batch_size]]
            recs, prompts = [], []
            for e in chunk:
                if s == NONE:
                    shown, extra = e, {"prompt_tokens": None, "seconds": 0.0}
                else:
                    budget = plan_budget(lm, e, variant, config.reserve, b)
                    scores = bm25_scores(e.question, e.documents) if s == "drop_lowest" else None
                    c = compress(lm, e, budget, s, variant, scores, compressor, cache)
                    shown, extra = c.example, {"seconds": round(c.seconds, 4),
                                               "kept_docs": sum(k["status"] != "dropped" for k in c.kept)}
                prompt = render(shown, lm.tokenizer, variant, allow_empty=True)
                extra["prompt_tokens"] = prompt.manifest.num_tokens
                # position: where the gold was placed; gold_position (from survival): where it is after compression
                recs.append({"example_id": e.id, "condition": f"{s}@{b}:{p}" if b else f"{s}:{p}", "position": p,
                             "strategy": s, "budget": b, **survival(e, shown), **extra})
                prompts.append(prompt)
            cands = [candidates(e) for e in chunk]  # every document's answer: compression cannot shrink it
            scored = choice(lm, prompts, [c[0] for c in cands], [c[1] for c in cands], config.batch_size)
            for rec, sc in zip(recs, scored):
                rec.update(status="ok", correct=sc.gold_rank == 1, gold_loglik=sc.gold_loglik,
                           num_candidates=len(sc.candidate_logliks))
                store.append(rec)
                bar.update(1)
    bar.close()
    ids = [e.id for e in examples]
    rows = [{**r, "model": config.model} for st in stores.values() for r in st.records(ids)]
    return pd.DataFrame(rows)


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
