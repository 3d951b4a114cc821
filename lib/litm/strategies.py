"""Ordering and prompt-variant strategies on a retrieval pipeline, end to end: for each question a pool of
documents is scored by a retriever, the top k kept, put in order by each strategy (or with the gold placed
by hand, the oracle placements), rendered in each prompt variant and scored by the model."""
from __future__ import annotations

import random
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .data import generate_fictional_qa, read_examples
from .errors import ConfigError
from .experiment import SCORINGS, cached_file_sha256, candidates, config_hash, needed_tokens, score_prompts
from .metrics import best_subspan_em, parse_citations
from .models import DEFAULT_MODEL, LoadedModel, load_model
from .ordering import STRATEGIES, arrange, gold_at, ranked_top_k, with_num_documents
from .prompts import Prompt, Variant, render
from .retrieval import RETRIEVERS, scores as retrieval_scores
from .store import ResultStore
from .types import Example

STRATEGY_RETRIEVERS = RETRIEVERS + ("attention",)  # attention: the model's calibrated attention (litm.attention)
BIAS_EXAMPLES = 3  # held-out questions for the attention retriever's positional bias
# Prompt variants by name: the paper's layout, query-aware contextualisation, the question repeated after
# the documents with a grounding instruction, XML documents, and an instruction to cite.
VARIANTS = {"after": {}, "both": {"query_aware": True}, "repeat": {"repeat": True}, "xml": {"doc_format": "xml"},
            "cite": {"cite": True}}
ORACLE_PREFIX = "gold@"


@dataclass(frozen=True)
class StrategyConfig:
    """A strategies experiment.  The first variant crosses every strategy and oracle placement; the
    other variants run with the first strategy only, unless `cross` asks for every pair."""

    model: str = DEFAULT_MODEL
    data: str = "generated"  # or a Liu et al. QA file: each record's documents are the pool
    pool: int = 20  # candidate documents per question (the gold and distractors)
    k: int = 10  # kept after retrieval
    retriever: str = "bm25"  # bm25 | dense | data | attention
    strategies: tuple[str, ...] = ("rank", "reverse", "u_shape", "langchain", "random")
    oracle_positions: tuple[int, ...] = (0, 4, 9)  # the gold placed by hand among the k (0-based)
    variants: tuple[str, ...] = ("after", "both", "repeat", "xml")
    cross: bool = False
    scoring: str = "choice"  # choice | loglik | generate (citations are parsed from generations only)
    limit: int | None = 12
    seed: int = 0
    sentences_per_doc: int = 3
    template: str = "ours"
    chat: bool | None = None
    max_new_tokens: int = 32
    batch_size: int = 4
    results_dir: str = "results"
    progress: bool = True

    def __post_init__(self):
        for name in ("strategies", "oracle_positions", "variants"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        bad = [s for s in self.strategies if s not in STRATEGIES or s == "evidence_first"]
        if bad:
            raise ConfigError(f"unknown or unsupported strategies {bad}: use {[s for s in STRATEGIES if s != 'evidence_first']}"
                              " (evidence_first needs a second score: use litm.ordering.reorder).")
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad:
            raise ConfigError(f"unknown prompt variants {bad}: use {list(VARIANTS)}.")
        if self.retriever not in STRATEGY_RETRIEVERS:
            raise ConfigError(f"unknown retriever {self.retriever!r}: use one of {STRATEGY_RETRIEVERS}.")
        if self.scoring not in SCORINGS:
            raise ConfigError(f"unknown scoring {self.scoring!r}: use one of {SCORINGS}.")
        if not 1 <= self.k <= self.pool:
            raise ConfigError(f"k={self.k} but the pool holds {self.pool} documents; choose k in 1..{self.pool}.")
        bad = [p for p in self.oracle_positions if not 0 <= p < self.k]
        if bad:
            raise ConfigError(f"oracle positions {bad} are out of range for k={self.k} (0..{self.k - 1}).")
        if not self.variants or not (self.strategies or self.oracle_positions):
            raise ConfigError("nothing to run: give at least one variant and one strategy or oracle position.")
        if self.limit is None and self.data == "generated":
            raise ConfigError("generated data needs a limit (how many questions to make).")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be at least 1 (got {self.limit}).")

    def arrangements(self) -> list[str]:
        return list(self.strategies) + [f"{ORACLE_PREFIX}{p}" for p in self.oracle_positions]

    def conditions(self) -> list[tuple[str, str]]:
        """(arrangement, variant) pairs to run."""
        base = self.variants[0]
        if self.cross:
            return [(a, v) for v in self.variants for a in self.arrangements()]
        first = self.strategies[0] if self.strategies else self.arrangements()[0]
        return [(a, base) for a in self.arrangements()] + [(first, v) for v in self.variants[1:]]


_NOT_HASHED = {"limit", "batch_size", "results_dir", "progress", "strategies", "oracle_positions", "variants",
               "cross"}


def run_config(config: StrategyConfig, arrangement: str, variant: str) -> dict:
    d = {k: v for k, v in asdict(config).items() if k not in _NOT_HASHED}
    if config.scoring != "generate":
        d.pop("max_new_tokens")
    if config.data == "generated":
        d["data"] = "generated-qa"
    else:
        d["data"] = {"file": Path(config.data).name, "sha256": cached_file_sha256(config.data)}
        d.pop("sentences_per_doc")
    d.update(kind="strategies", arrangement=arrangement, variant=variant)
    return d


def load_pools(config: StrategyConfig) -> list[Example]:
    """Each question with its pool of candidate documents.  Generated pools are shuffled (seeded) so that
    a retriever's ties cannot favour the gold, which the generator puts first."""
    if config.data == "generated":
        out = []
        for e in generate_fictional_qa(config.limit, config.pool, config.seed, config.sentences_per_doc):
            docs = list(e.documents)
            random.Random(f"pool-{config.seed}-{e.id}").shuffle(docs)
            out.append(replace(e, documents=tuple(docs)))
        return out
    return [with_num_documents(e, min(config.pool, len(e.documents)))
            for e in read_examples(config.data, "qa", config.limit)]


@dataclass(frozen=True)
class Retrieved:
    """One question after retrieval: its top-k documents, most relevant first, and where the gold ranked."""

    example: Example
    ranked: tuple
    gold_pool_rank: int | None  # 1-based rank of the gold in the whole pool; None without a gold


def attention_retriever(lm: LoadedModel, config: StrategyConfig, pools: list[Example]):
    """Scores from the model's calibrated attention (question tokens, the last half of the layers), the
    positional bias estimated on held-out questions (another seed; the first pools for a data file)."""
    from . import attention
    from .experiment import SweepConfig

    held_out = (generate_fictional_qa(BIAS_EXAMPLES, config.pool, config.seed + 1, config.sentences_per_doc)
                if config.data == "generated" else pools[:BIAS_EXAMPLES])
    sweep_like = SweepConfig(task="qa", template=config.template, chat=config.chat, limit=1, positions=(0,),
                             progress=False)
    bias = attention.position_bias(lm, sweep_like, held_out, progress=False, queries="question")
    n = lm.model.config.get_text_config().num_hidden_layers
    return lambda ex: attention.attention_scores(lm, ex, bias, range(n // 2, n), "question",
                                                 Variant(template=config.template, chat=config.chat))


def retrieve(example: Example, config: StrategyConfig, scorer=None) -> Retrieved:
    """Score the pool (with `scorer(example)` when given, else the named retriever) and keep the top k."""
    s = scorer(example) if scorer is not None else retrieval_scores(example, config.retriever)
    order = ranked_top_k(example.documents, s, len(example.documents))
    gold_rank = next((i + 1 for i, d in enumerate(order) if d.is_gold), None)
    return Retrieved(example, tuple(order[:config.k]), gold_rank)


def arranged(r: Retrieved, arrangement: str, seed: int) -> Example:
    """The question with its retrieved documents in the order `arrangement` gives.  An oracle placement
    puts the gold at a position; when the retriever missed it, it takes the place of the k-th document."""
    ex = r.example
    if arrangement.startswith(ORACLE_PREFIX):
        docs = list(r.ranked)
        if not any(d.is_gold for d in docs):
            docs[-1] = ex.gold
        return gold_at(replace(ex, documents=tuple(docs)), int(arrangement[len(ORACLE_PREFIX):]))
    shuffle_seed = zlib.crc32(f"{seed}-{ex.id}".encode())
    return replace(ex, documents=tuple(arrange(list(r.ranked), arrangement, seed=shuffle_seed)))


def _record(ex: Example, prompt: Prompt, r: Retrieved, arrangement: str, variant: str) -> dict:
    m = prompt.manifest
    rank_ids = [d.id for d in r.ranked]
    where = {d: i for i, d in enumerate(m.doc_ids)}
    return {"example_id": ex.id, "condition": f"{arrangement}|{variant}", "position": None,
            "arrangement": arrangement, "variant": variant, "gold_pool_rank": r.gold_pool_rank,
            "gold_retrieved": r.gold_pool_rank is not None and r.gold_pool_rank <= len(r.ranked),
            "gold_in_prompt": m.gold_index is not None, "gold_index": m.gold_index,
            "gold_rel_depth": m.gold_rel_depth, "num_docs_shown": len(m.doc_ids), "prompt_tokens": m.num_tokens,
            "prompt_sha256": m.sha256, "doc_ids": list(m.doc_ids),
            "rank_positions": [where.get(i) for i in rank_ids]}


def _score(lm: LoadedModel, exs: list[Example], prompts: list[Prompt], config: StrategyConfig) -> list[dict]:
    """Score prompts as a sweep does; generations are also checked for the documents they cite."""
    out = []
    for e, p, s in zip(exs, prompts, score_prompts(lm, exs, prompts, config)):
        rec = {"prediction": s.prediction, "gold_loglik": s.gold_loglik, "gold_rank": s.gold_rank,
               "latency_s": round(s.latency_s, 4), "correct": s.gold_rank == 1 if config.scoring == "choice" else None}
        if config.scoring == "generate":
            cited = parse_citations(s.prediction)
            gold_cited = p.manifest.gold_index is not None and p.manifest.gold_index + 1 in cited
            rec.update(correct=best_subspan_em(s.prediction, e.answers), citations=cited, cited_gold=gold_cited)
            rec["supported"] = rec["correct"] and gold_cited
        out.append(rec)
    return out


def run(config: StrategyConfig, model: LoadedModel | None = None):
    """Run (or resume) every condition; one row per question and condition.  Each condition is stored
    under its own config hash, so adding a strategy or a variant reuses what is done."""
    import pandas as pd
    from tqdm.auto import tqdm

    if model is not None and model.name != config.model:
        config = replace(config, model=model.name)
    lm = model or load_model(config.model)
    pools = load_pools(config)
    if config.scoring == "choice":
        for e in pools:
            candidates(e)
    conds = config.conditions()
    stores = {}
    for a, v in conds:
        rc = run_config(config, a, v)
        stores[(a, v)] = ResultStore(config.results_dir, config_hash(rc), rc, lm.identity)
    todo = [(c, e) for c in conds for e in pools if e.id not in stores[c]]
    needed = {e.id for _, e in todo}
    scorer = attention_retriever(lm, config, pools) if config.retriever == "attention" and needed else None
    retrieved = {e.id: retrieve(e, config, scorer) for e in pools if e.id in needed}
    bar = tqdm(total=len(todo), desc="strategies", disable=not config.progress or not todo)
    for (a, v) in conds:
        store = stores[(a, v)]
        variant = Variant(template=config.template, chat=config.chat, **VARIANTS[v])
        pending = [e for e in pools if e.id not in store]
        for start in range(0, len(pending), config.batch_size):
            chunk = [arranged(retrieved[e.id], a, config.seed) for e in pending[start:start + config.batch_size]]
            prompts = [render(e, lm.tokenizer, variant) for e in chunk]
            recs = [_record(e, p, retrieved[e.id], a, v) for e, p in zip(chunk, prompts)]
            fits = [(p.manifest.num_tokens if config.scoring == "choice" and p.manifest.gold_index is None
                     else needed_tokens(lm, e, p, config)) <= lm.window for e, p in zip(chunk, prompts)]
            # forced choice cannot pick an answer no shown document supports: a missed gold is wrong unscored
            run_idx = [i for i, (rec, f) in enumerate(zip(recs, fits))
                       if f and (rec["gold_in_prompt"] or config.scoring != "choice")]
            scored = dict(zip(run_idx, _score(lm, [chunk[i] for i in run_idx], [prompts[i] for i in run_idx],
                                              config) if run_idx else []))
            for i, rec in enumerate(recs):
                if not fits[i]:
                    rec.update(status="too_long", correct=None, gold_loglik=None, window=lm.window)
                elif i in scored:
                    rec.update(status="ok", **scored[i])
                else:
                    rec.update(status="ok", correct=False, gold_loglik=None, prediction=None)
                store.append(rec)
                bar.update(1)
    bar.close()
    ids = [e.id for e in pools]
    rows = []
    for (a, v), store in stores.items():
        for r in store.records(ids):
            rows.append({**r, "model": config.model, "retriever": config.retriever, "k": config.k,
                         "config_hash": store.dir.name})
    return pd.DataFrame(rows)


def summarize(df, baseline: str | None = None, n_boot: int = 10_000, seed: int = 0):
    """Per condition: accuracy with a Wilson 95% interval, where the gold sat, how often it was retrieved,
    and the paired difference from `baseline` (default: the first condition) with a bootstrap 95%
    interval over questions and McNemar's exact p-value."""
    import pandas as pd

    from .stats import difference, mcnemar_exact, paired_table, proportion_interval

    conds = list(dict.fromkeys(df["condition"]))
    baseline = baseline or conds[0]
    if baseline not in conds:
        raise ConfigError(f"baseline {baseline!r} is not one of the conditions {conds}.")
    table = paired_table(df, "correct", conds)
    rows = []
    for c in conds:
        g = df[(df["condition"] == c) & (df["status"] == "ok")]
        acc, lo, hi = proportion_interval(g["correct"])
        row = {"condition": c, "arrangement": g["arrangement"].iloc[0], "variant": g["variant"].iloc[0],
               "n": len(g), "accuracy": acc, "ci_low": lo, "ci_high": hi,
               "gold_retrieved": float(g["gold_retrieved"].mean()),
               "mean_gold_position": float(g["gold_index"].dropna().mean() + 1) if g["gold_index"].notna().any()
               else float("nan")}
        if c != baseline:
            est = difference(table, c, baseline, n_boot=n_boot, seed=seed)
            row.update(diff=est.value, diff_low=est.low, diff_high=est.high,
                       mcnemar_p=mcnemar_exact(table.column(c), table.column(baseline)).p_value)
        rows.append(row)
    return pd.DataFrame(rows)


def rank_placement(df, ranks: int = 3):
    """Where each arrangement put the retriever's top `ranks` documents: the share of prompts with rank r
    in the first half of the documents ("before") or the second ("after")."""
    import pandas as pd

    rows = []
    for (a, v), g in df.groupby(["arrangement", "variant"], sort=False):
        for r in range(1, ranks + 1):
            pos = [p[r - 1] for p in g["rank_positions"] if len(p) >= r and p[r - 1] is not None]
            n_docs = g["num_docs_shown"].iloc[0]
            before = sum(1 for p in pos if p < n_docs / 2)
            rows.append({"arrangement": a, "variant": v, "rank": r, "before": before / max(1, len(pos)),
                         "after": (len(pos) - before) / max(1, len(pos)),
                         "mean_position": sum(pos) / max(1, len(pos)) + 1})
    return pd.DataFrame(rows)

