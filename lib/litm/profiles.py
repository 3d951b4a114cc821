"""Profiles: what the one notebook parameter PROFILE sets, and the runs `make paper` makes of the notebooks.

`course` is the config cells as shipped (about 5 minutes a notebook on a 2-core CPU). `paper` is the paper's shape
(20 and 30 documents of about 100 words, 75 and 140 key-value pairs, every gold position the paper draws) on both
packaged models, at the sizes the primary contrasts need; `paper-gpu` is the same on the paper's own data with
generation, for a 7B-class hub model on a GPU. A profile replaces only the values still at their shipped default,
so a value you set (in the config cell, or with `-p`) stays: `use` says what it set and what it kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"  # the shipped notebooks, whose defaults are `course`

# 100-word documents, as the paper's Wikipedia passages: the generator's sentences average about 11 words
PAPER_SENTENCES = 9
QA20 = {"NUM_DOCS": 20, "POSITIONS": (0, 4, 9, 14, 19), "SENTENCES": PAPER_SENTENCES}
QA30 = {"NUM_DOCS": 30, "POSITIONS": (0, 4, 9, 14, 19, 24, 29), "SENTENCES": PAPER_SENTENCES}
KV75 = {"NUM_PAIRS": 75, "POSITIONS": (0, 24, 49, 74)}
KV140 = {"NUM_PAIRS": 140, "POSITIONS": (0, 34, 69, 104, 139)}
# bfloat16 wherever the paper profile runs: its records are committed and a run resumes on whatever machine comes
# next, so the dtype is not left to each CPU (`paper.check_dtype` stops one that would emulate bfloat16 too slowly)
PAPER_DTYPE = {"DTYPE": "bfloat16"}
PAPER_RESULTS = {"RESULTS_DIR": "../results/paper", **PAPER_DTYPE}
LIU = "../data/liu2023"


@dataclass(frozen=True)
class Run:
    """One execution of a notebook in a profile: its label (the executed copy's and the figures' name), the
    values it sets beyond the profile's, and the smallest window a model needs for it (shorter ones skip it)."""

    notebook: str  # the two-digit number
    label: str
    parameters: dict = field(default_factory=dict)
    window: int = 0
    per_model: bool = True  # False: once, with the profile's first model (a notebook that compares models itself)
    by_model: dict = field(default_factory=dict)  # model -> values beyond `parameters` for that model's run only


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    settings: dict  # notebook number -> {NAME: value}: what the profile sets in that notebook
    models: tuple[str, ...] = ()
    runs: tuple[Run, ...] = ()
    tables: tuple[tuple[str, int, str], ...] = ()  # (task, size, the run's label): what the summary table reports
    seconds: dict = field(default_factory=dict)  # "model/label" -> expected wall seconds (or (fewest, most)): the ETA
    per_record: dict = field(default_factory=dict)  # "model/label" -> expected seconds a stored record: the live ETA


PAPER_SETTINGS = {
    "01": {**KV75, **PAPER_RESULTS, "MOST": 400, "LEAST": 100, "PILOT": 20},
    "02": {**QA20, **PAPER_RESULTS, "MOST": 400, "LEAST": 100, "PILOT": 20},
    "03": {**QA20, **PAPER_RESULTS, "LIMIT": 100, "CAL_EXAMPLES": 5, "SINK_LENGTHS": (1000, 2000, 4000, 8000)},
    "04": {**PAPER_RESULTS, "POOL": 40, "K": 20, "SENTENCES": PAPER_SENTENCES, "MOST": 300, "PILOT": 20},
    "05": {**QA20, **PAPER_RESULTS, "POSITIONS": (0, 9, 19), "BUDGETS": (1000,), "MOST": 300, "PILOT": 20},
    "06": {**QA20, **PAPER_RESULTS, "LIMIT": 100, "LENGTHS": (1000, 2000, 4000, 8000), "GRID_LIMIT": 10},
    "07": {**PAPER_DTYPE, "CASES": "generated", "RESULTS_DIR": "../results/paper/diagnose", "PILOT": 6, "MOST": 40,
           "ORDERS": 2},
    "08": {**QA20, **PAPER_RESULTS, "POSITIONS": (0, 9, 19), "BUDGET": 1500, "BIAS_EXAMPLES": 5, "PILOT": 10,
           "MOST": 60},
}

PAPER_GPU_SETTINGS = {
    "01": {**KV75, "RESULTS_DIR": "../results/paper-gpu",
           "DATA": f"{LIU}/kv_retrieval_data/kv-retrieval-75_keys.jsonl.gz", "SCORING": "generate",
           "PRIMARY": "accuracy", "SMALLEST": 0.05, "MOST": 500, "LEAST": 100, "PILOT": 50, "BATCH_SIZE": 16},
    "02": {**QA20, "RESULTS_DIR": "../results/paper-gpu",
           "DATA": f"{LIU}/qa_data/20_total_documents/nq-open-20_total_documents_gold_at_0.jsonl.gz",
           "SCORING": "generate", "PRIMARY": "accuracy", "SMALLEST": 0.05, "MOST": 2655, "LEAST": 100,
           "PILOT": 50, "BATCH_SIZE": 16},
}


def _runs(gpu: bool = False) -> tuple[Run, ...]:
    # 140 generated key-value pairs are about 10,000 tokens with either packaged model's tokenizer
    liu = f"{LIU}/kv_retrieval_data/kv-retrieval-140_keys.jsonl.gz"
    qa30 = f"{LIU}/qa_data/30_total_documents/nq-open-30_total_documents_gold_at_0.jsonl.gz"
    if gpu:
        return (Run("01", "01-kv-75"), Run("01", "01-kv-140", {**KV140, "DATA": liu}, window=10500),
                Run("02", "02-qa-20"), Run("02", "02-qa-30", {**QA30, "DATA": qa30}))
    # on a CPU, 140 pairs on either model and 75 on Gemma (over 30 hours at the cap on a 2-core AVX-512 CPU) are
    # capped at the floor, declared before they run (docs/paper.md, "How long it takes")
    floor = {"MOST": PAPER_SETTINGS["01"]["LEAST"]}
    return (Run("01", "01-kv-75", by_model={"gemma3-270m": floor}),
            Run("01", "01-kv-140", {**KV140, **floor}, window=10500),
            Run("02", "02-qa-20"), Run("02", "02-qa-30", QA30),
            Run("03", "03-attention-20"), Run("04", "04-strategies"), Run("05", "05-compression"),
            Run("06", "06-statistics"), Run("07", "07-diagnosis", per_model=False), Run("08", "08-levers"))


# Seconds a question (every condition of it) on a 2-core Xeon with AMX in bfloat16, forced choice, measured on 3
# questions per shape (2026-12-04): the ETA's first guess is this times the pilot and the study's questions, from
# the fewest the profile allows (LEAST) to its cap (MOST): the pilot's plan picks between them as the run goes.
SECONDS_PER_QUESTION = {
    ("smollm2-135m", "01-kv-75"): 38.4, ("smollm2-135m", "02-qa-20"): 9.7, ("smollm2-135m", "02-qa-30"): 26.5,
    ("gemma3-270m", "01-kv-75"): 76.1, ("gemma3-270m", "02-qa-20"): 14.5, ("gemma3-270m", "02-qa-30"): 37.5,
}


def _expected(settings: dict, runs: tuple[Run, ...]) -> dict:
    out = {}
    for (model, label), per_question in SECONDS_PER_QUESTION.items():
        run = next(r for r in runs if r.label == label)
        s = {**settings[run.notebook], **run.parameters, **run.by_model.get(model, {})}
        out[f"{model}/{label}"] = (per_question * (s["PILOT"] + s["LEAST"]), per_question * (s["PILOT"] + s["MOST"]))
    return out


# the records a question stores beside its gold positions: 01's oracle; 02's closed-book and oracle
BASELINES = {"01": 1, "02": 2}


def _per_record(settings: dict, runs: tuple[Run, ...]) -> dict:
    """Expected seconds a record: a question's seconds over the records it stores (a gold position or a baseline
    each), so the records a run stores as it goes tell how fast this machine is against the guess."""
    out = {}
    for (model, label), per_question in SECONDS_PER_QUESTION.items():
        run = next(r for r in runs if r.label == label)
        positions = {**settings[run.notebook], **run.parameters}["POSITIONS"]
        out[f"{model}/{label}"] = per_question / (len(positions) + BASELINES[run.notebook])
    return out


TABLES = (("qa", 20, "02-qa-20"), ("qa", 30, "02-qa-30"), ("kv", 75, "01-kv-75"), ("kv", 140, "01-kv-140"))

PAPER_RUNS = _runs()

PROFILES = {
    "course": Profile("course", "the config cells as shipped: about 5 minutes a notebook on a 2-core CPU", {}),
    "paper": Profile(
        "paper", "the paper's shape on both packaged models at the sizes the primary contrasts need (a 2-core CPU)",
        PAPER_SETTINGS, ("smollm2-135m", "gemma3-270m"), PAPER_RUNS, TABLES, _expected(PAPER_SETTINGS, PAPER_RUNS),
        _per_record(PAPER_SETTINGS, PAPER_RUNS)),
    "paper-gpu": Profile(
        "paper-gpu", "the paper's data with generation on 7B-class hub models (a GPU; `python -m litm fetch "
        "liu2023` first)", PAPER_GPU_SETTINGS, ("meta-llama/Llama-2-7b-chat-hf", "Qwen/Qwen2.5-7B-Instruct"),
        _runs(gpu=True), TABLES),
}


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {name!r}: use one of {', '.join(PROFILES)}.")
    return PROFILES[name]


def shipped_defaults(notebook: str) -> dict:
    """The values the shipped notebook's config cell sets (its `course` profile)."""
    from .notebooks import declared

    found = sorted(NOTEBOOKS.glob(f"{notebook}-*.ipynb"))
    if not found:
        raise ConfigError(f"no shipped notebook {notebook}-*.ipynb in {NOTEBOOKS}: profiles read the notebooks' "
                          "defaults from the repository (install it with `pip install -e .`).")
    return declared(found[0])


def settings(name: str, notebook: str) -> dict:
    """What profile `name` sets in notebook `notebook` ("02"), every name one its config cell declares."""
    values = profile(name).settings.get(notebook, {})
    unknown = sorted(set(values) - set(shipped_defaults(notebook))) if values else []
    if unknown:
        raise ConfigError(f"profile {name!r} sets {', '.join(unknown)}, which notebook {notebook} does not declare.")
    return values


def use(name: str, notebook: str, namespace: dict, quiet: bool = False) -> dict:
    """Apply profile `name` to a notebook's config values in `namespace` (its `globals()`): each value the profile
    sets replaces one still at the shipped default; one you changed stays. Returns what was set."""
    values = settings(name, notebook)
    if not values:
        return {}
    defaults = shipped_defaults(notebook)
    changed, kept = {}, []
    for key, value in values.items():
        if namespace.get(key) == defaults[key]:
            namespace[key] = changed[key] = value
        else:
            kept.append(f"{key}={namespace.get(key)!r}")
    if not quiet:
        print(f"profile {name}: " + ", ".join(f"{k}={v!r}" for k, v in changed.items())
              + (f"; kept as you set them: {', '.join(kept)}" if kept else ""))
    return changed
