"""Honest statistics for position experiments: intervals, paired resampling and tests, models, power.

Every condition of a position sweep uses the same questions, so comparisons between conditions are
paired: the bootstrap resamples question ids, McNemar and Cochran's Q use per-question agreement, and
the logistic model clusters by question.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .errors import StatsError

Z95 = 1.959963984540054


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (95% by default); (nan, nan) when n is 0."""
    if n == 0:
        return float("nan"), float("nan")
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def proportion_interval(values) -> tuple[float, float, float]:
    """The share of true values (e.g. correct answers) with its Wilson 95% interval; nan when empty."""
    x = np.asarray(values, dtype=bool)
    lo, hi = wilson_interval(int(x.sum()), x.size)
    return (float(x.mean()) if x.size else float("nan")), lo, hi


def mean_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """Mean with a Student-t interval; the interval is nan for fewer than two values."""
    from scipy import stats as st

    x = np.asarray(values, dtype=float)
    m = float(x.mean()) if x.size else float("nan")
    if x.size < 2:
        return m, float("nan"), float("nan")
    half = float(st.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


# ----------------------------------------------------------------------------- paired tables
@dataclass(frozen=True)
class PairedTable:
    """One value per question (rows) and condition (columns), every row complete."""

    ids: tuple[str, ...]
    conditions: tuple  # condition keys: a gold position (int), "closedbook" or "oracle"
    values: np.ndarray  # [questions, conditions], float
    dropped: int = 0  # questions left out because some condition has no score (e.g. too long)

    def column(self, condition) -> np.ndarray:
        return self.values[:, self.conditions.index(condition)]

    @property
    def binary(self) -> bool:
        return bool(np.isin(self.values, (0.0, 1.0)).all())


# ----------------------------------------------------------------------------- measures
@dataclass(frozen=True)
class Measure:
    """What a record is scored by.  Higher is better for every measure, so a middle penalty (edges minus
    middle) and a difference from a baseline read the same way for all of them."""

    name: str
    column: str  # the record field
    label: str
    unit: str  # "points" (a share, shown x 100) or "nats"
    binary: bool
    summary: tuple[str, str, str]  # its value and interval columns in `experiment.summarize`

    def scale(self, v: float) -> float:
        return 100 * v if self.unit == "points" else v

    def format(self, v, sign: bool = False) -> str:
        """A value in the measure's unit: points with one decimal, nats with two."""
        if v is None or np.isnan(v):
            return "n/a"
        return f"{self.scale(v):{'+' if sign else ''}.{1 if self.unit == 'points' else 2}f}"


MEASURES = {
    "accuracy": Measure("accuracy", "correct", "accuracy", "points", True, ("accuracy", "ci_low", "ci_high")),
    "loglik": Measure("loglik", "gold_loglik", "gold answer log-likelihood", "nats", False,
                      ("mean_loglik", "loglik_ci_low", "loglik_ci_high")),
    "margin": Measure("margin", "gold_margin", "gold margin over the best other candidate", "nats", False,
                      ("mean_margin", "margin_ci_low", "margin_ci_high")),
}


def measure(name: str | Measure) -> Measure:
    if isinstance(name, Measure):
        return name
    if name not in MEASURES:
        raise StatsError(f"unknown measure {name!r}: use one of {list(MEASURES)}.")
    return MEASURES[name]


def measures_in(df) -> list[Measure]:
    """The measures the records hold: accuracy unless log-likelihood scoring, the gold's log-likelihood
    unless generation, the margin under forced choice (records written before it was stored lack it)."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    return [m for m in MEASURES.values() if m.column in ok and ok[m.column].notna().any()]


def value_column(df) -> str:
    """`correct` when the records have it (accuracy), else `gold_loglik`."""
    found = [m.column for m in measures_in(df) if m.name != "margin"]
    if not found:
        raise StatsError("the records have neither correctness nor gold log-likelihoods to analyse.")
    return found[0]


def primary_measure(df, primary: str | Measure | None = None) -> Measure:
    """The measure a report leads with: `primary` (an error when the records lack it), else the first held."""
    held = measures_in(df)
    if primary is None:
        if not held:
            raise StatsError("the records hold no measure to analyse (no correctness, no log-likelihoods).")
        return held[0]
    m = measure(primary)
    if m not in held:
        raise StatsError(f"the records hold no {m.label} ({m.column}); they hold {[h.name for h in held]}. "
                         + ("Forced choice (scoring='choice') stores the margin; records written before it did "
                            "lack it: rerun into a new results folder." if m.name == "margin"
                            else "Choose another measure."))
    return m


def condition_key(row) -> object:
    return int(row["position"]) if row["condition"] == "documents" else row["condition"]


def paired_table(df, value: str | None = None, conditions: Sequence | None = None) -> PairedTable:
    """Pivot sweep records into a question x condition table; conditions are gold positions (ints) in
    order, then "closedbook" and "oracle".  Different question sets across conditions are an error."""
    if len(df) == 0:
        raise StatsError("no records: there is nothing to analyse.")
    value = value or value_column(df)
    df = df.assign(_key=[condition_key(r) for _, r in df[["condition", "position"]].iterrows()])
    ids_by = {k: set(g["example_id"]) for k, g in df.groupby("_key", sort=False)}
    d = df[df["status"] == "ok"] if "status" in df else df
    keys = list(conditions) if conditions is not None else sorted(
        ids_by, key=lambda k: (1, str(k)) if isinstance(k, str) else (0, k))
    missing = [k for k in keys if k not in ids_by]
    if missing:
        raise StatsError(f"conditions {missing} have no examples.")
    dup = df.duplicated(subset=["example_id", "_key"])
    if dup.any():
        raise StatsError(f"{int(dup.sum())} questions appear twice under one condition; results of different "
                         "runs are mixed. Analyse one sweep at a time (report groups them by sweep).")
    sets = [ids_by[k] for k in keys]
    if any(s != sets[0] for s in sets):
        sizes = {str(k): len(s) for k, s in zip(keys, sets)}
        raise StatsError(f"the conditions do not hold the same questions ({sizes}); a paired analysis needs "
                         "every condition run on the same examples (same data, seed and limit).")
    wide = d.pivot_table(index="example_id", columns="_key", values=value, aggfunc="first")
    wide = wide.reindex(index=sorted(sets[0]), columns=keys).astype(float)
    complete = wide.dropna()
    if len(complete) == 0:
        raise StatsError("no question has a score under every condition (all too long?).")
    return PairedTable(tuple(complete.index), tuple(keys), complete.to_numpy(), dropped=len(wide) - len(complete))


# ----------------------------------------------------------------------------- paired bootstrap
@dataclass(frozen=True)
class Estimate:
    """A statistic, its percentile bootstrap interval and a two-sided bootstrap p-value against 0."""

    value: float
    low: float
    high: float
    p_value: float
    n: int
    n_boot: int
    level: float = 0.95


def bootstrap(table: PairedTable, statistic: Callable[[np.ndarray], np.ndarray], n_boot: int = 10_000,
              seed: int = 0, level: float = 0.95, chunk: int = 1000) -> Estimate:
    """Paired bootstrap over questions.  `statistic` maps condition means [..., conditions] to a value
    per row; resampling is a multinomial weighting of the questions, done in matrix products."""
    n = len(table.ids)
    if n < 2:
        raise StatsError(f"a bootstrap needs at least two questions, got {n}.")
    rng = np.random.default_rng(seed)
    point = float(statistic(table.values.mean(axis=0)[None, :])[0])
    draws = []
    for start in range(0, n_boot, chunk):
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=min(chunk, n_boot - start))
        draws.append(statistic(w @ table.values / n))
    return estimate_from_draws(point, np.concatenate(draws), n, level)


def estimate_from_draws(point: float, boot: np.ndarray, n: int, level: float = 0.95) -> Estimate:
    """An Estimate from bootstrap draws: the percentile interval and a two-sided p-value against 0."""
    boot = np.asarray(boot, dtype=float)
    alpha = (1 - level) / 2
    low, high = np.quantile(boot, [alpha, 1 - alpha])
    # (count + 1) / (draws + 1): a bootstrap p-value is never exactly 0
    p = min(1.0, 2 * (min(np.sum(boot <= 0), np.sum(boot >= 0)) + 1) / (len(boot) + 1))
    return Estimate(float(point), float(low), float(high), float(p), n, len(boot), level)


def cluster_bootstrap(clusters, fit: Callable[[np.ndarray], Sequence[float] | None], n_boot: int = 2000,
                      seed: int = 0) -> np.ndarray:
    """Bootstrap over clusters (e.g. each case's prompts resampled together): every draw picks the clusters
    with replacement and calls `fit` on the row indices of the drawn clusters; `fit` returns the statistics,
    or None for a draw it cannot fit, which is skipped.  Returns the draws that fit, [draws, statistics]."""
    clusters = np.asarray(clusters)
    ids = sorted(set(clusters.tolist()))
    index = {c: np.flatnonzero(clusters == c) for c in ids}
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        value = fit(np.concatenate([index[c] for c in rng.choice(ids, size=len(ids))]))
        if value is not None:
            draws.append(value)
    return np.array(draws, dtype=float).reshape(len(draws), -1)


def edges_and_middle(positions: Sequence[int]) -> tuple[list[int], list[int]]:
    """The first and last positions, and the middle one (the two central ones for an even count)."""
    ps = sorted(positions)
    if len(ps) < 3:
        raise StatsError(f"a middle penalty needs at least three gold positions, got {ps}.")
    k = len(ps)
    middle = [ps[k // 2]] if k % 2 else [ps[k // 2 - 1], ps[k // 2]]
    return [ps[0], ps[-1]], middle


def penalty_from_means(means: np.ndarray, conditions: Sequence, positions: Sequence[int]) -> np.ndarray:
    """Mean of the edge positions minus the mean of the middle position(s), row by row."""
    edges, middle = edges_and_middle(positions)
    e = [conditions.index(p) for p in edges]
    m = [conditions.index(p) for p in middle]
    return means[..., e].mean(axis=-1) - means[..., m].mean(axis=-1)


def middle_penalty(df_or_table, n_boot: int = 10_000, seed: int = 0, level: float = 0.95) -> Estimate:
    """Accuracy (or log-likelihood) at the first and last positions averaged, minus the middle, with a
    paired-bootstrap interval over questions."""
    t = df_or_table if isinstance(df_or_table, PairedTable) else paired_table(df_or_table)
    positions = [c for c in t.conditions if isinstance(c, (int, np.integer))]
    return bootstrap(t, lambda m: penalty_from_means(m, list(t.conditions), positions), n_boot, seed, level)


def difference(table: PairedTable, a, b, n_boot: int = 10_000, seed: int = 0, level: float = 0.95) -> Estimate:
    """Mean of condition `a` minus mean of condition `b`, paired over questions."""
    ia, ib = table.conditions.index(a), table.conditions.index(b)
    return bootstrap(table, lambda m: m[..., ia] - m[..., ib], n_boot, seed, level)


@dataclass(frozen=True)
class Effect:
    """One measure's paired comparison: the estimate with its bootstrap interval over questions, and tests."""

    measure: Measure
    estimate: Estimate
    tests: list


def middle_effect(table: PairedTable, m: str | Measure, n_boot: int = 10_000, seed: int = 0) -> Effect:
    """The middle penalty on a measure's table, with Cochran's Q over the positions and McNemar's test of
    the first position against the middle (right/wrong), or the paired t and Wilcoxon tests of each
    question's edge mean against its middle mean (continuous)."""
    m = measure(m)
    positions = [c for c in table.conditions if isinstance(c, (int, np.integer))]
    edges, middle = edges_and_middle(positions)
    col = table.conditions.index
    if m.binary:
        q = cochrans_q(table.values[:, [col(p) for p in positions]])
        test = mcnemar_exact(table.column(positions[0]), table.column(middle[0]))
        tests = [q, TestResult(f"McNemar exact: position {positions[0] + 1} vs {middle[0] + 1}", test.statistic,
                               test.p_value, test.detail)]
    else:
        tests = paired_tests(table.values[:, [col(p) for p in edges]].mean(1),
                             table.values[:, [col(p) for p in middle]].mean(1), False)
    return Effect(m, middle_penalty(table, n_boot, seed), tests)


def unit_means(df, column: str, conditions, condition: str = "condition", unit: str = "example_id"):
    """Units x conditions: each unit's mean of a record field under each condition (scored records only),
    units without a value under every condition left out."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    wide = ok.pivot_table(index=unit, columns=condition, values=column, aggfunc="mean")
    return wide.reindex(columns=list(conditions)).astype(float).dropna()


_P_COLUMN = {"McNemar exact": "mcnemar_p", "paired t": "t_p", "Wilcoxon signed-rank": "wilcoxon_p"}


def versus_baseline(df, baseline, measures=None, condition: str = "condition", unit: str = "example_id",
                    n_boot: int = 10_000, seed: int = 0):
    """Each condition minus `baseline`, per measure (default: every one the records hold), paired over
    units: one row per condition and measure with the difference, its bootstrap 95% interval and p-value,
    and the paired tests (McNemar for right/wrong values, else paired t and Wilcoxon).  A unit's records
    under one condition are averaged first (e.g. its gold positions), so the units resampled are whole
    questions.  Units without a value under every condition (too long, not scored) are left out."""
    import pandas as pd

    conds = list(dict.fromkeys(df[condition]))
    if baseline not in conds:
        raise StatsError(f"baseline {baseline!r} is not one of the conditions {conds}.")
    rows = []
    for m in [measure(x) for x in measures] if measures else measures_in(df):
        wide = unit_means(df, m.column, conds, condition, unit)
        if len(wide) < 2:
            raise StatsError(f"fewer than two {unit}s have a {m.label} under every condition; nothing to pair.")
        table = PairedTable(tuple(wide.index), tuple(conds), wide.to_numpy())
        for c in conds:
            if c == baseline:
                continue
            est = difference(table, c, baseline, n_boot, seed)
            tests = paired_tests(table.column(c), table.column(baseline), table.binary)
            rows.append({condition: c, "measure": m.name, "n": est.n, "diff": est.value, "diff_low": est.low,
                         "diff_high": est.high, "p_boot": est.p_value,
                         **{_P_COLUMN[t.name]: t.p_value for t in tests}})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- exact and rank tests
@dataclass(frozen=True)
class TestResult:
    name: str
    statistic: float
    p_value: float
    detail: dict


def _binary(x, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if not np.isin(x, (0.0, 1.0)).all():
        raise StatsError(f"{what} needs right/wrong outcomes (0/1); these records hold continuous scores.")
    return x


def paired_t(a, b) -> TestResult:
    """Paired t-test of a - b (two-sided), from the differences' mean and standard deviation."""
    from scipy.stats import t as t_dist

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.size < 2:
        raise StatsError(f"a paired t-test needs at least two pairs, got {d.size}.")
    sd = float(d.std(ddof=1))
    if sd == 0:
        return TestResult("paired t", float("nan"), 1.0 if d.mean() == 0 else 0.0, {"df": d.size - 1})
    t = float(d.mean() / (sd / math.sqrt(d.size)))
    return TestResult("paired t", t, float(2 * t_dist.sf(abs(t), d.size - 1)), {"df": d.size - 1})


def wilcoxon_signed_rank(a, b) -> TestResult:
    """Wilcoxon signed-rank test of a - b (two-sided; zero differences dropped, exact when small and untied)."""
    from scipy.stats import wilcoxon

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    nonzero = int((d != 0).sum())
    if nonzero == 0:
        return TestResult("Wilcoxon signed-rank", 0.0, 1.0, {"nonzero": 0})
    r = wilcoxon(d, zero_method="wilcox")
    return TestResult("Wilcoxon signed-rank", float(r.statistic), float(r.pvalue), {"nonzero": nonzero})


def paired_tests(a, b, binary: bool) -> list[TestResult]:
    """The paired tests of a against b: McNemar's exact test for right/wrong outcomes, the paired t-test
    and the Wilcoxon signed-rank test for continuous ones."""
    return [mcnemar_exact(a, b)] if binary else [paired_t(a, b), wilcoxon_signed_rank(a, b)]


def mcnemar_exact(a, b) -> TestResult:
    """McNemar's exact test for paired right/wrong outcomes under two conditions."""
    from scipy.stats import binomtest

    a, b = _binary(a, "McNemar's test"), _binary(b, "McNemar's test")
    if a.shape != b.shape:
        raise StatsError(f"McNemar's test needs paired outcomes: got {a.size} and {b.size} questions.")
    only_a = int(((a == 1) & (b == 0)).sum())
    only_b = int(((a == 0) & (b == 1)).sum())
    n = only_a + only_b
    p = 1.0 if n == 0 else float(binomtest(min(only_a, only_b), n, 0.5).pvalue)
    return TestResult("McNemar exact", float(min(only_a, only_b)), p, {"only_first": only_a, "only_second": only_b})


def cochrans_q(values) -> TestResult:
    """Cochran's Q: do k paired right/wrong conditions share one success rate?  Chi-square, k-1 df."""
    from scipy.stats import chi2

    x = _binary(values, "Cochran's Q")
    n, k = x.shape
    if k < 2:
        raise StatsError("Cochran's Q needs at least two conditions.")
    col, row, total = x.sum(axis=0), x.sum(axis=1), x.sum()
    denom = k * total - (row ** 2).sum()
    q = 0.0 if denom == 0 else float((k - 1) * (k * (col ** 2).sum() - total ** 2) / denom)
    return TestResult("Cochran's Q", q, float(chi2.sf(q, k - 1)), {"df": k - 1, "n": n})


# ----------------------------------------------------------------------------- models
def position_length_model(df, depth: str = "gold_rel_depth", length: str = "prompt_tokens",
                          cluster: str = "example_id", quadratic: bool = True):
    """Logistic GEE of correctness on depth and length with their interaction, clustered by question.

    Depth enters as centred depth and its square (a U-shape is quadratic), length in thousands of
    tokens.  Returns (coefficient table, fitted result); the table has estimate, se, z, p and a 95% CI.
    """
    import pandas as pd
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    d = df[(df["status"] == "ok") & (df["condition"] == "documents")] if "status" in df else df
    d = d.dropna(subset=["correct", depth, length])
    if d[cluster].nunique() < 2 or d["correct"].nunique() < 2:
        raise StatsError("the model needs at least two questions and both right and wrong answers.")
    d = pd.DataFrame({"y": d["correct"].astype(float), "depth": d[depth].astype(float) - 0.5,
                      "length_k": d[length].astype(float) / 1000.0, "g": d[cluster].astype(str)})
    formula = "y ~ depth * length_k" + (" + I(depth ** 2) + I(depth ** 2):length_k" if quadratic else "")
    fit = smf.gee(formula, "g", d, family=sm.families.Binomial(), cov_struct=sm.cov_struct.Exchangeable()).fit()
    ci = fit.conf_int()
    table = pd.DataFrame({"estimate": fit.params, "se": fit.bse, "z": fit.tvalues, "p": fit.pvalues,
                          "ci_low": ci[0], "ci_high": ci[1]})
    return table, fit


# ----------------------------------------------------------------------------- power
def questions_needed(penalty: float, sd: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Questions needed to detect a middle penalty with a two-sided paired t-test at `alpha` and `power`.

    `sd` is the standard deviation over questions of the per-question penalty (edges mean minus middle),
    e.g. from a pilot sweep via `penalty_sd`.  Solved exactly on the noncentral t distribution.
    """
    from scipy import stats as st

    if penalty == 0 or sd <= 0:
        raise StatsError("need a non-zero penalty and a positive standard deviation.")
    d = abs(penalty) / sd

    def achieved(n: int) -> float:  # power of the two-sided test with n questions (n - 1 df)
        crit, nc = st.t.ppf(1 - alpha / 2, n - 1), d * math.sqrt(n)
        return float(st.nct.sf(crit, n - 1, nc) + st.nct.cdf(-crit, n - 1, nc))

    n = max(2, math.ceil(((st.norm.ppf(1 - alpha / 2) + st.norm.ppf(power)) / d) ** 2))
    while achieved(n) < power:
        n += 1
    while n > 2 and achieved(n - 1) >= power:
        n -= 1
    return n


def question_penalties(table: PairedTable) -> np.ndarray:
    """Each question's middle penalty (its edge positions' mean minus its middle's)."""
    positions = [c for c in table.conditions if isinstance(c, (int, np.integer))]
    return penalty_from_means(table.values, list(table.conditions), positions)


def penalty_sd(table: PairedTable) -> float:
    """Standard deviation over questions of the per-question middle penalty (for `questions_needed`)."""
    return float(np.std(question_penalties(table), ddof=1))
