"""The one resumable loop every study runs: conditions -> items (a rendered prompt and what to score it
against) -> the window rule -> `runner.score` -> a record -> the results store.

Each condition is stored under the hash of its run config: the study's config less how it is run, the
condition's own fields and the model's run identity (weights, dtype, device type, attention implementation,
backend).  So a rerun skips what is stored, a larger limit extends the same folders, and two different
numerics never share one.  The window rule: an item whose prompt plus what its scoring needs (the longest
candidate, the answer, or `max_new_tokens`) exceeds the model's window is stored as "too_long", never
truncated and never scored.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .errors import ConfigError
from .models import file_sha256, run_identity
from .prompts import Prompt
from .runner import Target, needed_tokens, score
from .store import ResultStore
from .types import Example

# How a study is run, not what it measures: left out of every run hash.  The backend and the tensor-parallel
# size enter through the model's run identity instead.
NOT_HASHED = frozenset({"limit", "batch_size", "results_dir", "data_dir", "progress", "shard", "backend",
                        "tensor_parallel"})
LEAD_COLUMNS = ("model", "task", "num_docs", "condition", "position", "example_id", "status", "correct", "gold_rank",
                "gold_loglik", "gold_margin", "prediction", "prompt_tokens", "gold_index", "gold_token_start",
                "gold_token_end", "gold_rel_depth")


@dataclass(frozen=True)
class Item:
    """One record to be: its key, its prompt, what to score it against (None: decided without the model,
    with `outcome` as the result), the study's own fields, and the example as shown (for `Study.outcome`)."""

    key: str
    prompt: Prompt
    target: Target | None
    fields: dict = field(default_factory=dict)
    outcome: dict = field(default_factory=dict)
    example: Example | None = None


def config_hash(d: dict) -> str:
    """sha256 of the sorted JSON of a run config; the first 16 hex digits name its results folder."""
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


cached_file_sha256 = functools.lru_cache(maxsize=32)(file_sha256)


def data_identity(data: str, task: str):
    """A study's data as it enters the hash: generated data by its task, a file by its name and content
    (so results stay valid when the file or the repository moves)."""
    if data == "generated":
        return f"generated-{task}"
    return {"file": Path(data).name, "sha256": cached_file_sha256(data)}


def prompt_fields(prompt: Prompt) -> dict:
    """What every record says about its prompt: length, hash, and where the gold sits."""
    m = prompt.manifest
    span = m.gold_span
    return {"prompt_tokens": m.num_tokens, "prompt_sha256": m.sha256, "gold_in_prompt": m.gold_index is not None,
            "gold_index": m.gold_index, "gold_token_start": span[0] if span else None,
            "gold_token_end": span[1] if span else None, "gold_rel_depth": m.gold_rel_depth,
            "num_docs_shown": len(m.doc_ids)}


def logged_prompt(lm, prompt: Prompt) -> dict:
    """What a run's manifest says of its first prompt: the exact text the model saw (after chat wrapping), its
    token ids' hash, and the sha256 of the chat template that wrapped it (None without one), so that a
    reproduction can tell a template change from a model change."""
    template = getattr(getattr(lm, "tokenizer", None), "chat_template", None)
    if isinstance(template, dict):  # several named templates: hash them all
        template = json.dumps(template, sort_keys=True)
    m = prompt.manifest
    return {"example_id": prompt.example_id, "text": prompt.text, "chat": m.chat, "template": m.template,
            "num_tokens": m.num_tokens, "input_ids_sha256": m.sha256,
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if m.chat and template else None}


class Study:
    """A study on top of the one loop.  Subclasses give `conditions`, `units` and `item`, and may give
    `hashed`, `prepare`, `outcome` and `columns`.  `config` is a dataclass with `model`, `results_dir`,
    `batch_size` and (unless the class fixes `scoring`) `scoring`; `limit`, `progress`, `shard` and
    `max_new_tokens` are read when it has them."""

    kind = "study"  # stored in every run config of the study
    listing: tuple[str, ...] = ()  # config fields that list conditions: each condition hashes its own part
    key = "example_id"  # the record field that names a unit

    def __init__(self, config):
        self.config = config

    @property
    def scoring(self) -> str:
        return self.config.scoring

    def conditions(self) -> list[dict]:
        """Each condition's own fields (they go into its records and its run config)."""
        return [{}]

    def units(self) -> list:
        """What every condition runs over, each with an `id`: the examples, or the trials of a design."""
        raise NotImplementedError

    def item(self, lm, condition: dict, unit) -> Item:
        """One unit under one condition: its rendered prompt, target and record fields."""
        raise NotImplementedError

    def hashed(self) -> dict:
        """The config as it enters the run hash."""
        d = {k: v for k, v in asdict(self.config).items() if k not in NOT_HASHED and k not in self.listing}
        if self.scoring != "generate":
            d.pop("max_new_tokens", None)
        if not d.get("skip"):  # hashed only when examples are skipped, so earlier runs keep their folders
            d.pop("skip", None)
        return d

    def run_config(self, identity: dict, condition: dict | None = None) -> dict:
        """What a condition's run hash is taken of: the hashed config, the study's kind, the model's run
        identity and the condition's fields (without a condition: what the study's runs share), as JSON."""
        return json.loads(json.dumps({**self.hashed(), "kind": self.kind, **identity, **(condition or {})}))

    def prepare(self, lm, todo: list) -> None:
        """Work shared by the (condition, unit) pairs still to run, done once before their items."""

    def outcome(self, item: Item, scored) -> dict:
        """Record fields of the study's own, from a scored item."""
        return {}

    def columns(self) -> dict:
        """Constant columns added to every returned row."""
        return {}

    def run(self, lm):
        """Run (or resume) every condition on a loaded model; one row per unit and condition.  Records are
        appended one at a time; an item that cannot be made fails before anything is written."""
        import pandas as pd

        cfg = self.config = replace(self.config, model=lm.name)  # results are named after the model used
        identity = run_identity(lm)
        base = self.run_config(identity)
        conds = self.conditions()
        units = self.units()
        manifest = {}  # what the manifest says beyond the run config
        if getattr(cfg, "shard", None) is not None:  # one job of a split run; `litm merge` joins the jobs
            i, n = cfg.shard
            manifest["shard"] = [i, n]
            units = units[i::n]
            if not units:
                raise ConfigError(f"shard {i}/{n} holds no units (limit {getattr(cfg, 'limit', None)}); use fewer "
                                  "shards.")
        configs = [self.run_config(identity, c) for c in conds]
        opened = {}
        try:  # each run folder is locked while its store is open (`store.ResultStore`), taken in one order by all
            for i in sorted(range(len(conds)), key=lambda i: config_hash(configs[i])):
                opened[i] = ResultStore(cfg.results_dir, config_hash(configs[i]), configs[i], lm.identity, self.key,
                                        tuple(conds[i]), extra=manifest)
            stores = [opened[i] for i in range(len(conds))]
            self._fill(lm, conds, units, stores)
        finally:
            for s in reversed(opened.values()):  # the last opened first: a store that wrote nothing removes its folders
                s.close()
        keys = [u.id for u in units]
        extra = {"model": cfg.model, **self.columns(), "sweep_id": config_hash(base),
                 "sweep_config": json.dumps(base, sort_keys=True)}
        df = pd.DataFrame([{**r, **extra, "config_hash": s.dir.name} for s in stores for r in s.records(keys)])
        lead = [c for c in LEAD_COLUMNS if c in df.columns]
        return df[lead + sorted(set(df.columns) - set(lead))]

    def _fill(self, lm, conds: list[dict], units: list, stores: list[ResultStore]) -> None:
        """Score and store every (condition, unit) pair the stores do not hold yet."""
        from tqdm.auto import tqdm

        cfg = self.config
        todo = [(i, u) for i in range(len(conds)) for u in units if u.id not in stores[i]]
        made = {}  # each condition's first item, made before anything is written (and then used)
        if todo:
            self.prepare(lm, [(conds[i], u) for i, u in todo])
            made = {(i, u.id): self.item(lm, conds[i], u) for i, u in dict(reversed(todo)).items()}
        with tqdm(total=len(todo), desc=f"{self.kind} {cfg.model}",
                  disable=not getattr(cfg, "progress", True) or not todo) as bar:
            for i, (c, store) in enumerate(zip(conds, stores)):
                pending = [u for u in units if u.id not in store]
                for start in range(0, len(pending), cfg.batch_size):
                    items = [made.pop((i, u.id), None) or self.item(lm, c, u)
                             for u in pending[start:start + cfg.batch_size]]
                    for it, rec in zip(items, self._records(lm, items)):  # the first record writes the manifest
                        store.append(rec, None if len(store) else logged_prompt(lm, it.prompt))
                        bar.update(1)

    def _records(self, lm, items: list[Item]) -> list[dict]:
        """Score a batch of items under the window rule; one record each."""
        max_new = getattr(self.config, "max_new_tokens", 100)
        fits = [needed_tokens(lm, it.prompt, it.target, self.scoring, max_new) <= lm.window for it in items]
        run = [it for it, f in zip(items, fits) if f and it.target is not None]
        scored = iter(score(lm, [it.prompt for it in run], [it.target for it in run], self.scoring,
                            self.config.batch_size, max_new))
        out = []
        for it, f in zip(items, fits):
            rec = {self.key: it.key, "scoring": self.scoring, **prompt_fields(it.prompt), **it.fields,
                   "prediction": None, "gold_loglik": None, "gold_rank": None, "gold_margin": None, "latency_s": None}
            if not f:
                rec.update(status="too_long", correct=None, window=lm.window)
            elif it.target is None:
                rec.update(status="ok", **it.outcome)
            else:
                s = next(scored)
                rec.update(status="ok", prediction=s.prediction, gold_loglik=s.gold_loglik, gold_rank=s.gold_rank,
                           gold_margin=s.gold_margin, latency_s=round(s.latency_s, 4), correct=s.correct)
                if s.candidate_logliks is not None:
                    rec["num_candidates"] = len(s.candidate_logliks)
                rec.update(self.outcome(it, s))
            out.append(rec)
        return out
