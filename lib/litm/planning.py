"""Sizing a study by power: a pilot on other questions gives the primary measure's effect and its spread over
questions, `stats.questions_needed` turns them into the questions a paired t-test needs for 80% power at
alpha = 0.05, and the study runs that many, within what the budget buys (and says so when it cannot).

A small pilot's standard deviation is itself uncertain, and planning on it gives the planned power only about
half the time; so the plan uses its one-sided 80% upper confidence limit (Browne, 1995, Statistics in Medicine
14:1933), which a pilot of 12 questions turns into about 1.6 times the questions."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import stats
from .errors import StatsError


@dataclass(frozen=True)
class Plan:
    """A pilot's numbers and the size they give."""

    measure: stats.Measure
    what: str  # the effect planned for, in words
    pilot_n: int
    effect: float  # the pilot's mean per-question effect
    sd: float  # its standard deviation over questions
    sd_planned: float  # the upper confidence limit of that standard deviation, which the size is planned on
    needed: int | None  # questions for the power asked (None: the pilot shows no effect to plan for)
    limit: int  # what the study runs: `needed`, at least `least`, at most `most` (which wins)
    seconds_per_question: float  # scoring time per question in the pilot (from its records)
    alpha: float = 0.05
    power: float = 0.8

    @property
    def text(self) -> str:
        m = self.measure
        head = (f"Pilot: {self.pilot_n} questions (not the study's), {self.what} on the {m.label}: "
                f"{m.format(self.effect, True)} {m.unit}, SD over questions {m.format(self.sd)} {m.unit} "
                f"(planned on its 80% upper limit, {m.format(self.sd_planned)}).")
        cost = lambda n: f"about {n * self.seconds_per_question / 60:.0f} min of scoring on this machine"
        if self.needed is None:
            return (head + f" No effect to plan for; the study runs {self.limit} questions ({cost(self.limit)}) and "
                    "reports what comes out.")
        text = (head + f" A paired t-test needs {self.needed} questions for {self.power:.0%} power at alpha = "
                f"{self.alpha} against that effect")
        if self.needed > self.limit:
            return (text + f" ({cost(self.needed)}); the budget buys {self.limit}, so this study is "
                    f"underpowered for it: run LIMIT = {self.needed} for the planned power.")
        return text + f"; the study runs {self.limit} ({cost(self.limit)})."


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
         what: str = "middle penalty", alpha: float = 0.05, power: float = 0.8, sd_level: float = 0.8) -> Plan:
    """The size of a study from its pilot's records: `effect(pilot)` gives one value per pilot question (its
    middle penalty, or its difference from the baseline, on the primary measure `m`); the study runs the
    questions a two-sided paired t-test needs for `power` at `alpha` against the pilot's mean effect, with the
    spread at the one-sided `sd_level` upper confidence limit of the pilot's (module docstring), at least
    `least` (intervals need a few questions) and at most `most` (what the time budget buys)."""
    from scipy.stats import chi2

    m = stats.measure(m)
    x = np.asarray(effect(pilot), dtype=float)
    if x.size < 3:
        raise StatsError(f"a pilot of {x.size} questions cannot estimate a spread; run at least 3.")
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    upper = sd * math.sqrt((x.size - 1) / chi2.ppf(1 - sd_level, x.size - 1))
    needed = stats.questions_needed(mean, upper, alpha, power) if mean != 0 and sd > 0 else None
    ok = pilot[pilot["status"] == "ok"] if "status" in pilot else pilot
    spent = [c for c in ("latency_s", "seconds") if c in ok]  # scoring, and compression where there is any
    seconds = float(ok[spent].fillna(0).to_numpy().sum()) / x.size if spent else math.nan
    limit = most if needed is None else min(most, max(least, needed))
    return Plan(m, what, int(x.size), mean, sd, upper, needed, limit, seconds, alpha, power)
