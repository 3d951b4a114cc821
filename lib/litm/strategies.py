"""Ordering and prompt-variant strategies on a retrieval pipeline, end to end: for each question a pool of
documents is scored by a retriever, the top k kept, put in order by each strategy (or with the gold placed
by hand, the oracle placements), rendered in each prompt variant and scored by the model."""
from __future__ import annotations

import functools
import random
import zlib
from dataclasses import dataclass, replace

from .attention_study import attention_scores, position_bias
from .data import generate_fictional_qa, read_examples
from .errors import ConfigError, check_distinct
from .experiment import SweepConfig
from .metrics import parse_citations
from .models import DEFAULT_MODEL, LoadedModel, load_model
from .ordering import ORDERINGS, arrange, attention_sort, check_rounds, gold_at, ranked_top_k, with_num_documents
from .prompts import Variant, render
from .retrieval import RETRIEVERS, scores as retrieval_scores
from .runner import SCORINGS, target
from .study import Item, Study, data_identity
from .types import Example

STRATEGY_RETRIEVERS = RETRIEVERS + ("attention",)  # attention: the model's calibrated attention (litm.attention)
BIAS_EXAMPLES = 3  # held-out questions for the attention retriever's positional bias
# Prompt variants by name: the paper's layout, query-aware contextualisation, the question repeated after
# the documents with a grounding instruction, XML documents, and an instruction to cite.
VARIANTS = {"after": {}, "both": {"query_aware": True}, "repeat": {"repeat": True}, "xml": {"doc_format": "xml"},
            "cite": {"cite": True}}
ORACLE_PREFIX = "gold@"
# Orderings a strategy can name: the model-free ones over a ranked list, and attention sorting (the model's own
# attention from the last token, `sort_rounds` rounds from the retriever's order; `ordering.attention_sort`)
STRATEGY_ORDERINGS = tuple(s for s in ORDERINGS if s != "evidence_first") + ("attention_sort",)


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
    sort_rounds: int = 2  # attention_sort: scoring passes before the prompt is scored
    oracle_positions: tuple[int, ...] = (0, 4, 9)  # the gold placed by hand among the k (0-based)
    variants: tuple[str, ...] = ("after", "both", "repeat", "xml")
    cross: bool = False
    scoring: str = "choice"  # choice | loglik | generate (citations are parsed from generations only)
    limit: int | None = 12  # questions (the first `limit` of the data after `skip`)
    skip: int = 0  # the first `skip` questions of the data are left out (a pilot's, see `planning.pilot_and_study`)
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
        check_distinct(strategies=self.strategies, oracle_positions=self.oracle_positions, variants=self.variants)
        bad = [s for s in self.strategies if s not in STRATEGY_ORDERINGS]
        if bad:
            raise ConfigError(f"unknown or unsupported strategies {bad}: use {list(STRATEGY_ORDERINGS)} "
                              "(evidence_first needs a second score: use litm.ordering.reorder).")
        check_rounds(self.sort_rounds, "sort_rounds")
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad:
            raise ConfigError(f"unknown prompt variants {bad}: use {list(VARIANTS)}.")
        if self.retriever not in STRATEGY_RETRIEVERS:
            raise ConfigError(f"unknown retriever {self.retriever!r}: use one of {STRATEGY_RETRIEVERS}.")
        if self.scoring not in SCORINGS:
            raise ConfigError(f"unknown scoring {self.scoring!r}: use one of {SCORINGS}.")
        if not 1 <= self.k <= self.pool:
            raise ConfigError(f"k={self.k} but the pool holds {self.pool} documents; choose k in 1..{self.pool}.")
        if self.k < 2 and self.scoring == "choice":
            raise ConfigError("forced choice among k=1 document's answer is always right (chance is 100%); keep at "
                              "least two documents, or use scoring='loglik' or 'generate'.")
        bad = [p for p in self.oracle_positions if not 0 <= p < self.k]
        if bad:
            raise ConfigError(f"oracle positions {bad} are out of range for k={self.k} (0..{self.k - 1}).")
        if not self.variants or not (self.strategies or self.oracle_positions):
            raise ConfigError("nothing to run: give at least one variant and one strategy or oracle position.")
        if self.limit is None and self.data == "generated":
            raise ConfigError("generated data needs a limit (how many questions to make).")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be at least 1 (got {self.limit}).")
        if self.skip < 0:
            raise ConfigError(f"skip must be 0 or more, got {self.skip}.")

    def arrangements(self) -> list[str]:
        return list(self.strategies) + [f"{ORACLE_PREFIX}{p}" for p in self.oracle_positions]

    def conditions(self) -> list[tuple[str, str]]:
        """(arrangement, variant) pairs to run."""
        base = self.variants[0]
        if self.cross:
            return [(a, v) for v in self.variants for a in self.arrangements()]
        first = self.strategies[0] if self.strategies else self.arrangements()[0]
        return [(a, base) for a in self.arrangements()] + [(first, v) for v in self.variants[1:]]


def only(config: StrategyConfig, conditions) -> StrategyConfig:
    """The config that runs just the named conditions ("arrangement|variant", e.g. a pilot's baseline and
    contrast); with two arrangements and two variants every pair of them runs."""
    pairs = [str(c).split("|") for c in conditions]
    if any(len(p) != 2 for p in pairs):
        raise ConfigError(f"conditions are named 'arrangement|variant', e.g. 'rank|after'; got {list(conditions)}.")
    arrangements = list(dict.fromkeys(a for a, _ in pairs))
    variants = tuple(dict.fromkeys(v for _, v in pairs))
    oracle = [a for a in arrangements if a.startswith(ORACLE_PREFIX)]
    return replace(config, strategies=tuple(a for a in arrangements if a not in oracle), variants=variants,
                   oracle_positions=tuple(int(a[len(ORACLE_PREFIX):]) for a in oracle),
                   cross=len(arrangements) > 1 and len(variants) > 1)


def load_pools(config: StrategyConfig) -> list[Example]:
    """Each question after the first `skip` with its pool of candidate documents.  Generated pools are shuffled
    (seeded) so that a retriever's ties cannot favour the gold, which the generator puts first."""
    end = None if config.limit is None else config.skip + config.limit
    if config.data == "generated":
        examples = generate_fictional_qa(end, config.pool, config.seed, config.sentences_per_doc)[config.skip:]
        out = []
        for e in examples:
            docs = list(e.documents)
            random.Random(f"pool-{config.seed}-{e.id}").shuffle(docs)
            out.append(replace(e, documents=tuple(docs)))
        return out
    examples = read_examples(config.data, "qa", end)
    if len(examples) <= config.skip:
        raise ConfigError(f"{config.data} holds {len(examples)} questions; skipping {config.skip} leaves none.")
    return [with_num_documents(e, min(config.pool, len(e.documents))) for e in examples[config.skip:]]


@dataclass(frozen=True)
class Retrieved:
    """One question after retrieval: its top-k documents, most relevant first, and where the gold ranked."""

    example: Example
    ranked: tuple
    gold_pool_rank: int | None  # 1-based rank of the gold in the whole pool; None without a gold


def attention_retriever(lm: LoadedModel, config: StrategyConfig, pools: list[Example]):
    """Scores from the model's calibrated attention (question tokens, the last half of the layers), the
    positional bias estimated on held-out questions (another seed; the first pools for a data file)."""
    held_out = (generate_fictional_qa(BIAS_EXAMPLES, config.pool, config.seed + 1, config.sentences_per_doc)
                if config.data == "generated" else pools[:BIAS_EXAMPLES])
    sweep_like = SweepConfig(task="qa", template=config.template, chat=config.chat, limit=1, positions=(0,),
                             progress=False)
    bias = position_bias(lm, sweep_like, held_out, progress=False, queries="question")
    n = lm.text_config.num_hidden_layers
    return lambda ex: attention_scores(lm, ex, bias, range(n // 2, n), "question",
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


class Strategies(Study):
    """The strategies experiment on the one loop: a condition per arrangement x prompt variant."""

    kind = "strategies"
    listing = ("strategies", "oracle_positions", "variants", "cross")

    def __init__(self, config: StrategyConfig):
        super().__init__(config)
        self.retrieved: dict[str, Retrieved] = {}

    def hashed(self) -> dict:
        d = {**super().hashed(), "data": data_identity(self.config.data, "qa")}
        if "attention_sort" not in self.config.strategies:  # hashed only when used, so earlier runs keep their folders
            d.pop("sort_rounds")
        return d

    def run_config(self, identity: dict, condition: dict | None = None) -> dict:
        d = super().run_config(identity, condition)
        if condition is not None and condition["arrangement"] != "attention_sort":  # only sorting's runs depend on it
            d.pop("sort_rounds", None)
        return d

    def conditions(self) -> list[dict]:
        return [{"arrangement": a, "variant": v} for a, v in self.config.conditions()]

    @functools.cache
    def units(self) -> list[Example]:
        pools = load_pools(self.config)
        if self.scoring == "choice":
            for e in pools:
                target(e, "choice")
        return pools

    def prepare(self, lm, todo) -> None:
        needed = {e.id: e for _, e in todo if e.id not in self.retrieved}
        scorer = attention_retriever(lm, self.config, self.units()) if self.config.retriever == "attention" and needed \
            else None
        self.retrieved.update({i: retrieve(e, self.config, scorer) for i, e in needed.items()})

    def item(self, lm, condition: dict, pool: Example) -> Item:
        a, v = condition["arrangement"], condition["variant"]
        r = self.retrieved[pool.id]
        variant = Variant(template=self.config.template, chat=self.config.chat, **VARIANTS[v])
        extra = {}
        if a == "attention_sort":  # from the retriever's order, by the model's attention in this variant
            from .attention_study import document_masses

            ex, orders = attention_sort(replace(r.example, documents=r.ranked), document_masses(lm, variant),
                                        self.config.sort_rounds)
            extra = {"sort_orders": [list(o) for o in orders]}
        else:
            ex = arranged(r, a, self.config.seed)
        prompt = render(ex, lm.tokenizer, variant)
        where = {d: i for i, d in enumerate(prompt.manifest.doc_ids)}
        fields = {"condition": f"{a}|{v}", "position": None, **condition, "gold_pool_rank": r.gold_pool_rank,
                  "gold_retrieved": r.gold_pool_rank is not None and r.gold_pool_rank <= len(r.ranked),
                  "doc_ids": list(prompt.manifest.doc_ids), "rank_positions": [where.get(d.id) for d in r.ranked],
                  **extra}
        if self.scoring == "choice" and prompt.manifest.gold_index is None:
            # forced choice cannot pick an answer no shown document supports: a missed gold is wrong unscored
            return Item(ex.id, prompt, None, fields, {"correct": False})
        return Item(ex.id, prompt, target(ex, self.scoring), fields)

    def outcome(self, item: Item, scored) -> dict:
        if self.scoring != "generate":
            return {}
        cited = parse_citations(scored.prediction)
        gold = item.prompt.manifest.gold_index
        gold_cited = gold is not None and gold + 1 in cited
        return {"citations": cited, "cited_gold": gold_cited, "supported": scored.correct and gold_cited}

    def columns(self) -> dict:
        return {"retriever": self.config.retriever, "k": self.config.k}


def run(config: StrategyConfig, model: LoadedModel | None = None):
    """Run (or resume) every condition; one row per question and condition.  Each condition is stored
    under its own run hash, so adding a strategy or a variant reuses what is done."""
    study = Strategies(config)
    study.units()
    return study.run(model or load_model(config.model))


def summarize(df):
    """Per condition: accuracy with a Wilson 95% interval, how often the gold was retrieved and where it sat
    (the paired differences from a baseline are `effects`)."""
    import pandas as pd

    from .stats import proportion_interval

    rows = []
    for c in dict.fromkeys(df["condition"]):
        g = df[(df["condition"] == c) & (df["status"] == "ok")]
        acc, lo, hi = proportion_interval(g["correct"])
        rows.append({"condition": c, "arrangement": g["arrangement"].iloc[0], "variant": g["variant"].iloc[0],
                     "n": len(g), "accuracy": acc, "ci_low": lo, "ci_high": hi,
                     "gold_retrieved": float(g["gold_retrieved"].mean()),
                     "mean_gold_position": float(g["gold_index"].dropna().mean() + 1) if g["gold_index"].notna().any()
                     else float("nan")})
    return pd.DataFrame(rows)


def effects(df, baseline: str | None = None):
    """Each condition minus `baseline` (default: the first condition) on every measure the records hold,
    paired over questions (`stats.versus_baseline`)."""
    from .stats import versus_baseline

    return versus_baseline(df, baseline or df["condition"].iloc[0])


def rank_placement(df, ranks: int = 3):
    """Where each arrangement put the retriever's top `ranks` documents: the share of prompts with rank r
    in the first half of the documents ("before") or the second ("after"), and its place (1-based) as a mean,
    the least and the greatest over the prompts."""
    import pandas as pd

    rows = []
    for (a, v), g in df.groupby(["arrangement", "variant"], sort=False):
        for r in range(1, ranks + 1):
            pos = [p[r - 1] for p in g["rank_positions"] if len(p) >= r and p[r - 1] is not None]
            n_docs = g["num_docs_shown"].iloc[0]
            before = sum(1 for p in pos if p < n_docs / 2)
            rows.append({"arrangement": a, "variant": v, "rank": r, "before": before / max(1, len(pos)),
                         "after": (len(pos) - before) / max(1, len(pos)),
                         "mean_position": sum(pos) / max(1, len(pos)) + 1,
                         "min_position": min(pos, default=-2) + 1, "max_position": max(pos, default=-2) + 1,
                         "n": len(pos), "num_docs": int(n_docs)})
    return pd.DataFrame(rows)

