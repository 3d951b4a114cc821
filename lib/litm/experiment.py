"""Position sweeps: a typed config, expanded into one run per condition, each stored under its hash."""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import runner
from .data import generate_fictional_qa, generate_kv, read_examples
from .errors import ConfigError
from .metrics import best_subspan_em, kv_match
from .models import DEFAULT_MODEL, LoadedModel, file_sha256, load_model
from .ordering import gold_at, with_num_documents
from .prompts import Prompt, Variant, render
from .store import ResultStore
from .types import Example
from .vllm_backend import VLLMModel

TASKS = ("qa", "kv")
_LEAD_COLUMNS = ("model", "task", "num_docs", "condition", "position", "example_id", "status", "correct", "gold_rank",
                 "gold_loglik", "prediction", "prompt_tokens", "gold_index", "gold_token_start", "gold_token_end",
                 "gold_rel_depth")
SCORINGS = ("generate", "loglik", "choice")
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
    limit: int | None = 50  # examples (the first `limit` of the data)
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
        if self.num_docs < 1:
            raise ConfigError(f"num_docs must be at least 1, got {self.num_docs}.")
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


# Fields that do not change a record: left out of the run hash.
_NOT_HASHED = {"limit", "batch_size", "results_dir", "data_dir", "progress", "positions", "closedbook", "oracle",
               "shard", "tensor_parallel"}


def run_config(config: SweepConfig, condition: str, position: int | None) -> dict:
    """The config of one condition of a sweep, as a plain dict (what the hash is taken of)."""
    d = {k: v for k, v in asdict(config).items() if k not in _NOT_HASHED}
    if config.scoring != "generate":
        d.pop("max_new_tokens")
    if config.backend == "transformers":  # the default leaves the hashes of earlier runs as they were
        d.pop("backend")
    if not (config.task == "qa" and config.data == "generated"):
        d.pop("sentences_per_doc")
    if config.generate_docs is None or config.data != "generated":
        d.pop("generate_docs")
    if config.data == "generated":
        d["data"] = f"generated-{config.task}"
    else:  # by content, so results stay valid when the file or the repository moves
        d["data"] = {"file": Path(config.data).name, "sha256": cached_file_sha256(config.data)}
    d.update(condition=condition, position=position)
    return d


cached_file_sha256 = functools.lru_cache(maxsize=32)(file_sha256)


def sweep_identity(run: dict) -> dict:
    """A run config without its condition: what every run of one sweep shares."""
    return {k: v for k, v in run.items() if k not in ("condition", "position")}


def config_hash(d: dict) -> str:
    """sha256 of the sorted JSON of a config; the first 16 hex digits name its results folder."""
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def load_examples(config: SweepConfig) -> list[Example]:
    """The sweep's examples, cut to `num_docs` documents (the gold and the first distractors)."""
    if config.data == "generated":
        n = max(config.num_docs, config.generate_docs or 0)
        if config.task == "kv":
            examples = generate_kv(config.limit, n, config.seed)
        else:
            examples = generate_fictional_qa(config.limit, n, config.seed, config.sentences_per_doc)
    else:
        examples = read_examples(config.data, config.task, config.limit)
    return [with_num_documents(e, config.num_docs) for e in examples]


def candidates(example: Example) -> tuple[list[str], int]:
    """Forced-choice candidates: the answers the documents support (each once, in order of first
    appearance); returns them and the index of the gold's."""
    answers = [d.answer for d in example.documents]
    if any(a is None for a in answers):
        raise ConfigError(f"example {example.id}: forced choice needs an answer per document (generated QA, "
                          "or KV); use scoring='loglik' or 'generate' for this data.")
    unique = list(dict.fromkeys(answers))
    return unique, unique.index(example.gold.answer)


def prompt_for(example: Example, condition: str, position: int | None, config: SweepConfig, tok) -> Prompt:
    """The prompt a sweep scores for one example under one condition (gold at `position`)."""
    ex = gold_at(example, position) if condition == "documents" else example
    variant = Variant(condition=condition, query_aware=config.query_aware, template=config.template,
                      template_dir=config.data_dir, chat=config.chat)
    return render(ex, tok, variant)


def _record(example: Example, prompt: Prompt, condition: str, position: int | None, scoring: str) -> dict:
    m = prompt.manifest
    span = m.gold_span
    return {"example_id": example.id, "condition": condition, "position": position, "scoring": scoring,
            "prompt_tokens": m.num_tokens, "prompt_sha256": m.sha256, "gold_in_prompt": m.gold_index is not None,
            "gold_index": m.gold_index, "gold_token_start": span[0] if span else None,
            "gold_token_end": span[1] if span else None, "gold_rel_depth": m.gold_rel_depth,
            "num_docs_shown": len(m.doc_ids)}


def score_prompts(lm: LoadedModel, examples: list[Example], prompts: list[Prompt], config: SweepConfig):
    """Run the runner pass `config.scoring` names (`config` needs scoring, batch_size, max_new_tokens)."""
    if isinstance(lm, VLLMModel):
        if config.scoring != "generate":
            raise ConfigError("a vLLM model only generates; use scoring='generate'.")
        return lm.generate(prompts, config.max_new_tokens)
    if config.scoring == "loglik":
        return runner.loglik(lm, prompts, [e.answers[0] for e in examples], config.batch_size)
    if config.scoring == "choice":
        cands = [candidates(e) for e in examples]
        return runner.choice(lm, prompts, [c[0] for c in cands], [c[1] for c in cands], config.batch_size)
    return runner.generate(lm, prompts, config.max_new_tokens, config.batch_size)


def needed_tokens(lm: LoadedModel, example: Example, prompt: Prompt, config: SweepConfig) -> int:
    """Tokens the scoring needs in the model's window: the prompt plus the longest answer or generation."""
    if config.scoring == "generate":
        return len(prompt.input_ids) + config.max_new_tokens
    answers = candidates(example)[0] if config.scoring == "choice" else [example.answers[0]]
    return len(prompt.input_ids) + max(len(lm.tokenizer(prompt.continuation(a), add_special_tokens=False)
                                           ["input_ids"]) for a in answers)


def load_backend(config: SweepConfig, device: str | None = None, dtype: str | None = None):
    """The model a sweep scores with: transformers (`load_model`) or a vLLM engine (`config.backend`)."""
    if config.backend == "vllm":
        from .vllm_backend import load_vllm

        return load_vllm(config.model, config.tensor_parallel, dtype=dtype)
    return load_model(config.model, device=device, dtype=dtype)


def sweep(config: SweepConfig, model: LoadedModel | None = None):
    """Run (or resume) every condition of a sweep; returns one row per example and condition.

    `model`, when given, is used instead of loading `config.model`, and its name is recorded.
    Examples already stored under a condition's config hash are skipped.  A prompt longer than the
    model's window is recorded with status "too_long" and no score, never truncated.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    if model is not None and model.name != config.model:  # results are named after the model really used
        config = replace(config, model=model.name)
    if isinstance(model, VLLMModel) and config.backend != "vllm":
        config = replace(config, backend="vllm")
    examples = load_examples(config)
    if config.shard is not None:  # one job of a split run; `litm merge` joins the jobs' result folders
        i, n = config.shard
        examples = examples[i::n]
        if not examples:
            raise ConfigError(f"shard {i}/{n} holds no examples (limit {config.limit}); use fewer shards.")
    if config.scoring == "choice":
        for e in examples:
            candidates(e)
    lm = model or load_backend(config)
    conds = config.conditions()
    for cond, pos in conds:  # a template or condition that cannot render fails before anything is written
        prompt_for(examples[0], cond, pos, config, lm.tokenizer)
    stores = {}
    for cond, pos in conds:
        rc = run_config(config, cond, pos)
        stores[(cond, pos)] = ResultStore(config.results_dir, config_hash(rc), rc, lm.identity)
    todo = [(c, p, e) for (c, p) in conds for e in examples if e.id not in stores[(c, p)]]
    bar = tqdm(total=len(todo), desc=f"{config.task} sweep", disable=not config.progress or not todo)
    window = lm.window
    for cond, pos in conds:
        store = stores[(cond, pos)]
        pending = [e for e in examples if e.id not in store]
        for start in range(0, len(pending), config.batch_size):
            chunk = pending[start:start + config.batch_size]
            prompts = [prompt_for(e, cond, pos, config, lm.tokenizer) for e in chunk]
            fits = [needed_tokens(lm, e, p, config) <= window for e, p in zip(chunk, prompts)]
            run_e = [e for e, f in zip(chunk, fits) if f]
            run_p = [p for p, f in zip(prompts, fits) if f]
            scored = iter(score_prompts(lm, run_e, run_p, config) if run_e else [])
            for e, p, f in zip(chunk, prompts, fits):
                rec = _record(e, p, cond, pos, config.scoring)
                if not f:
                    rec.update(status="too_long", correct=None, prediction=None, gold_loglik=None, gold_rank=None,
                               latency_s=None, window=window)
                else:
                    s = next(scored)
                    rec.update(status="ok", prediction=s.prediction, gold_loglik=s.gold_loglik,
                               gold_rank=s.gold_rank, latency_s=round(s.latency_s, 4))
                    if config.scoring == "choice":
                        rec["correct"] = s.gold_rank == 1
                        rec["num_candidates"] = len(s.candidate_logliks)
                    elif config.scoring == "generate":
                        rec["correct"] = (kv_match(s.prediction, e.answers[0]) if e.task == "kv"
                                          else best_subspan_em(s.prediction, e.answers))
                    else:
                        rec["correct"] = None
                store.append(rec)
                bar.update(1)
    bar.close()
    ids = [e.id for e in examples]
    rows = []
    ident = sweep_identity(run_config(config, "documents", None))
    sid, sconf = config_hash(ident), json.dumps(ident, sort_keys=True)
    for (cond, pos), store in stores.items():
        for r in store.records(ids):
            rows.append({**r, "model": config.model, "task": config.task, "num_docs": config.num_docs,
                         "config_hash": store.dir.name, "sweep_id": sid, "sweep_config": sconf})
    df = pd.DataFrame(rows)
    lead = [c for c in _LEAD_COLUMNS if c in df.columns]
    return df[lead + sorted(set(df.columns) - set(lead))]


def summarize(df, by=("condition", "position")):
    """Accuracy (with Wilson 95% intervals) or mean log-likelihood per condition, skipped prompts counted."""
    import pandas as pd

    from .stats import mean_interval, wilson_interval

    out = []
    for key, g in df.groupby(list(by), dropna=False, sort=False):
        ok = g[g["status"] == "ok"]
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row.update(n=len(ok), too_long=int((g["status"] == "too_long").sum()))
        if ok["correct"].notna().any():
            k = int(ok["correct"].astype(bool).sum())
            lo, hi = wilson_interval(k, len(ok))
            row.update(accuracy=k / len(ok) if len(ok) else float("nan"), ci_low=lo, ci_high=hi)
        if ok["gold_loglik"].notna().any():
            m, lo, hi = mean_interval(ok["gold_loglik"].astype(float).to_numpy())
            row.update(mean_loglik=m, loglik_ci_low=lo, loglik_ci_high=hi)
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

    probe = replace(config, limit=1, num_docs=1, positions=(0,), generate_docs=None)
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
