"""Position sweeps: a typed config, expanded into one condition per gold position (plus closed-book and
oracle), run on the one loop of `litm.study`, each condition stored under its own hash."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from .data import generate_fictional_qa, generate_kv, read_examples
from .errors import ConfigError, check_distinct
from .models import DEFAULT_MODEL, LoadedModel, load_model
from .ordering import gold_at, with_num_documents
from .prompts import Prompt, Variant, render
from .runner import SCORINGS, target
from .study import Item, Study, data_identity
from .types import Example

TASKS = ("qa", "kv")
BACKENDS = ("transformers", "vllm")


@dataclass(frozen=True)
class SweepConfig:
    """Everything that decides a position sweep's results, plus how to run it (batch size, folders)."""

    task: str = "kv"  # qa | kv
    data: str = "generated"  # "generated", or a Liu et al. .jsonl / .jsonl.gz file
    model: str = DEFAULT_MODEL
    num_docs: int = 10  # documents (QA) or key-value pairs (KV) in each prompt
    positions: tuple[int, ...] = (0, 4, 9)  # 0-based gold positions
    closedbook: bool = True
    oracle: bool = True
    scoring: str = "choice"  # generate | loglik | choice
    query_aware: bool = False
    template: str = "ours"  # ours | paper (needs `litm fetch liu2023`)
    chat: bool | None = None  # None: the model's chat template when it has one
    limit: int | None = 50  # examples (the first `limit` of the data after `skip`)
    skip: int = 0  # the first `skip` examples of the data are left out (a pilot's, see `planning.pilot_and_study`)
    seed: int = 0  # seed of the generated data
    sentences_per_doc: int = 3  # generated QA only
    generate_docs: int | None = None  # generated data: make this many documents, keep num_docs (shared questions)
    max_new_tokens: int = 100  # generate only
    batch_size: int = 4
    results_dir: str = "results"
    data_dir: str = "data/liu2023"  # where the paper's templates are
    progress: bool = True
    shard: tuple[int, int] | None = None  # (i, n): run only examples i, i + n, i + 2n, ... (one job of n)
    backend: str = "transformers"  # transformers | vllm (generation only; `pip install vllm`)
    tensor_parallel: int = 1  # vllm: GPUs to split the model across

    def __post_init__(self):
        object.__setattr__(self, "positions", tuple(int(p) for p in self.positions))
        check_distinct(positions=self.positions)
        if self.shard is not None:
            i, n = (int(x) for x in self.shard)
            if not 0 <= i < n:
                raise ConfigError(f"shard {i}/{n} is not one of 0/{n} .. {n - 1}/{n}.")
            object.__setattr__(self, "shard", (i, n))
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}: use one of {TASKS}.")
        if self.scoring not in SCORINGS:
            raise ConfigError(f"unknown scoring {self.scoring!r}: use one of {SCORINGS}.")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be at least 1 (got {self.limit}); use None for all examples.")
        if self.limit is None and self.data == "generated":
            raise ConfigError("generated data needs a limit (how many examples to make).")
        if self.skip < 0:
            raise ConfigError(f"skip must be 0 or more, got {self.skip}.")
        if self.num_docs < 1:
            raise ConfigError(f"num_docs must be at least 1, got {self.num_docs}.")
        if self.num_docs < 2 and self.scoring == "choice":
            raise ConfigError("forced choice with one document has one candidate, so it is always right (chance is "
                              "100%); use at least two documents, or scoring='loglik' or 'generate'.")
        bad = [p for p in self.positions if not 0 <= p < self.num_docs]
        if bad:
            raise ConfigError(f"gold positions {bad} are out of range for {self.num_docs} documents "
                              f"(0..{self.num_docs - 1}).")
        if not self.positions and not self.closedbook and not self.oracle:
            raise ConfigError("nothing to run: give positions or turn on closedbook/oracle.")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ConfigError("batch_size and max_new_tokens must be at least 1.")
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}: use one of {BACKENDS}.")
        if self.backend == "vllm" and self.scoring != "generate":
            raise ConfigError(f"the vllm backend generates; scoring {self.scoring!r} runs on the transformers "
                              "backend (or use scoring='generate').")
        if self.tensor_parallel < 1:
            raise ConfigError(f"tensor_parallel must be at least 1, got {self.tensor_parallel}.")

    def conditions(self) -> list[tuple[str, int | None]]:
        out: list[tuple[str, int | None]] = [("documents", p) for p in self.positions]
        if self.closedbook:
            out.append(("closedbook", None))
        if self.oracle:
            out.append(("oracle", None))
        return out


def load_examples(config: SweepConfig) -> list[Example]:
    """The sweep's examples after the first `skip`, cut to `num_docs` documents (the gold and the first
    distractors)."""
    end = None if config.limit is None else config.skip + config.limit
    if config.data == "generated":
        n = max(config.num_docs, config.generate_docs or 0)
        if config.task == "kv":
            examples = generate_kv(end, n, config.seed)
        else:
            examples = generate_fictional_qa(end, n, config.seed, config.sentences_per_doc)
    else:
        examples = read_examples(config.data, config.task, end)
    if len(examples) <= config.skip:
        raise ConfigError(f"{config.data} holds {len(examples)} examples; skipping {config.skip} leaves none.")
    return [with_num_documents(e, config.num_docs) for e in examples[config.skip:]]


def prompt_for(example: Example, condition: str, position: int | None, config: SweepConfig, tok) -> Prompt:
    """The prompt a sweep scores for one example under one condition (gold at `position`)."""
    ex = gold_at(example, position) if condition == "documents" else example
    variant = Variant(condition=condition, query_aware=config.query_aware, template=config.template,
                      template_dir=config.data_dir, chat=config.chat)
    return render(ex, tok, variant)


class Sweep(Study):
    """A position sweep on the one loop: a condition per gold position, closed-book and oracle."""

    kind = "sweep"
    listing = ("positions", "closedbook", "oracle")

    def hashed(self) -> dict:
        return {**super().hashed(), "data": data_identity(self.config.data, self.config.task)}

    def conditions(self) -> list[dict]:
        return [{"condition": c, "position": p} for c, p in self.config.conditions()]

    @functools.cache
    def units(self) -> list[Example]:
        examples = load_examples(self.config)
        for e in examples:  # data that cannot be scored this way fails before a model loads
            target(e, self.scoring)
        return examples

    def item(self, lm, condition: dict, example: Example) -> Item:
        prompt = prompt_for(example, condition["condition"], condition["position"], self.config, lm.tokenizer)
        return Item(example.id, prompt, target(example, self.scoring), condition)

    def columns(self) -> dict:
        return {"task": self.config.task, "num_docs": self.config.num_docs}


def load_backend(config: SweepConfig, device: str | None = None, dtype: str | None = None):
    """The model a sweep scores with: transformers (`load_model`) or a vLLM engine (`config.backend`)."""
    if config.backend == "vllm":
        from .vllm_backend import load_vllm

        return load_vllm(config.model, config.tensor_parallel, dtype=dtype)
    return load_model(config.model, device=device, dtype=dtype)


def sweep(config: SweepConfig, model=None):
    """Run (or resume) every condition of a sweep; one row per example and condition.  `model`, when given,
    is used instead of loading `config.model` (its name is recorded).  Stored examples are skipped; a prompt
    over the model's window is stored as "too_long", never truncated (`litm.study`)."""
    study = Sweep(config)
    study.units()
    return study.run(model or load_backend(config))


def summarize(df, by=("condition", "position")):
    """Every measure the records hold, per condition: accuracy with a Wilson 95% interval, the mean gold
    log-likelihood and margin with t intervals (`stats.MEASURES` names the columns); skipped prompts counted."""
    import pandas as pd

    from .stats import mean_interval, measures_in, proportion_interval

    held = measures_in(df)
    out = []
    for key, g in df.groupby(list(by), dropna=False, sort=False):
        ok = g[g["status"] == "ok"]
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row.update(n=len(ok), too_long=int((g["status"] == "too_long").sum()))
        for m in held:
            x = ok[m.column].dropna()
            row.update(zip(m.summary, proportion_interval(x.astype(bool)) if m.binary
                           else mean_interval(x.astype(float).to_numpy())))
        row["mean_prompt_tokens"] = float(g["prompt_tokens"].mean())
        out.append(row)
    table = pd.DataFrame(out)
    if list(by) == ["condition", "position"]:  # gold positions in order, then the baselines
        order = {"documents": 0, "closedbook": 1, "oracle": 2}
        table = table.sort_values(["condition", "position"], key=lambda c: c.map(order) if c.name == "condition"
                                  else c).reset_index(drop=True)
    return table


def depth_positions(num_docs: int, depths: int) -> list[int]:
    """Gold positions at `depths` evenly spaced relative depths (0 = first document, 1 = last)."""
    if depths < 2:
        raise ConfigError(f"need at least two depths, got {depths}.")
    return sorted({round(i * (num_docs - 1) / (depths - 1)) for i in range(depths)})


def docs_for_length(config: SweepConfig, tokenizer, target: int, most: int = 400) -> int:
    """How many documents make the first example's prompt closest to `target` tokens (never above)."""

    probe = replace(config, limit=1, num_docs=1, positions=(0,), generate_docs=None, scoring="loglik")
    if config.data == "generated":
        example = load_examples(replace(probe, num_docs=most))[0]
    else:  # a data file holds a fixed number of documents per example
        example = read_examples(config.data, config.task, 1)[0]
        most = len(example.documents)

    def tokens(n: int) -> int:
        ex = with_num_documents(example, n)
        return len(prompt_for(ex, "documents", 0, probe, tokenizer).input_ids)

    lo, hi = 1, most
    if tokens(1) > target:
        raise ConfigError(f"a target length of {target} tokens is shorter than a one-document prompt "
                          f"({tokens(1)} tokens); use longer lengths.")
    while lo < hi:  # largest n with tokens(n) <= target
        mid = (lo + hi + 1) // 2
        if tokens(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def grid(config: SweepConfig, lengths, depths: int = 10, model: LoadedModel | None = None):
    """Position x length grid: the gold rotated over `depths` evenly spaced depths at each target prompt
    length (in tokens, up to the model's window).  The same questions serve every length (their
    documents are cut from one generated pool).  Returns sweep records plus `target_length` and `depth`."""
    import pandas as pd

    lm = model or load_model(config.model)
    too_long = [L for L in lengths if L > lm.window]
    if too_long:
        raise ConfigError(f"lengths {too_long} exceed the model's window of {lm.window} tokens.")
    sizes = {L: docs_for_length(config, lm.tokenizer, L) for L in lengths}
    short = [L for L, n in sizes.items() if n < 2]
    if short:
        raise ConfigError(f"lengths {short} fit only one document: nothing to move; use longer lengths.")
    pool = max(sizes.values())
    frames = []
    for L in lengths:
        n = sizes[L]
        cfg = replace(config, num_docs=n, positions=tuple(depth_positions(n, depths)), closedbook=False,
                      oracle=False, generate_docs=pool if config.data == "generated" else None)
        df = sweep(cfg, lm)
        frames.append(df.assign(target_length=L, depth=df["position"] / max(1, n - 1)))
    return pd.concat(frames, ignore_index=True)
