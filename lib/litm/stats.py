"""Honest statistics for position experiments: intervals, paired estimates and tests, models, power.

Every condition of a position sweep uses the same questions, so comparisons between conditions are
paired: every effect (a middle penalty, a difference from a baseline, a change in penalty) is the mean of
one value per question with a t interval over questions (`t_estimate`; it covers at small n, where the
percentile bootstrap does not), the sign test, McNemar and Cochran's Q use per-question agreement, and the
logistic model clusters by question.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

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
    """Mean with a Student-t interval (`t_estimate`); the interval is nan for fewer than two values."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return (float(x.mean()) if x.size else float("nan")), float("nan"), float("nan")
    e = t_estimate(x, level)
    return e.value, e.low, e.high


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


# ----------------------------------------------------------------------------- paired estimates
@dataclass(frozen=True)
class Estimate:
    """A paired estimate over units (questions, cases): its value, the t interval and the t-test's two-sided
    p-value against 0, on the n units' own values (`t_estimate`)."""

    value: float
    low: float
    high: float
    p_value: float
    n: int
    level: float = 0.95
    method: str = "t"


def t_estimate(values, level: float = 0.95) -> Estimate:
    """The mean of one value per unit (e.g. each question's middle penalty, or its difference between two
    conditions) with a Student-t interval on n - 1 degrees of freedom and the one-sample t-test against 0.

    Every paired effect the reports print is such a mean, so this is their one interval.  It covers at its
    nominal level at any n for normal values and within [93%, 97%] for moderately skewed ones (skewness up to
    about 0.7) from n = 4 (`tests/test_coverage.py`); the percentile bootstrap it replaces covered 85% at
    n = 6.  All units equal gives a zero-width interval and p = 1 (at 0) or 0."""
    from scipy.stats import t as t_dist

    x = np.asarray(values, dtype=float).ravel()
    if x.size < 2:
        raise StatsError(f"an interval needs at least two units, got {x.size}.")
    m, sd = float(x.mean()), float(x.std(ddof=1))
    if sd == 0:
        return Estimate(m, m, m, 1.0 if m == 0 else 0.0, x.size, level)
    se = sd / math.sqrt(x.size)
    half = float(t_dist.ppf(0.5 + level / 2, x.size - 1)) * se
    return Estimate(m, m - half, m + half, float(2 * t_dist.sf(abs(m) / se, x.size - 1)), x.size, level)


def contrast(table: PairedTable, weights, level: float = 0.95) -> Estimate:
    """A linear contrast of the condition means (one weight per condition), as the mean over units of each
    unit's own contrast, with its t interval (`t_estimate`)."""
    w = np.asarray(weights, dtype=float)
    if w.shape != (len(table.conditions),):
        raise StatsError(f"{w.size} weights for {len(table.conditions)} conditions.")
    return t_estimate(table.values @ w, level)


def penalty_weights(conditions: Sequence, positions: Sequence[int]) -> np.ndarray:
    """The middle penalty as weights over `conditions`: +1/2 on each edge position, -1 shared by the middle."""
    edges, middle = edges_and_middle(positions)
    w = np.zeros(len(conditions))
    for p in edges:
        w[list(conditions).index(p)] += 1 / len(edges)
    for p in middle:
        w[list(conditions).index(p)] -= 1 / len(middle)
    return w


def cluster_contrast(X, y, clusters, c, level: float = 0.95) -> Estimate:
    """A contrast `c` of a least-squares fit of y on X whose rows come in clusters (e.g. a case's prompts):
    the estimate with a cluster-robust (CR1) standard error and a t interval on G - 1 degrees of freedom for
    G clusters.  With every cluster sharing one balanced design this is exactly `t_estimate` of each
    cluster's own contrast."""
    from scipy.stats import t as t_dist

    X, y, c = np.asarray(X, dtype=float), np.asarray(y, dtype=float), np.asarray(c, dtype=float)
    clusters = np.asarray(clusters)
    ids = list(dict.fromkeys(clusters.tolist()))
    g = len(ids)
    if g < 2:
        raise StatsError(f"a cluster-robust interval needs at least two clusters, got {g}.")
    bread = np.linalg.pinv(X.T @ X)
    beta = bread @ X.T @ y
    a = c @ bread  # the contrast's weights on X'y
    resid = y - X @ beta
    scores = np.array([a @ X[clusters == k].T @ resid[clusters == k] for k in ids])
    value = float(c @ beta)
    se = math.sqrt(g / (g - 1) * float(scores @ scores))
    if se == 0:
        return Estimate(value, value, value, 1.0 if value == 0 else 0.0, g, level, "cluster t")
    half = float(t_dist.ppf(0.5 + level / 2, g - 1)) * se
    return Estimate(value, value - half, value + half, float(2 * t_dist.sf(abs(value) / se, g - 1)), g, level,
                    "cluster t")


def equivalence(values, margin: float, alpha: float = 0.05) -> "TestResult":
    """Two one-sided t-tests (TOST) that the mean of `values` lies within (-margin, +margin): p below alpha
    says the effect is smaller than the margin (the 1 - 2 alpha t interval lies inside it), a null result
    that is narrow enough to be informative, not only underpowered."""
    from scipy.stats import t as t_dist

    x = np.asarray(values, dtype=float).ravel()
    if x.size < 2:
        raise StatsError(f"an equivalence test needs at least two units, got {x.size}.")
    if not margin > 0:
        raise StatsError(f"the equivalence margin must be above 0, not {margin}.")
    m, se = float(x.mean()), float(x.std(ddof=1)) / math.sqrt(x.size)
    if se == 0:
        p = 0.0 if abs(m) < margin else 1.0
    else:
        p = float(max(t_dist.sf((m + margin) / se, x.size - 1), t_dist.cdf((m - margin) / se, x.size - 1)))
    return TestResult("TOST", m, p, {"margin": margin, "n": x.size})


def t_se(estimate: Estimate) -> float:
    """The standard error behind a `t_estimate`'s interval (its half-width over t at its level, n - 1 df)."""
    from scipy.stats import t as t_dist

    return (estimate.high - estimate.low) / (2 * float(t_dist.ppf(0.5 + estimate.level / 2, estimate.n - 1)))


def equivalence_bound(estimate: Estimate, alpha: float = 0.05) -> float:
    """How large an effect a `t_estimate` rules out: the smallest margin two one-sided t-tests at `alpha` would
    call it within (the end of its 1 - 2 alpha interval farthest from 0).  A null is informative when this is
    below the smallest effect of interest."""
    from scipy.stats import t as t_dist

    return abs(estimate.value) + float(t_dist.ppf(1 - alpha, estimate.n - 1)) * t_se(estimate)


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
    return np.asarray(means) @ penalty_weights(conditions, positions)


def middle_penalty(df_or_table, level: float = 0.95) -> Estimate:
    """The first and last positions averaged, minus the middle, on each question, with its t interval."""
    t = df_or_table if isinstance(df_or_table, PairedTable) else paired_table(df_or_table)
    positions = [c for c in t.conditions if isinstance(c, (int, np.integer))]
    return contrast(t, penalty_weights(t.conditions, positions), level)


def difference(table: PairedTable, a, b, level: float = 0.95) -> Estimate:
    """Mean of condition `a` minus mean of condition `b`, paired over questions, with its t interval."""
    return t_estimate(table.column(a) - table.column(b), level)


@dataclass(frozen=True)
class Effect:
    """One measure's paired comparison: the estimate with its t interval over questions, and tests."""

    measure: Measure
    estimate: Estimate
    tests: list


def middle_effect(table: PairedTable, m: str | Measure) -> Effect:
    """The middle penalty on a measure's table (each question's edge mean minus its middle), with tests of
    that same estimand: for right/wrong outcomes Cochran's Q over the positions and the exact sign test of
    the questions' penalties (McNemar's test when there is one edge and one middle); for continuous ones the
    paired t and Wilcoxon tests of each question's edge mean against its middle mean."""
    m = measure(m)
    positions = [c for c in table.conditions if isinstance(c, (int, np.integer))]
    edges, middle = edges_and_middle(positions)
    col = table.conditions.index
    if m.binary:
        tests = [cochrans_q(table.values[:, [col(p) for p in positions]]), sign_test(question_penalties(table))]
    else:
        tests = paired_tests(table.values[:, [col(p) for p in edges]].mean(1),
                             table.values[:, [col(p) for p in middle]].mean(1), False)
    return Effect(m, middle_penalty(table), tests)


def unit_means(df, column: str, conditions, condition: str = "condition", unit: str = "example_id"):
    """Units x conditions: each unit's mean of a record field under each condition (scored records only),
    units without a value under every condition left out."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    wide = ok.pivot_table(index=unit, columns=condition, values=column, aggfunc="mean")
    return wide.reindex(columns=list(conditions)).astype(float).dropna()


_P_COLUMN = {"McNemar exact": "mcnemar_p", "paired t": "t_p", "Wilcoxon signed-rank": "wilcoxon_p"}


def versus_baseline(df, baseline, measures=None, condition: str = "condition", unit: str = "example_id"):
    """Each condition minus `baseline`, per measure (default: every one the records hold), paired over
    units: one row per condition and measure with the difference, its t 95% interval, the t-test's p-value
    and the other paired tests (McNemar for right/wrong values, else Wilcoxon).  A unit's records under one
    condition are averaged first (e.g. its gold positions), so each unit counts once.  Units without a value
    under every condition (too long, not scored) are left out."""
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
            est = difference(table, c, baseline)
            tests = paired_tests(table.column(c), table.column(baseline), table.binary)
            rows.append({condition: c, "measure": m.name, "n": est.n, "diff": est.value, "diff_low": est.low,
                         "diff_high": est.high, "t_p": est.p_value,
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


def sign_test(values) -> TestResult:
    """Exact two-sided sign test of values against 0, zeros dropped (for paired right/wrong outcomes of two
    conditions, McNemar's exact test)."""
    from scipy.stats import binomtest

    x = np.asarray(values, dtype=float)
    above, below = int((x > 0).sum()), int((x < 0).sum())
    n = above + below
    p = 1.0 if n == 0 else float(binomtest(min(above, below), n, 0.5).pvalue)
    return TestResult("sign test", float(min(above, below)), p, {"above": above, "below": below})


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
