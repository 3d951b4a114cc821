"""Statistics for position sweeps: intervals, paired tables, paired t estimates, exact tests, GEE, power.

Every expected number below comes from somewhere other than `litm.stats`: statsmodels or scipy called
directly, a closed form written out here, or a plain-Python loop over the records.
"""
from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st
from statsmodels.stats.contingency_tables import cochrans_q as sm_cochrans_q
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.power import TTestPower
from statsmodels.stats.proportion import proportion_confint

from litm.errors import LitmError, StatsError
from litm.stats import (PairedTable, cochrans_q, difference, edges_and_middle, mcnemar_exact,
                        measures_in, middle_effect, middle_penalty, paired_t, paired_table, paired_tests, penalty_sd,
                        position_length_model, primary_measure, questions_needed, versus_baseline, wilcoxon_signed_rank,
                        wilson_interval)

NORMAL_975 = st.norm.ppf(0.975)


# ------------------------------------------------------------------------ record builders
def record(example_id, condition, position=None, correct=None, gold_loglik=None, status="ok", **extra):
    return {"example_id": example_id, "condition": condition,
            "position": float("nan") if position is None else position, "status": status,
            "correct": correct, "gold_loglik": gold_loglik, **extra}


def sweep_frame(outcomes: dict, seed: int = 0) -> pd.DataFrame:
    """`outcomes` maps a condition key (int position, "closedbook", "oracle") to {example_id: correct};
    rows come out shuffled so that nothing relies on the input order."""
    rows = []
    for key, by_id in outcomes.items():
        for qid, ok in by_id.items():
            if isinstance(key, str):
                rows.append(record(qid, key, correct=ok))
            else:
                rows.append(record(qid, "documents", key, correct=ok))
    df = pd.DataFrame(rows)
    return df.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def worked_example(seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """The issue's example: 176, 144, 112, 138, 170 of 200 right at positions 0, 4, 9, 14, 19."""
    rng = np.random.default_rng(seed)
    ids = [f"q{i:03d}" for i in range(200)]
    outcomes = {}
    for pos, k in zip((0, 4, 9, 14, 19), (176, 144, 112, 138, 170)):
        right = set(rng.choice(200, size=k, replace=False).tolist())
        outcomes[pos] = {qid: i in right for i, qid in enumerate(ids)}
    return sweep_frame(outcomes, seed), outcomes


# ------------------------------------------------------------------------ wilson_interval
@pytest.mark.parametrize("k, n", [(0, 1), (1, 1), (0, 10), (10, 10), (3, 10), (1, 7), (112, 200), (176, 200),
                                  (0, 200), (200, 200), (5, 1000)])
def test_wilson_interval_matches_statsmodels(k, n):
    low, high = wilson_interval(k, n)
    exp_low, exp_high = proportion_confint(k, n, alpha=0.05, method="wilson")
    assert low == pytest.approx(exp_low, abs=1e-12)
    assert high == pytest.approx(exp_high, abs=1e-12)
    assert 0.0 <= low <= high <= 1.0
    assert low - 1e-12 <= k / n <= high + 1e-12


def test_wilson_interval_other_level_matches_statsmodels():
    low, high = wilson_interval(30, 80, z=st.norm.ppf(0.995))
    exp_low, exp_high = proportion_confint(30, 80, alpha=0.01, method="wilson")
    assert (low, high) == pytest.approx((exp_low, exp_high), abs=1e-12)


def test_wilson_interval_of_nothing_is_nan():
    low, high = wilson_interval(0, 0)
    assert math.isnan(low) and math.isnan(high)


# ------------------------------------------------------------------------ paired_table
def small_sweep() -> tuple[pd.DataFrame, dict]:
    ids = ["q3", "q1", "q10", "q2"]
    rng = np.random.default_rng(5)
    # 12 sorts before 4 and 9 as text: positions must be ordered as numbers
    outcomes = {key: {qid: bool(rng.integers(2)) for qid in ids} for key in (9, "oracle", 0, 12, "closedbook", 4)}
    return sweep_frame(outcomes, seed=3), outcomes


def test_paired_table_pivots_sorted_ids_and_ordered_conditions():
    df, outcomes = small_sweep()
    t = paired_table(df)
    assert t.ids == ("q1", "q10", "q2", "q3")  # sorted ids, whatever the input order
    assert t.conditions == (0, 4, 9, 12, "closedbook", "oracle")
    assert t.dropped == 0
    assert t.values.shape == (4, 6)
    for i, qid in enumerate(t.ids):
        for j, key in enumerate(t.conditions):
            assert t.values[i, j] == float(outcomes[key][qid])
    assert t.binary
    assert list(t.column(9)) == [float(outcomes[9][q]) for q in t.ids]


def test_paired_table_keeps_a_requested_condition_order():
    df, outcomes = small_sweep()
    t = paired_table(df, conditions=["oracle", 9, 0])
    assert t.conditions == ("oracle", 9, 0)
    assert [list(r) for r in t.values] == [[float(outcomes[k][q]) for k in ("oracle", 9, 0)] for q in t.ids]


def test_paired_table_drops_a_too_long_question_from_every_condition():
    df, outcomes = small_sweep()
    hit = (df["example_id"] == "q2") & (df["position"] == 4)
    df["correct"] = df["correct"].astype(object)  # as in real records, where too_long rows hold None
    df.loc[hit, "status"] = "too_long"
    df.loc[hit, "correct"] = None
    t = paired_table(df)
    assert t.ids == ("q1", "q10", "q3")
    assert t.dropped == 1
    assert t.values.shape == (3, 6)
    for i, qid in enumerate(t.ids):
        assert list(t.values[i]) == [float(outcomes[k][qid]) for k in t.conditions]


def test_paired_table_ignores_a_score_on_a_too_long_row():
    # A too_long row is unscored even if some value slipped into it.
    df, _ = small_sweep()
    df.loc[(df["example_id"] == "q1") & (df["condition"] == "oracle"), "status"] = "too_long"
    t = paired_table(df)
    assert "q1" not in t.ids and t.dropped == 1


def test_paired_table_rejects_conditions_with_different_questions():
    df, _ = small_sweep()
    df = df[~((df["example_id"] == "q3") & (df["condition"] == "oracle"))]
    with pytest.raises(StatsError, match="do not hold the same questions"):
        paired_table(df)
    # a different question rather than a missing one
    df2, _ = small_sweep()
    df2.loc[(df2["example_id"] == "q3") & (df2["position"] == 0), "example_id"] = "q99"
    with pytest.raises(StatsError, match="do not hold the same questions"):
        paired_table(df2)


def test_paired_table_rejects_an_empty_frame():
    df, _ = small_sweep()
    with pytest.raises(StatsError):
        paired_table(df.iloc[0:0])
    assert issubclass(StatsError, LitmError)


def test_paired_table_rejects_a_condition_that_does_not_exist():
    df, _ = small_sweep()
    with pytest.raises(StatsError):
        paired_table(df, conditions=[0, 99])
    with pytest.raises(StatsError):
        paired_table(df[df["condition"] == "documents"], conditions=[0, "oracle"])


def test_paired_table_all_too_long_is_an_error():
    df, _ = small_sweep()
    df["correct"] = df["correct"].astype(object)
    df.loc[df["position"] == 9, "status"] = "too_long"
    df.loc[df["position"] == 9, "correct"] = None
    with pytest.raises(StatsError):
        paired_table(df)


def test_paired_table_uses_gold_loglik_without_correctness():
    ids = ["a", "b", "c"]
    loglik = {0: [-1.0, -2.5, -0.25], 5: [-3.0, -0.5, -1.75], "closedbook": [-9.0, -8.0, -7.5]}
    rows = []
    for key, vals in loglik.items():
        for qid, v in zip(ids, vals):
            if isinstance(key, str):
                rows.append(record(qid, key, gold_loglik=v))
            else:
                rows.append(record(qid, "documents", key, gold_loglik=v))
    df = pd.DataFrame(rows)
    assert df["correct"].isna().all()
    t = paired_table(df)
    assert t.conditions == (0, 5, "closedbook")
    assert t.values.tolist() == [[loglik[k][i] for k in t.conditions] for i in range(3)]
    assert not t.binary


def test_paired_table_explicit_value_column():
    df, _ = small_sweep()
    df["gold_loglik"] = -np.arange(len(df), dtype=float)
    t = paired_table(df, value="gold_loglik")
    expected = {(r.example_id, r.position if r.condition == "documents" else r.condition): r.gold_loglik
                for r in df.itertuples()}
    for i, qid in enumerate(t.ids):
        for j, key in enumerate(t.conditions):
            assert t.values[i, j] == expected[(qid, float(key) if isinstance(key, int) else key)]


# ------------------------------------------------------------------------ middle penalty, worked example
def test_edges_and_middle_odd_and_even():
    assert edges_and_middle([0, 4, 9, 14, 19]) == ([0, 19], [9])
    assert edges_and_middle([19, 0, 14, 9, 4]) == ([0, 19], [9])
    assert edges_and_middle([0, 3, 6, 9]) == ([0, 9], [3, 6])
    assert edges_and_middle([9, 0, 6, 3]) == ([0, 9], [3, 6])
    assert edges_and_middle([0, 1, 2]) == ([0, 2], [1])


@pytest.mark.parametrize("positions", [[], [0], [0, 9]])
def test_edges_and_middle_needs_three_positions(positions):
    with pytest.raises(StatsError):
        edges_and_middle(positions)


def test_middle_penalty_needs_three_positions():
    df = sweep_frame({0: {"a": True, "b": False, "c": True}, 9: {"a": False, "b": True, "c": True},
                      "closedbook": {"a": False, "b": False, "c": True}})
    with pytest.raises(StatsError):
        middle_penalty(df)


def per_question_penalties(outcomes: dict, first, last, middle: list) -> list[float]:
    ids = sorted(outcomes[first])
    return [(outcomes[first][q] + outcomes[last][q]) / 2 - sum(outcomes[m][q] for m in middle) / len(middle)
            for q in ids]


def test_worked_example_middle_penalty_is_30_5_points():
    df, outcomes = worked_example()
    # counts check the fixture itself
    assert [sum(outcomes[p].values()) for p in (0, 4, 9, 14, 19)] == [176, 144, 112, 138, 170]
    est = middle_penalty(df)
    assert est.value == pytest.approx((176 / 200 + 170 / 200) / 2 - 112 / 200, abs=1e-12)
    assert est.value == pytest.approx(0.305, abs=1e-12)
    assert est.n == 200 and est.level == 0.95 and est.method == "t"
    # the t interval and t-test of the per-question penalties, written out here
    d = per_question_penalties(outcomes, 0, 19, [9])
    assert statistics.fmean(d) == pytest.approx(0.305, abs=1e-12)
    half = st.t.ppf(0.975, 199) * statistics.stdev(d) / math.sqrt(len(d))
    assert est.low == pytest.approx(0.305 - half, abs=1e-12)
    assert est.high == pytest.approx(0.305 + half, abs=1e-12)
    assert est.p_value == pytest.approx(st.ttest_1samp(d, 0).pvalue, rel=1e-10)
    assert est.p_value < 0.001  # 30 points over 200 questions is far from 0


def test_middle_penalty_even_positions_against_a_loop():
    rng = np.random.default_rng(11)
    ids = [f"q{i}" for i in range(60)]
    rates = {0: 0.9, 3: 0.5, 6: 0.6, 9: 0.8}
    outcomes = {p: {q: bool(rng.random() < r) for q in ids} for p, r in rates.items()}
    outcomes["oracle"] = {q: True for q in ids}
    df = sweep_frame(outcomes)
    est = middle_penalty(df)
    d = per_question_penalties(outcomes, 0, 9, [3, 6])
    assert est.value == pytest.approx(statistics.fmean(d), abs=1e-12)
    low, high = st.t.interval(0.95, len(d) - 1, loc=statistics.fmean(d), scale=st.sem(d))
    assert (est.low, est.high) == pytest.approx((low, high), abs=1e-12)
    # and from a PairedTable directly, with the SD the power calculation uses
    t = paired_table(df)
    assert middle_penalty(t) == est
    assert penalty_sd(t) == pytest.approx(statistics.stdev(d), abs=1e-12)


def test_penalty_sd_odd_positions_by_hand():
    df, outcomes = worked_example()
    t = paired_table(df)
    d = per_question_penalties(outcomes, 0, 19, [9])
    assert penalty_sd(t) == pytest.approx(statistics.stdev(d), abs=1e-12)


# ------------------------------------------------------------------------ t estimates / difference
def correlated_pair(n: int, shift: float, seed: int) -> PairedTable:
    """Two strongly correlated continuous scores per question (a shared per-question level), so that an
    interval that forgot the pairing would be far wider."""
    rng = np.random.default_rng(seed)
    level = rng.normal(0, 3.0, n)
    a = level + rng.normal(0, 0.5, n) + shift
    b = level + rng.normal(0, 0.5, n)
    ids = tuple(f"q{i:03d}" for i in range(n))
    return PairedTable(ids, (0, 1), np.column_stack([a, b]))


@pytest.mark.parametrize("n", [4, 6, 150])
def test_difference_is_scipys_paired_t_interval_and_test(n):
    t = correlated_pair(n, 0.15, seed=2)
    a, b = t.column(0), t.column(1)
    est = difference(t, 0, 1)
    ref = st.ttest_rel(a, b)
    low, high = ref.confidence_interval(0.95)
    assert est.value == pytest.approx(float((a - b).mean()), abs=1e-12) and est.n == n
    assert (est.low, est.high) == pytest.approx((low, high), abs=1e-12)
    assert est.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    # an unpaired interval would be ~6x wider here
    unpaired = st.ttest_ind(a, b).confidence_interval(0.95)
    assert est.high - est.low < 0.3 * (unpaired[1] - unpaired[0])


def test_difference_direction_on_reversed_conditions():
    t = correlated_pair(150, 0.15, seed=2)
    fwd, rev = difference(t, 0, 1), difference(t, 1, 0)
    assert rev.value == pytest.approx(-fwd.value, abs=1e-12)
    assert rev.low == pytest.approx(-fwd.high, abs=1e-12)
    assert rev.high == pytest.approx(-fwd.low, abs=1e-12)
    assert rev.p_value == pytest.approx(fwd.p_value, abs=1e-15)


def test_difference_p_value_small_for_a_real_difference():
    t = correlated_pair(150, 0.3, seed=4)
    est = difference(t, 0, 1)
    assert est.p_value < 0.001
    assert est.low > 0


def test_difference_of_identical_columns_is_zero_with_p_one():
    rng = np.random.default_rng(9)
    x = rng.integers(0, 2, 80).astype(float)
    t = PairedTable(tuple(f"q{i}" for i in range(80)), (0, 4, 9), np.column_stack([x, rng.random(80), x]))
    est = difference(t, 0, 9)
    assert est.value == 0.0 and est.low == 0.0 and est.high == 0.0 and est.p_value == 1.0


def test_difference_needs_two_questions():
    t = PairedTable(("q",), (0, 1), np.array([[1.0, 0.0]]))
    with pytest.raises(StatsError):
        difference(t, 0, 1)


def test_contrast_weights_and_the_penalty_as_weights():
    from litm.stats import contrast, penalty_weights

    assert penalty_weights((0, 4, 9, "oracle"), (0, 4, 9)).tolist() == [0.5, -1.0, 0.5, 0.0]
    assert penalty_weights((0, 3, 6, 9), (0, 3, 6, 9)).tolist() == [0.5, -0.5, -0.5, 0.5]
    rng = np.random.default_rng(1)
    v = rng.normal(size=(12, 3))
    t = PairedTable(tuple(f"q{i}" for i in range(12)), (0, 1, 2), v)
    est = contrast(t, [1.0, 0.0, -1.0])
    ref = st.ttest_1samp(v[:, 0] - v[:, 2], 0)
    assert est.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    assert (est.low, est.high) == pytest.approx(tuple(ref.confidence_interval(0.95)), abs=1e-12)
    with pytest.raises(StatsError, match="weights"):
        contrast(t, [1.0, -1.0])


def test_cluster_contrast_is_the_t_interval_of_cluster_contrasts_when_balanced_and_robust_otherwise():
    """Balanced: every cluster has the same rows per placement, so the CR1 interval on G - 1 df equals the t
    interval of each cluster's own penalty.  Unbalanced: the CR1 variance written out here by hand."""
    from litm.stats import cluster_contrast

    rng = np.random.default_rng(4)
    G, P, R = 7, 3, 4  # clusters, placements, rows per placement
    clusters = np.repeat(np.arange(G), P * R)
    place = np.tile(np.repeat(np.arange(P), R), G)
    y = rng.normal(size=G * P * R) + rng.normal(size=G)[clusters] + np.array([1.0, 0.0, 0.7])[place]
    X = np.eye(P)[place]
    c = np.array([0.5, -1.0, 0.5])
    est = cluster_contrast(X, y, clusters, c)
    means = np.array([[y[(clusters == g) & (place == p)].mean() for p in range(P)] for g in range(G)])
    ref = st.ttest_1samp(means @ c, 0)
    assert est.n == G and est.value == pytest.approx(float((means @ c).mean()), abs=1e-12)
    assert (est.low, est.high) == pytest.approx(tuple(ref.confidence_interval(0.95)), abs=1e-10)
    assert est.p_value == pytest.approx(ref.pvalue, rel=1e-8)
    keep = ~((clusters == 0) & (place == 1) & (np.arange(len(y)) % R == 0))  # one row fewer: unbalanced
    Xk, yk, ck = X[keep], y[keep], clusters[keep]
    beta = np.linalg.solve(Xk.T @ Xk, Xk.T @ yk)
    a = c @ np.linalg.inv(Xk.T @ Xk)
    u = [sum(a @ Xk[i] * (yk[i] - Xk[i] @ beta) for i in np.flatnonzero(ck == g)) for g in range(G)]
    se = math.sqrt(G / (G - 1) * sum(x * x for x in u))
    got = cluster_contrast(Xk, yk, ck, c)
    assert got.value == pytest.approx(float(c @ beta), abs=1e-12)
    assert got.high - got.value == pytest.approx(st.t.ppf(0.975, G - 1) * se, rel=1e-10)


def test_equivalence_is_two_one_sided_t_tests():
    from litm.stats import equivalence

    rng = np.random.default_rng(2)
    x = rng.normal(0.05, 0.3, 40)
    res = equivalence(x, 0.5)
    lower = st.ttest_1samp(x, -0.5, alternative="greater").pvalue
    upper = st.ttest_1samp(x, 0.5, alternative="less").pvalue
    assert res.name == "TOST" and res.p_value == pytest.approx(max(lower, upper), rel=1e-10)
    assert res.p_value < 0.05  # the 90% interval lies well inside +-0.5
    assert equivalence(x[:4], 0.05).p_value > 0.05  # four values cannot show an effect below 0.05
    with pytest.raises(StatsError, match="margin"):
        equivalence(x, 0.0)


# ------------------------------------------------------------------------ McNemar
def pairs_from_table(table) -> tuple[np.ndarray, np.ndarray]:
    (n11, n10), (n01, n00) = table
    a = [1] * n11 + [1] * n10 + [0] * n01 + [0] * n00
    b = [1] * n11 + [0] * n10 + [1] * n01 + [0] * n00
    perm = np.random.default_rng(sum(map(sum, table))).permutation(len(a))
    return np.array(a)[perm], np.array(b)[perm]


@pytest.mark.parametrize("table", [
    [[50, 12], [3, 35]],
    [[10, 2], [9, 5]],
    [[0, 7], [0, 0]],
    [[40, 20], [20, 20]],
    [[5, 1], [0, 4]],
    [[100, 31], [17, 52]],
    [[30, 0], [0, 10]],  # no discordant pairs
])
def test_mcnemar_exact_matches_statsmodels(table):
    a, b = pairs_from_table(table)
    res = mcnemar_exact(a, b)
    ref = sm_mcnemar(np.array(table), exact=True)
    assert res.p_value == pytest.approx(float(ref.pvalue), abs=1e-12)
    assert res.statistic == float(ref.statistic)
    assert res.detail == {"only_first": table[0][1], "only_second": table[1][0]}


def test_mcnemar_exact_no_discordant_pairs_is_p_one():
    a = np.array([1, 0, 1, 1, 0])
    assert mcnemar_exact(a, a.copy()).p_value == 1.0


def test_mcnemar_exact_accepts_booleans():
    a, b = pairs_from_table([[10, 2], [9, 5]])
    assert mcnemar_exact(a.astype(bool), b.astype(bool)) == mcnemar_exact(a, b)


def test_mcnemar_exact_rejects_continuous_scores():
    with pytest.raises(StatsError, match="0/1"):
        mcnemar_exact([1.0, 0.0, 0.5], [1.0, 1.0, 0.0])
    with pytest.raises(StatsError):
        mcnemar_exact([1.0, 0.0, 1.0], [-1.2, -0.3, -2.0])


def test_mcnemar_exact_rejects_unequal_lengths():
    with pytest.raises(StatsError):
        mcnemar_exact([1, 0, 1, 1], [1, 0, 1])


# ------------------------------------------------------------------------ Cochran's Q
@pytest.mark.parametrize("seed, n, rates", [
    (0, 50, [0.8, 0.6, 0.5, 0.7, 0.85]),
    (1, 200, [0.88, 0.72, 0.56, 0.69, 0.85]),
    (2, 30, [0.5, 0.5, 0.5]),
    (3, 80, [0.3, 0.6]),
    (4, 120, [0.7] * 10),
])
def test_cochrans_q_matches_statsmodels(seed, n, rates):
    rng = np.random.default_rng(seed)
    x = (rng.random((n, len(rates))) < np.array(rates)).astype(int)
    res = cochrans_q(x)
    ref = sm_cochrans_q(x, return_object=True)
    assert res.statistic == pytest.approx(float(ref.statistic), rel=1e-10, abs=1e-12)
    assert res.p_value == pytest.approx(float(ref.pvalue), rel=1e-10, abs=1e-14)
    assert res.detail["df"] == ref.df == len(rates) - 1
    assert res.detail["n"] == n


def test_cochrans_q_on_a_paired_table():
    df, outcomes = worked_example()
    t = paired_table(df)
    res = cochrans_q(t.values)
    ref = sm_cochrans_q(t.values.astype(int), return_object=True)
    assert res.statistic == pytest.approx(float(ref.statistic), rel=1e-10)
    assert res.p_value < 1e-6


def test_cochrans_q_rejects_continuous_scores():
    with pytest.raises(StatsError):
        cochrans_q(np.array([[1.0, 0.0], [0.3, 1.0]]))


# ------------------------------------------------------------------------ position x length model
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
LENGTHS = (1000, 2500, 4000, 6000)


def simulate_sweep(n_questions: int, beta: dict, seed: int) -> pd.DataFrame:
    """Correctness from a logistic model in centred depth and length in thousands of tokens, with a
    random intercept per question (so rows of one question are correlated), plus closedbook, oracle
    and too_long rows that the model must leave out."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_questions):
        qid = f"q{i:04d}"
        u = rng.normal(0, 0.8)
        for j, depth in enumerate(DEPTHS):
            for length in LENGTHS:
                dc, lk = depth - 0.5, length / 1000
                eta = (beta["b0"] + u + beta["depth"] * dc + beta["length"] * lk + beta["inter"] * dc * lk
                       + beta["depth2"] * dc * dc)
                ok = bool(rng.random() < 1 / (1 + math.exp(-eta)))
                rows.append(record(qid, "documents", j, correct=ok, prompt_tokens=length + int(rng.integers(50)),
                                   gold_rel_depth=depth))
        rows.append(record(qid, "closedbook", correct=bool(rng.random() < 0.1), prompt_tokens=30,
                           gold_rel_depth=None))
        # the oracle prompt has a depth and a length too, but is no point of the position sweep
        rows.append(record(qid, "oracle", correct=bool(rng.random() < 0.95), prompt_tokens=250,
                           gold_rel_depth=0.4))
        rows.append(record(qid, "documents", 99, correct=None, status="too_long", prompt_tokens=99_000,
                           gold_rel_depth=0.5))
    return pd.DataFrame(rows)


def direct_gee(df: pd.DataFrame, quadratic: bool):
    """The same model fitted straight with statsmodels, the design columns built by hand."""
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    d = df[(df["condition"] == "documents") & (df["status"] == "ok")]
    d = pd.DataFrame({"y": d["correct"].astype(float), "dc": d["gold_rel_depth"].astype(float) - 0.5,
                      "lk": d["prompt_tokens"].astype(float) / 1000, "g": d["example_id"].astype(str)})
    d["dc2"] = d["dc"] ** 2
    d["dc_lk"] = d["dc"] * d["lk"]
    d["dc2_lk"] = d["dc2"] * d["lk"]
    formula = "y ~ dc + lk + dc_lk" + (" + dc2 + dc2_lk" if quadratic else "")
    fit = smf.gee(formula, "g", d, family=sm.families.Binomial(), cov_struct=sm.cov_struct.Exchangeable()).fit()
    names = {"Intercept": "Intercept", "dc": "depth", "lk": "length_k", "dc_lk": "depth:length_k",
             "dc2": "I(depth ** 2)", "dc2_lk": "I(depth ** 2):length_k"}
    return fit, names


STRONG = {"b0": 1.0, "depth": 0.3, "length": -0.15, "inter": -0.8, "depth2": 3.0}
NONE = {"b0": 1.0, "depth": 0.3, "length": -0.15, "inter": 0.0, "depth2": 3.0}


@pytest.fixture(scope="module")
def strong_sweep():
    return simulate_sweep(250, STRONG, seed=0)


@pytest.mark.parametrize("quadratic", [True, False])
def test_position_length_model_matches_statsmodels_gee(strong_sweep, quadratic):
    table, fit = position_length_model(strong_sweep, quadratic=quadratic)
    ref, names = direct_gee(strong_sweep, quadratic)
    assert fit.nobs == ref.nobs == 250 * len(DEPTHS) * len(LENGTHS)
    assert len(table) == len(ref.params)
    ci = ref.conf_int()
    for ref_name, name in names.items():
        if ref_name not in ref.params:
            continue
        row = table.loc[name]
        assert row["estimate"] == pytest.approx(ref.params[ref_name], rel=1e-6, abs=1e-8)
        assert row["se"] == pytest.approx(ref.bse[ref_name], rel=1e-6)
        assert row["p"] == pytest.approx(ref.pvalues[ref_name], rel=1e-5, abs=1e-12)
        assert row["ci_low"] == pytest.approx(ci.loc[ref_name, 0], rel=1e-6, abs=1e-8)
        assert row["ci_high"] == pytest.approx(ci.loc[ref_name, 1], rel=1e-6, abs=1e-8)
        assert row["z"] == pytest.approx(row["estimate"] / row["se"], rel=1e-9)


def test_position_length_model_finds_a_strong_interaction(strong_sweep):
    table, _ = position_length_model(strong_sweep)
    row = table.loc["depth:length_k"]
    assert row["ci_high"] < 0  # excludes 0, with the simulated (negative) sign
    assert row["ci_low"] < STRONG["inter"] < row["ci_high"] or abs(row["estimate"] - STRONG["inter"]) < 0.3
    assert row["p"] < 1e-6
    # the U-shape: the square of depth is strongly positive
    assert table.loc["I(depth ** 2)", "ci_low"] > 0


def test_position_length_model_no_interaction():
    p_values = []
    for seed in (1, 2, 3):
        table, _ = position_length_model(simulate_sweep(150, NONE, seed=seed), quadratic=False)
        row = table.loc["depth:length_k"]
        p_values.append(row["p"])
        assert abs(row["estimate"]) < 0.25
    assert sum(p > 0.01 for p in p_values) >= 2


def test_position_length_model_needs_questions():
    df = simulate_sweep(1, STRONG, seed=0)
    with pytest.raises(StatsError):
        position_length_model(df)
    df = simulate_sweep(5, STRONG, seed=0)
    df.loc[df["condition"] == "documents", "correct"] = True
    df.loc[df["status"] == "too_long", "correct"] = None
    with pytest.raises(StatsError):  # every answer right: nothing to model
        position_length_model(df)


# ------------------------------------------------------------------------ power
@pytest.mark.parametrize("penalty, sd, alpha, power", [
    (0.305, 0.6, 0.05, 0.8),
    (0.1, 0.5, 0.05, 0.8),
    (0.05, 0.3, 0.01, 0.9),
    (-0.2, 0.5, 0.05, 0.8),
    (0.02, 0.4, 0.05, 0.95),
    (1.5, 1.0, 0.05, 0.8),  # a big effect: a handful of questions
])
def test_questions_needed_matches_statsmodels(penalty, sd, alpha, power):
    n = questions_needed(penalty, sd, alpha=alpha, power=power)
    effect = abs(penalty) / sd
    solved = TTestPower().solve_power(effect_size=effect, alpha=alpha, power=power, alternative="two-sided")
    assert abs(n - math.ceil(solved)) <= 1
    # and it is the smallest n that reaches the power, by statsmodels' own power function
    assert TTestPower().power(effect, n, alpha, alternative="two-sided") >= power - 1e-9
    assert TTestPower().power(effect, n - 1, alpha, alternative="two-sided") < power


def test_questions_needed_grows_like_the_normal_approximation():
    # n ~ ((z_a/2 + z_b) sd / penalty)^2 for small effects
    n = questions_needed(0.01, 0.5)
    approx = ((NORMAL_975 + st.norm.ppf(0.8)) * 0.5 / 0.01) ** 2
    assert approx < n < approx + 5


@pytest.mark.parametrize("penalty, sd", [(0.0, 0.5), (0.1, 0.0), (0.1, -1.0)])
def test_questions_needed_rejects_no_effect(penalty, sd):
    with pytest.raises(StatsError):
        questions_needed(penalty, sd)


def test_proportion_interval_is_the_share_with_its_wilson_interval():
    from litm.stats import proportion_interval, wilson_interval

    assert proportion_interval([True, False, True, True]) == (0.75, *wilson_interval(3, 4))
    p, lo, hi = proportion_interval([])
    assert p != p and lo != lo and hi != hi  # nan for no values


# ------------------------------------------------------------------------ measures and paired tests
def test_paired_t_matches_scipy_ttest_rel():
    rng = np.random.default_rng(5)
    a = rng.normal(0.3, 1.0, 25)
    b = a - rng.normal(0.4, 0.8, 25)
    ours, ref = paired_t(a, b), st.ttest_rel(a, b)
    assert ours.statistic == pytest.approx(ref.statistic, rel=1e-12)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-10) and ours.detail["df"] == 24


def exact_signed_rank_p(d: np.ndarray) -> float:
    """Two-sided exact p of the signed-rank statistic min(W+, W-) by enumerating every sign pattern (no ties)."""
    ranks = st.rankdata(np.abs(d))
    w_plus = ranks[d > 0].sum()
    observed = min(w_plus, ranks.sum() - w_plus)
    hits = 0
    for signs in range(2 ** len(d)):
        wp = sum(r for j, r in enumerate(ranks) if signs >> j & 1)
        hits += min(wp, ranks.sum() - wp) <= observed + 1e-9
    return hits / 2 ** len(d)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wilcoxon_signed_rank_matches_an_enumeration_of_every_sign(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(0.5, 1.0, 12)
    b = rng.normal(0.0, 1.0, 12)
    res = wilcoxon_signed_rank(a, b)
    assert res.p_value == pytest.approx(exact_signed_rank_p(a - b), abs=1e-12)
    assert res.detail["nonzero"] == 12


def test_wilcoxon_drops_zero_differences_and_says_one_when_all_are_zero():
    a = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    b = a - np.array([0, 0, 1.5, -0.25, 2.5, 3.5, 4.5, 5.75])
    assert wilcoxon_signed_rank(a, b).p_value == pytest.approx(exact_signed_rank_p(np.array([1.5, -0.25, 2.5, 3.5,
                                                                                            4.5, 5.75])), abs=1e-12)
    assert wilcoxon_signed_rank(a, a).p_value == 1.0


def test_paired_tests_use_mcnemar_for_right_wrong_and_t_and_wilcoxon_otherwise():
    a, b = np.array([1, 1, 1, 0, 1, 1.0]), np.array([1, 0, 0, 0, 1, 0.0])
    (mc,) = paired_tests(a, b, binary=True)
    assert mc.name == "McNemar exact" and mc.p_value == pytest.approx(0.25)  # 3 discordant, all one way: 2 / 8
    assert [t.name for t in paired_tests(a + 0.1, b, binary=False)] == ["paired t", "Wilcoxon signed-rank"]
    with pytest.raises(StatsError, match="two pairs"):
        paired_t([1.0], [0.0])


def continuous_sweep(n: int = 30, seed: int = 0) -> pd.DataFrame:
    """Records with all three measures at positions 0, 4, 9: margins dip in the middle."""
    rng = np.random.default_rng(seed)
    level = rng.normal(0, 2.0, n)
    rows = []
    for pos, shift in ((0, 1.0), (4, -0.5), (9, 0.8)):
        margin = level + shift + rng.normal(0, 1.0, n)
        for i in range(n):
            rows.append(record(f"q{i}", "documents", pos, correct=bool(margin[i] > 0),
                               gold_loglik=-5 + margin[i] / 2, gold_margin=margin[i], scoring="choice"))
    return pd.DataFrame(rows)


def test_middle_effect_on_a_continuous_measure_tests_each_questions_edges_against_its_middle():
    df = continuous_sweep()
    table = paired_table(df, "gold_margin")
    eff = middle_effect(table, "margin")
    wide = df.pivot(index="example_id", columns="position", values="gold_margin")
    edges, middle = (wide[0] + wide[9]) / 2, wide[4]
    assert eff.estimate.value == pytest.approx(float((edges - middle).mean()), abs=1e-12)
    assert eff.estimate.n == 30
    t, w = eff.tests
    assert t.p_value == pytest.approx(st.ttest_rel(edges, middle).pvalue, rel=1e-10)
    assert w.p_value == pytest.approx(st.wilcoxon(edges - middle).pvalue, rel=1e-10)
    low, high = st.ttest_rel(edges, middle).confidence_interval(0.95)
    assert (eff.estimate.low, eff.estimate.high) == pytest.approx((low, high), abs=1e-12)


def test_middle_effect_on_right_wrong_tests_the_penalty_it_estimates():
    """The sign test counts the questions whose own penalty (edges averaged, minus the middle) is above and
    below 0: the estimand the interval is about, not the first position against the middle."""
    df, outcomes = worked_example()
    eff = middle_effect(paired_table(df), "accuracy")
    q, sign = eff.tests
    d = np.array(per_question_penalties(outcomes, 0, 19, [9]))
    ref = st.binomtest(int(min((d > 0).sum(), (d < 0).sum())), int((d != 0).sum()), 0.5).pvalue
    assert q.name == "Cochran's Q" and sign.name == "sign test"
    assert sign.p_value == pytest.approx(ref, rel=1e-12)
    assert sign.detail == {"above": int((d > 0).sum()), "below": int((d < 0).sum())}
    # one edge against one middle: the sign test is McNemar's exact test
    a, b = np.array([1, 1, 0, 1, 0, 1, 1.0]), np.array([0, 1, 0, 0, 0, 1, 0.0])
    from litm.stats import sign_test
    assert sign_test(a - b).p_value == pytest.approx(mcnemar_exact(a, b).p_value, abs=1e-15)


def test_measures_held_and_the_primary_one():
    df = continuous_sweep()
    assert [m.name for m in measures_in(df)] == ["accuracy", "loglik", "margin"]
    assert primary_measure(df).name == "accuracy" and primary_measure(df, "margin").column == "gold_margin"
    old = df.drop(columns="gold_margin")  # records written before the margin was stored
    with pytest.raises(StatsError, match="rerun into a new results folder"):
        primary_measure(old, "margin")
    with pytest.raises(StatsError, match="unknown measure"):
        primary_measure(df, "rank")
    loglik_only = df.assign(correct=None, gold_margin=None)
    assert [m.name for m in measures_in(loglik_only)] == ["loglik"]


def test_versus_baseline_averages_a_questions_records_and_pairs_over_questions():
    rng = np.random.default_rng(3)
    rows = []
    for i in range(20):
        level = rng.normal()
        for arm, shift in (("base", 0.0), ("better", 0.7)):
            for pos in (0, 1):  # two records per question and arm: averaged before pairing
                rows.append({"example_id": f"q{i}", "arm": arm, "status": "ok", "correct": None,
                             "gold_loglik": level + shift + rng.normal(0, 0.5)})
    rows.append({"example_id": "q20", "arm": "better", "status": "too_long", "correct": None, "gold_loglik": None})
    df = pd.DataFrame(rows)
    out = versus_baseline(df, "base", condition="arm")
    (row,) = out.to_dict("records")
    means = df[df.status == "ok"].groupby(["example_id", "arm"])["gold_loglik"].mean().unstack()
    d = (means["better"] - means["base"]).to_numpy()
    assert row["measure"] == "loglik" and row["n"] == 20 and row["diff"] == pytest.approx(d.mean(), abs=1e-12)
    assert row["t_p"] == pytest.approx(st.ttest_rel(means["better"], means["base"]).pvalue, rel=1e-10)
    assert row["wilcoxon_p"] == pytest.approx(st.wilcoxon(d).pvalue, rel=1e-10)
    low, high = st.ttest_1samp(d, 0).confidence_interval(0.95)
    assert (row["diff_low"], row["diff_high"]) == pytest.approx((low, high), abs=1e-12)
    with pytest.raises(StatsError, match="baseline"):
        versus_baseline(df, "nope", condition="arm")
