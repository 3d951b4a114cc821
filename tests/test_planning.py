"""Sizing a study by power from a pilot: the numbers come from statsmodels' power solver and a chi-square
quantile computed here, not from `litm.stats`."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chi2
from statsmodels.stats.power import TTestPower

from litm import planning
from litm.errors import ConfigError, StatsError


def pilot_records(penalties, seconds: float = 0.5) -> pd.DataFrame:
    """A sweep pilot whose question i has middle penalty penalties[i] on the margin (edges 0 and 9, middle 4)."""
    rows = []
    for i, p in enumerate(penalties):
        for pos, v in ((0, p), (4, 0.0), (9, p)):
            rows.append({"example_id": f"q{i}", "condition": "documents", "position": pos, "status": "ok",
                         "correct": v > 0, "gold_loglik": v - 3, "gold_margin": v, "latency_s": seconds})
    return pd.DataFrame(rows)


def solve(effect: float, sd: float) -> int:
    return math.ceil(TTestPower().solve_power(effect_size=abs(effect) / sd, alpha=0.05, power=0.8,
                                              alternative="two-sided"))


def test_the_plan_takes_the_questions_a_paired_t_test_needs_on_the_upper_limit_of_the_pilots_sd():
    x = np.array([2.0, 0.5, 1.5, 3.0, -0.5, 1.0, 2.5, 0.0, 1.5, 2.0, 1.0, 0.5])
    p = planning.plan(pilot_records(x), lambda d: planning.middle_penalties(d, "margin"), "margin", most=500)
    upper = x.std(ddof=1) * math.sqrt(11 / chi2.ppf(0.2, 11))
    assert p.effect == pytest.approx(x.mean()) and p.sd == pytest.approx(x.std(ddof=1))
    assert p.sd_planned == pytest.approx(upper)
    assert abs(p.needed - solve(x.mean(), upper)) <= 1  # statsmodels' solver is approximate at the boundary
    assert p.limit == max(10, p.needed) and p.pilot_n == 12
    assert p.seconds_per_question == pytest.approx(1.5)  # three prompts of 0.5 s each
    assert f"the study runs {p.limit}" in p.text


def test_a_plan_tells_a_runner_that_asks_how_many_records_and_seconds_the_run_will_take(monkeypatch, tmp_path):
    x = np.array([2.0, 0.5, 1.5, 3.0, -0.5, 1.0, 2.5, 0.0, 1.5, 2.0, 1.0, 0.5])
    pilot = pilot_records(x, seconds=2.0)  # 12 questions x 3 prompts of 2 s
    told = tmp_path / "plan.json"
    monkeypatch.delenv(planning.PLAN_FILE, raising=False)
    planning.plan(pilot, lambda d: planning.middle_penalties(d, "margin"), "margin", most=500)
    assert not told.exists()  # nobody asked
    monkeypatch.setenv(planning.PLAN_FILE, str(told))
    p = planning.plan(pilot, lambda d: planning.middle_penalties(d, "margin"), "margin", most=500)
    assert json.loads(told.read_text()) == pytest.approx({"records": 36 + 3 * p.limit, "seconds": 72 + 6 * p.limit})
    # a study scoring more conditions than its pilot: its records per question as given
    p = planning.plan(pilot, lambda d: planning.middle_penalties(d, "margin"), "margin", most=500,
                      records_per_question=5)
    assert json.loads(told.read_text()) == pytest.approx({"records": 36 + 5 * p.limit, "seconds": 72 + 10 * p.limit})
    monkeypatch.setenv(planning.PLAN_FILE, str(tmp_path / "no-such-folder" / "plan.json"))  # cosmetic: no error
    assert planning.plan(pilot, lambda d: planning.middle_penalties(d, "margin"), "margin", most=500).limit == p.limit


def test_a_plan_beyond_the_budget_says_how_many_and_how_long():
    x = np.array([0.3, -0.8, 0.9, -0.4, 0.6, -0.2, 0.7, -0.5, 0.1, 0.4])
    p = planning.plan(pilot_records(x, seconds=20.0), lambda d: planning.middle_penalties(d, "margin"), "margin",
                      most=40)
    assert p.needed > 40 and p.limit == 40
    assert f"run LIMIT = {p.needed}" in p.text and "underpowered" in p.text
    assert f"about {p.needed * 60 / 60:.0f} min" in p.text


def test_a_pilot_without_an_effect_runs_the_budget_and_a_tiny_pilot_is_refused():
    flat = planning.plan(pilot_records([1.0, -1.0, 0.5, -0.5]), lambda d: planning.middle_penalties(d, "margin"),
                         "margin", most=30)
    assert flat.needed is None and flat.limit == 30 and "No effect to plan for" in flat.text
    with pytest.raises(StatsError, match="at least 3"):
        planning.plan(pilot_records([1.0, 2.0]), lambda d: planning.middle_penalties(d, "margin"), "margin", most=30)


def test_differences_pair_a_condition_with_the_baseline_question_by_question():
    df = pd.DataFrame([{"example_id": f"q{i}", "condition": c, "status": "ok", "gold_margin": v}
                       for i in range(4) for c, v in (("base", i), ("new", 2 * i + 1))])
    assert list(planning.differences(df, "new", "base", "margin")) == [1, 2, 3, 4]
    with pytest.raises(StatsError, match="no records under"):
        planning.differences(df, "other", "base", "margin")


def test_the_plan_takes_the_smaller_of_the_pilots_effect_and_the_smallest_effect_of_interest():
    x = np.array([2.0, 0.5, 1.5, 3.0, -0.5, 1.0, 2.5, 0.0, 1.5, 2.0, 1.0, 0.5])  # mean 1.25
    fn = lambda d: planning.middle_penalties(d, "margin")
    upper = x.std(ddof=1) * math.sqrt(11 / chi2.ppf(0.2, 11))
    capped = planning.plan(pilot_records(x), fn, "margin", most=10_000, smallest=0.5)
    assert capped.planned == 0.5 and abs(capped.needed - solve(0.5, upper)) <= 1
    assert "smallest effect of interest is 0.50 nats" in capped.text and "planned for the smaller" in capped.text
    small = planning.plan(pilot_records(x / 10), fn, "margin", most=10_000, smallest=0.5)  # the pilot's 0.125 wins
    assert small.planned == pytest.approx(0.125) and abs(small.needed - solve(0.125, upper / 10)) <= 1
    with pytest.raises(StatsError, match="above 0"):
        planning.plan(pilot_records(x), fn, "margin", most=10, smallest=0.0)


def test_the_time_per_question_counts_every_condition_of_the_study():
    x = np.array([1.0, 0.5, 1.5, 2.0])
    p = planning.plan(pilot_records(x, seconds=2.0), lambda d: planning.middle_penalties(d, "margin"), "margin",
                      most=8, records_per_question=18, held_out="generated with seed 1")
    assert p.seconds_per_question == pytest.approx(36.0)  # 2 s a record, 18 records a study question
    assert "(generated with seed 1)" in p.text


@pytest.mark.parametrize("values, says", [
    ([1.0, 1.2, 0.8, 1.1, 0.9, 1.0], "the interval excludes 0"),
    ([0.02, -0.03, 0.01, 0.0, -0.01, 0.02, 0.01, -0.02], "no effect as large as +-0.50 nats"),
    ([2.0, -1.5, 0.5, -2.5, 1.0], "cannot tell an effect of that size from none"),
])
def test_the_conclusion_reads_the_interval_against_the_smallest_effect(values, says):
    from scipy import stats as st

    text = planning.conclusion(values, "margin", 0.5, "the change")
    low, high = st.ttest_1samp(values, 0).confidence_interval(0.95)
    assert says in text and f"[{low:+.2f}, {high:+.2f}]" in text and f"n = {len(values)}" in text
    if "excludes 0" not in says:  # a null says how large an effect it rules out: where the 90% interval ends
        low90, high90 = st.ttest_1samp(values, 0).confidence_interval(0.90)
        assert f"rules out {'only ' if 'cannot' in says else ''}effects beyond +-{max(-low90, high90):.2f} nats" in text


def test_the_pilot_and_the_study_never_share_a_question(tmp_path):
    from litm import SweepConfig
    from litm import diagnose as dg
    from litm.data import fictional_qa_records, write_jsonl
    from litm.errors import ConfigError
    from litm.experiment import load_examples

    ids = lambda cfg: [e.id for e in load_examples(cfg)]
    # generated data: the pilot under another seed, the study as configured
    gen = planning.pilot_and_study(SweepConfig(task="qa", limit=4), 3, 1, "margin")
    assert ids(gen.pilot) == ["fqa-s1-0", "fqa-s1-1", "fqa-s1-2"] and gen.study == SweepConfig(task="qa", limit=4)
    assert gen.held_out == "generated with seed 1; the study's with seed 0"
    # a file: its first three questions, which the study skips
    path = write_jsonl(fictional_qa_records(7, 4), tmp_path / "f.jsonl")
    f = planning.pilot_and_study(SweepConfig(task="qa", data=str(path), num_docs=4, positions=(0, 3), limit=4), 3, 1)
    assert ids(f.pilot) == ["f.jsonl#1", "f.jsonl#2", "f.jsonl#3"]
    assert ids(f.study) == ["f.jsonl#4", "f.jsonl#5", "f.jsonl#6", "f.jsonl#7"]
    assert f.held_out == "the first 3 of f.jsonl, which the study skips"
    # a diagnosis: the first cases of the file
    sample = planning.pilot_and_study(dg.DiagnoseConfig(cases="x/cases.jsonl", limit=2), 3, None)
    assert (sample.pilot.limit, sample.pilot.skip, sample.study.limit, sample.study.skip) == (3, 0, 2, 3)
    with pytest.raises(ConfigError, match="seed of its own"):
        planning.pilot_and_study(SweepConfig(task="qa"), 3, 0)
    with pytest.raises(ConfigError, match="at least 3"):
        planning.pilot_and_study(SweepConfig(task="qa"), 2, 1)

    planning.check_held_out(["fqa-s1-0"], ["fqa-s0-0"])
    records = pd.DataFrame({"example_id": ["a", "b", "b"]})
    with pytest.raises(StatsError, match="shares 1 questions with the study .*'b'"):
        planning.check_held_out(records, ["b", "c"])
    with pytest.raises(StatsError, match="shares 2 questions"):
        planning.check_held_out(pd.DataFrame({"case_id": ["x", "y"], "example_id": ["1", "2"]}), ["y", "x"])


def test_a_primary_measure_the_scoring_does_not_record_is_a_clear_error_before_the_pilot():
    from litm import SweepConfig
    from litm.errors import ConfigError

    with pytest.raises(ConfigError, match="PRIMARY = 'margin' is not recorded under scoring 'generate'.*"
                                          "set PRIMARY = 'accuracy'"):
        planning.pilot_and_study(SweepConfig(task="qa", scoring="generate"), 12, 1, "margin")
    with pytest.raises(ConfigError, match="set PRIMARY = 'loglik'"):
        planning.pilot_and_study(SweepConfig(task="qa", scoring="loglik"), 12, 1, "accuracy")
    # a pilot without the measure (records of generation) says so too, not "no question has a score"
    generated = pilot_records([1.0, 0.5, 2.0]).assign(gold_margin=None, gold_loglik=None)
    with pytest.raises(StatsError, match="hold no gold margin"):
        planning.plan(generated, lambda d: planning.middle_penalties(d, "margin"), "margin", most=10)


def test_the_budget_follows_the_dtype_the_model_runs_in():
    class LM:  # what `budget` reads of a loaded model: its run identity
        def __init__(self, dtype):
            self.identity = {"dtype": dtype}

    sizes = {"bfloat16": 44, "float32": 24}
    assert planning.budget(sizes, LM("bfloat16")) == 44
    assert planning.budget(sizes, LM("float32")) == 24
    assert planning.budget(30, LM("float16")) == 30  # a number is the number, whatever the dtype
    with pytest.raises(ConfigError, match="float16"):
        planning.budget(sizes, LM("float16"))
    for bad in (0, -3, 2.5, True, {"float32": 0}):
        with pytest.raises(ConfigError, match="MOST"):
            planning.budget(bad, LM("float32"))
