"""Sizing a study by power: a pilot on questions the study never sees gives the primary measure's effect and
its spread over questions, `stats.questions_needed` turns them into the questions a paired t-test needs for 80%
power at alpha = 0.05, and the study runs that many, within what the budget buys (and says so when it cannot).

The effect planned for is the smaller of the pilot's and a stated smallest effect of interest: a 3-10 question
pilot's mean can be almost anything, and planning on a large one would size a study too small to see the
effects that matter.  A small pilot's standard deviation is itself uncertain, and planning on it gives the
planned power only about half the time; so the plan uses its one-sided 80% upper confidence limit (Browne,
1995, Statistics in Medicine 14:1933), which a pilot of 12 questions turns into about 1.6 times the questions.
After the study, `conclusion` reads its interval against the same smallest effect: an effect, no effect as
large as it (an equivalence test), or too few questions to tell."""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import stats
from .errors import ConfigError, StatsError

# Where a plan tells the runner of a long job (`paper.run_jobs`) the size it picked, for the job's ETA.
PLAN_FILE = "LITM_PLAN_FILE"

# The measures each scoring records (`stats.measures_in` reads them off the records).
SCORED = {"choice": ("accuracy", "loglik", "margin"), "loglik": ("loglik",), "generate": ("accuracy",)}


@dataclass(frozen=True)
class Plan:
    """A pilot's numbers and the size they give."""

    measure: stats.Measure
    what: str  # the effect planned for, in words
    pilot_n: int
    effect: float  # the pilot's mean per-question effect
    sd: float  # its standard deviation over questions
    sd_planned: float  # the upper confidence limit of that standard deviation, which the size is planned on
    smallest: float | None  # the smallest effect of interest (the measure's units), stated before the pilot
    planned: float  # the effect the size is planned for: the smaller of |effect| and `smallest`
    needed: int | None  # questions for the power asked (None: nothing to plan for)
    limit: int  # what the study runs: `needed`, at least `least`, at most `most` (which wins)
    seconds_per_question: float  # a study question's scoring time, every condition of the study counted
    held_out: str = "other questions"  # where the pilot's questions come from, in words
    alpha: float = 0.05
    power: float = 0.8

    @property
    def text(self) -> str:
        m = self.measure
        head = (f"Pilot: {self.pilot_n} questions ({self.held_out}), {self.what} on the {m.label}: "
                f"{m.format(self.effect, True)} {m.unit}, SD over questions {m.format(self.sd)} {m.unit} "
                f"(planned on its 80% upper limit, {m.format(self.sd_planned)}).")
        if self.smallest is not None:
            head += (f" The smallest effect of interest is {m.format(self.smallest)} {m.unit}; the study is planned "
                     f"for the smaller of it and the pilot's, {m.format(self.planned)} {m.unit}.")
        cost = lambda n: f"about {n * self.seconds_per_question / 60:.0f} min of scoring on this machine"
        if self.needed is None:
            return (head + f" No effect to plan for; the study runs {self.limit} questions ({cost(self.limit)}) and "
                    "reports what comes out.")
        text = (head + f" A paired t-test needs {self.needed:,} questions for {self.power:.0%} power at alpha = "
                f"{self.alpha}")
        if self.needed > self.limit:
            return (text + f" ({cost(self.needed)}); the budget buys {self.limit}, so this study is "
                    f"underpowered for it: run LIMIT = {self.needed} for the planned power.")
        return text + f"; the study runs {self.limit} ({cost(self.limit)})."


@dataclass(frozen=True)
class PilotAndStudy:
    """A pilot's config and its study's, which share no question, and where the pilot's come from in words."""

    pilot: object
    study: object
    held_out: str


def pilot_and_study(config, pilot: int, pilot_seed: int | None, primary: str | None = None) -> PilotAndStudy:
    """The pilot and the study of a config, on different questions: with generated data the pilot is `pilot`
    questions made with `pilot_seed` (the study keeps its seed); with a data file (`data`, or a diagnosis's
    `cases`) it is the file's first `pilot` questions, which the study skips.  `primary`, when given, is
    checked against the config's scoring before anything runs (generation records no margin)."""
    scoring = getattr(config, "scoring", "choice")
    if primary is not None and stats.measure(primary).name not in SCORED[scoring]:
        raise ConfigError(f"PRIMARY = {primary!r} is not recorded under scoring {scoring!r}, which records "
                          f"{list(SCORED[scoring])}: set PRIMARY = {SCORED[scoring][0]!r} (or score by 'choice').")
    if pilot < 3:
        raise ConfigError(f"a pilot of {pilot} questions cannot estimate a spread; use at least 3.")
    source = (config.cases or "the cases given") if hasattr(config, "cases") else getattr(config, "data", "generated")
    if source == "generated" and not hasattr(config, "cases"):  # generated cases are a fixed list, as a file's
        if pilot_seed is None or pilot_seed == config.seed:
            raise ConfigError(f"the pilot needs a seed of its own (PILOT_SEED), not the study's {config.seed}: the "
                              "same seed makes the same questions.")
        return PilotAndStudy(replace(config, limit=pilot, seed=pilot_seed), config,
                             f"generated with seed {pilot_seed}; the study's with seed {config.seed}")
    return PilotAndStudy(replace(config, limit=pilot), replace(config, skip=config.skip + pilot),
                         f"the first {pilot} of {Path(str(source)).name}, which the study skips")


def budget(most, lm) -> int:
    """The most questions a study may run: `most` itself, or, given a mapping from dtype name to questions (what
    the notebook's time budget buys in each, e.g. ``{"bfloat16": 144, "float32": 24}``), the entry for the dtype
    `lm` runs in.  The dtype is in the run's identity, so a run's size follows from its identity."""
    if not isinstance(most, Mapping):
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise ConfigError(f"MOST must be a positive number of questions or a mapping from dtype to one, not {most!r}.")
        return most
    dtype = lm.identity.get("dtype")
    if dtype not in most:
        raise ConfigError(f"MOST gives sizes for {sorted(most)} but the model runs in {dtype}: add an entry for "
                          f"{dtype!r} or set MOST to a number.")
    return budget(most[dtype], lm)


def check_held_out(pilot, study) -> None:
    """A StatsError when a pilot shares a question with its study: each is records (their `case_id`s, or
    `example_id`s) or question ids.  A plan from the study's own questions would be sized on its result."""
    def ids(x) -> set:
        if hasattr(x, "columns"):
            return set(x["case_id" if "case_id" in x.columns else "example_id"])
        return set(x)

    shared = sorted(ids(pilot) & ids(study))
    if shared:
        raise StatsError(f"the pilot shares {len(shared)} questions with the study (e.g. {shared[:3]}); a pilot must "
                         "use questions the study never sees: give it another seed (generated data) or let the "
                         "study skip its questions (`planning.pilot_and_study`).")


def middle_penalties(df, m: str | stats.Measure) -> np.ndarray:
    """Each question's middle penalty (edges minus middle) on a measure, from a sweep's records or from a
    table of units x gold positions already made (e.g. `diagnose.case_table`)."""
    m = stats.measure(m)
    table = df if isinstance(df, stats.PairedTable) else stats.paired_table(df[df["condition"] == "documents"],
                                                                            m.column)
    return stats.question_penalties(table)


def differences(df, condition, baseline, m: str | stats.Measure, column: str = "condition",
                unit: str = "example_id") -> np.ndarray:
    """Each question's value under `condition` minus `baseline` on a measure (a question's records under one
    condition averaged, e.g. over gold positions)."""
    m = stats.measure(m)
    held = list(dict.fromkeys((df[df["status"] == "ok"] if "status" in df else df)[column]))
    missing = [c for c in (condition, baseline) if c not in held]
    if missing:
        raise StatsError(f"the pilot has no records under {missing}; it holds {held}.")
    wide = stats.unit_means(df, m.column, (condition, baseline), column, unit)
    return (wide[condition] - wide[baseline]).to_numpy()


def plan(pilot, effect: Callable[[object], np.ndarray], m: str | stats.Measure, most: int, least: int = 10,
         smallest: float | None = None, what: str = "middle penalty", held_out: str = "other questions",
         records_per_question: float | None = None, alpha: float = 0.05, power: float = 0.8,
         sd_level: float = 0.8) -> Plan:
    """The size of a study from its pilot's records: `effect(pilot)` gives one value per pilot question (its
    middle penalty, or its difference from the baseline, on the primary measure `m`); the study runs the
    questions a two-sided paired t-test needs for `power` at `alpha` against the smaller of the pilot's mean
    effect and `smallest` (the smallest effect of interest, stated before the pilot; None plans on the pilot's
    alone), with the spread at the one-sided `sd_level` upper confidence limit of the pilot's (module
    docstring), at least `least` and at most `most` (what the time budget buys).  `held_out` says in words
    where the pilot's questions come from.  The time per question counts `records_per_question` records (every
    condition of the study; default: as many as the pilot scored per question)."""
    from scipy.stats import chi2

    m = stats.primary_measure(pilot, m)  # a measure the pilot lacks is an error that says so
    x = np.asarray(effect(pilot), dtype=float)
    if x.size < 3:
        raise StatsError(f"a pilot of {x.size} questions cannot estimate a spread; run at least 3.")
    if smallest is not None and not smallest > 0:
        raise StatsError(f"the smallest effect of interest must be above 0, not {smallest}.")
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    upper = sd * math.sqrt((x.size - 1) / chi2.ppf(1 - sd_level, x.size - 1))
    planned = abs(mean) if smallest is None else min(abs(mean), smallest)
    needed = stats.questions_needed(planned, upper, alpha, power) if planned > 0 and sd > 0 else None
    ok = pilot[pilot["status"] == "ok"] if "status" in pilot else pilot
    spent = [c for c in ("latency_s", "seconds") if c in ok]  # scoring, and compression where there is any
    seconds = float(ok[spent].fillna(0).to_numpy().sum()) if spent else math.nan
    per_record = seconds / len(ok) if spent and len(ok) else math.nan
    records = records_per_question if records_per_question is not None else len(ok) / x.size
    per_question = per_record * records
    limit = most if needed is None else min(most, max(least, needed))
    _tell_runner(len(ok) + limit * records, seconds + limit * per_question)
    return Plan(m, what, int(x.size), mean, sd, upper, smallest, planned, needed, limit, per_question, held_out,
                alpha, power)


def _tell_runner(records, seconds) -> None:
    """Write the records the run will have stored (pilot and study) and their expected seconds where the runner
    asked for them (the `PLAN_FILE` environment variable), so its ETA is one time, not a range; cosmetic, so a
    failure to write is ignored."""
    path = os.environ.get(PLAN_FILE)
    if not path:
        return
    told = {k: v for k, v in (("records", records), ("seconds", seconds)) if v is not None and v == v}
    try:
        Path(path).write_text(json.dumps(told))
    except OSError:
        pass


def conclusion(values, m: str | stats.Measure, smallest: float, what: str = "the effect") -> str:
    """What a study's per-question effects say, read against the smallest effect of interest: an effect (the
    t interval excludes 0), no effect as large as `smallest` (two one-sided t-tests, TOST: the 90% interval lies
    within +-smallest), or too few questions to tell (neither)."""
    m = stats.measure(m)
    est = stats.t_estimate(values)
    ci = (f"{m.format(est.value, True)} {m.unit}, 95% CI [{m.format(est.low, True)}, {m.format(est.high, True)}], "
          f"n = {est.n}")
    if est.low > 0 or est.high < 0:
        return f"{what.capitalize()} is {ci}: the interval excludes 0 (t-test p = {est.p_value:.2g})."
    tost = stats.equivalence(values, smallest)
    bound = f"+-{m.format(stats.equivalence_bound(est))} {m.unit}"
    if tost.p_value < 0.05:
        return (f"{what.capitalize()} is {ci}: no effect as large as +-{m.format(smallest)} {m.unit} (equivalence "
                f"test, TOST p = {tost.p_value:.2g}; it rules out effects beyond {bound}).")
    return (f"{what.capitalize()} is {ci}: the interval includes 0 and reaches past +-{m.format(smallest)} "
            f"{m.unit} (TOST p = {tost.p_value:.2g}), so this study cannot tell an effect of that size from none; "
            f"it rules out only effects beyond {bound}, and needs more questions to do better (see the plan).")
