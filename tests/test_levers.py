"""The levers study (notebook 08) on a tiny random model: every lever runs on the same questions under its own
run identity, each lever shapes the prompt as it should, and the middle-penalty changes and costs match sums
done by hand."""
import json
import random
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from litm import levers
from litm.errors import ConfigError, StatsError
from litm.data import generate_fictional_qa
from litm.prompts import Variant, render

from conftest import sharpened


@pytest.fixture(scope="module")
def ran(tiny_lm, tmp_path_factory):
    full = len(render(generate_fictional_qa(1, 5, seed=0, sentences_per_doc=2)[0], tiny_lm.tokenizer,
                      Variant()).input_ids)
    cfg = levers.LeverConfig(model="tiny", num_docs=5, positions=(0, 2, 4), limit=3, sentences_per_doc=2,
                             budget=int(full * 0.7), bias_examples=1, progress=False,
                             results_dir=str(tmp_path_factory.mktemp("levers")))
    prepared = levers.prepare(cfg, tiny_lm)
    prepared = replace(prepared, bias=sharpened(prepared.bias))  # so that calibration moves the scores
    return cfg, prepared, levers.run(cfg, tiny_lm, prepared)


def test_every_lever_runs_on_the_same_questions_apart(ran, tiny_lm):
    cfg, prepared, df = ran
    assert len(df) == len(levers.LEVERS) * 3 * 3 and (df["status"] == "ok").all()
    assert prepared.layers == (1,) and prepared.passes == 5  # the second half of 2 layers; 1 question x 5 places
    hashes = {lv: set(g["config_hash"]) for lv, g in df.groupby("lever")}
    assert all(a.isdisjoint(b) for x, a in hashes.items() for y, b in hashes.items() if x != y)
    assert all(set(g["example_id"]) == set(df["example_id"]) for _, g in df.groupby(["lever", "position"]))
    kinds = {lv: json.loads(g["sweep_config"].iloc[0]).get("intervention", {}).get("kind") for lv, g in
             df.groupby("lever")}
    assert kinds == {"baseline": None, "shuffle": None, "u_shape": None, "attention_sort": None, "repeat": None,
                     "extractive": None, "calibration": "calibration", "rescaling": "positional_rescaling",
                     "channel_scaling": "channel_scaling", "parallel": "parallel_documents"}
    # channel scaling: the channel found on the held-out prompts, one for every chosen layer, scaled by 0
    iv = json.loads(df.loc[df["lever"] == "channel_scaling", "sweep_config"].iloc[0])["intervention"]
    assert iv["layers"] == [1] and iv["scale"] == 0.0 and iv["channels"] == int(prepared.channels["channel"].iloc[0])
    assert prepared.channel_passes == cfg.channel_examples and list(prepared.channels["layer"]) == [1]
    assert "intervention" not in tiny_lm.identity
    # u_shape of 5 ranked documents is 1, 3, 5, 4, 2: ranks 1, 3, 5 sit at places 0, 4, 2
    u = df[df["lever"] == "u_shape"].groupby("position")["gold_index"].unique()
    assert [list(u[p]) for p in (0, 2, 4)] == [[0], [1], [2]]
    base = df[df["lever"] == "baseline"].set_index(["example_id", "position"])
    for lever, check in (("repeat", lambda g, b: (g > b).all()), ("extractive", lambda g, b: (g <= cfg.budget).all()),
                         ("calibration", lambda g, b: (g == b).all())):
        got = df[df["lever"] == lever].set_index(["example_id", "position"])["prompt_tokens"]
        assert check(got, base["prompt_tokens"].reindex(got.index)), lever
    for lever in ("calibration", "channel_scaling"):  # same prompts, other scores
        got = df[df["lever"] == lever].set_index(["example_id", "position"])
        assert (got["prompt_tokens"] == base["prompt_tokens"].reindex(got.index)).all()
        assert not np.allclose(got["gold_loglik"], base["gold_loglik"].reindex(got.index)), lever


def test_the_shuffle_sorting_and_parallel_levers_place_the_documents_as_they_say(ran, tiny_lm):
    cfg, _, df = ran
    by = {lv: g.set_index(["example_id", "position"]) for lv, g in df.groupby("lever")}
    # shuffle: one recorded seed per question, the same at every gold position; the gold lands where that
    # seed's permutation of the ranked list puts rank p + 1
    sh = by["shuffle"]
    for (q, p), r in sh.iterrows():
        assert r["shuffle_seed"] == levers.question_seed(cfg.seed, q)
        ranks = list(range(5))
        assert r["gold_index"] == random.Random(int(r["shuffle_seed"])).sample(ranks, 5).index(p)
    assert sh.groupby(level=0)["shuffle_seed"].nunique().eq(1).all()
    # attention sorting: sort_rounds + 1 orders, the first the retrieved list, the gold where the last puts it
    for (q, p), r in by["attention_sort"].iterrows():
        orders, base = r["sort_orders"], by["baseline"].loc[(q, p)]
        assert len(orders) == cfg.sort_rounds + 1 and sorted(orders[0]) == sorted(orders[-1])
        assert orders[0].index(orders[0][base["gold_index"]]) == p
        assert orders[-1].index(orders[0][p]) == r["gold_index"]
    # parallel documents: no position effect, so a question's scores are the same at every gold position
    par = by["parallel"]["gold_margin"].unstack()
    assert (par.max(axis=1) - par.min(axis=1)).max() < 1e-5
    plain = by["baseline"]["gold_margin"].unstack()
    assert (plain.max(axis=1) - plain.min(axis=1)).max() > 1e-3


def test_a_rerun_scores_nothing_again(ran, tiny_lm):
    cfg, prepared, df = ran
    again = levers.run(cfg, tiny_lm, prepared)
    pd.testing.assert_frame_equal(again.reset_index(drop=True), df.reset_index(drop=True))


def _records(values: dict) -> pd.DataFrame:
    """Records from {lever: [[margin at each of 3 positions] per question]}, a right answer when above 0."""
    rows = []
    for lever, qs in values.items():
        for q, margins in enumerate(qs):
            for p, m in zip((0, 4, 9), margins):
                rows.append({"lever": lever, "position": p, "example_id": f"q{q}", "status": "ok", "gold_margin": m,
                             "correct": m > 0, "prompt_tokens": 100 if lever == "baseline" else 150,
                             "latency_s": 1.0 if lever == "baseline" else 3.0, "seconds": 0.5 if lever == "x" else 0.0})
    return pd.DataFrame(rows)


def test_penalty_changes_are_paired_differences_of_middle_penalties_and_of_each_position():
    from scipy import stats as st

    base = [[1.0, -1.0, 1.0], [2.0, 0.0, 0.0], [0.0, -3.0, 2.0], [1.0, 1.0, 1.0]]
    lever = [[1.0, 1.0, 1.0], [2.0, 1.0, 0.0], [0.0, -1.0, 2.0], [1.0, 0.0, 1.0]]
    got = levers.penalty_changes(_records({"baseline": base, "x": lever})).set_index(["measure", "estimand"])
    pen_base = np.array([2.0, 1.0, 4.0, 0.0])  # (first + last) / 2 - middle, by hand
    pen_lever = np.array([0.0, 0.0, 2.0, 1.0])
    row = got.loc[("margin", "middle penalty")]
    assert row["n"] == 4 and row["change"] == pytest.approx((pen_lever - pen_base).mean())
    assert row["value"] == pytest.approx(pen_lever.mean()) and row["baseline"] == pytest.approx(1.75)
    low, high = st.ttest_1samp(pen_lever - pen_base, 0).confidence_interval(0.95)  # t, not a bootstrap, at n = 4
    assert (row["change_low"], row["change_high"]) == pytest.approx((low, high), abs=1e-12)
    assert row["p_t"] == pytest.approx(st.ttest_1samp(pen_lever - pen_base, 0).pvalue, rel=1e-10)
    # the mean over positions: baseline 1/3, 2/3, -1/3, 1; the lever's 1, 1, 1/3, 2/3
    assert got.loc[("margin", "mean over positions"), "change"] == pytest.approx(np.mean([2 / 3, 1 / 3, 2 / 3, -1 / 3]))
    # each position on its own: the middle (rank 5) rises by 2, 1, 2, -1; the edges do not move
    mid = got.loc[("margin", "rank 5")]
    assert mid["position"] == 4 and mid["change"] == pytest.approx(1.0) and mid["baseline"] == pytest.approx(-0.75)
    assert (mid["change_low"], mid["change_high"]) == pytest.approx(
        tuple(st.ttest_1samp([2.0, 1.0, 2.0, -1.0], 0).confidence_interval(0.95)), abs=1e-12)
    assert got.loc[("margin", "rank 1"), "change"] == 0.0 and got.loc[("margin", "rank 10"), "change"] == 0.0
    acc = got.loc[("accuracy", "middle penalty")]  # right = margin above 0: baseline 1, 0.5, 0.5, 0; lever 0, -0.5, 0.5, 1
    assert acc["change"] == pytest.approx(np.mean([-1.0, -1.0, 0.0, 1.0]))


def test_question_changes_in_the_penalty_and_at_one_position():
    base = [[1.0, -1.0, 1.0], [2.0, 0.0, 0.0], [0.0, -3.0, 2.0]]
    lever = [[1.0, 1.0, 1.0], [2.0, 1.0, 0.0], [0.5, -1.0, 2.0]]
    df = _records({"baseline": base, "x": lever})
    assert list(levers.question_changes(df, "x")) == pytest.approx([-2.0, -1.0, -1.75])  # penalties by hand
    assert list(levers.question_changes(df, "x", position=4)) == [2.0, 1.0, 2.0]
    assert list(levers.question_changes(df, "x", position=0)) == [0.0, 0.0, 0.5]


def test_costs_against_the_baseline():
    df = _records({"baseline": [[1.0, 0.0, 1.0]] * 2, "x": [[1.0, 0.0, 1.0]] * 2})
    timing = pd.DataFrame({"lever": ["baseline", "x"], "scoring_s": [1.0, 3.0], "prompt_s": [0.0, 0.5]})
    got = levers.costs(df, timing, levers.Prepared(None, (1,), 12.0, 20)).set_index("lever")
    assert got.loc["x", "tokens_vs_baseline"] == pytest.approx(1.5)
    assert got.loc["x", "seconds_vs_baseline"] == pytest.approx(3.5)  # scoring 3 s plus compression 0.5 s, over 1 s
    assert got.loc["x", "one_off_passes"] == 0  # not an intervention lever
    with pytest.raises(StatsError, match="baseline"):
        levers.costs(df[df["lever"] == "x"], timing)


def test_timing_runs_every_lever_side_by_side(ran, tiny_lm):
    cfg, prepared, _ = ran
    got = levers.timed(cfg, tiny_lm, prepared, rounds=2).set_index("lever")
    assert list(got.index) == list(levers.LEVERS) and (got["scoring_s"] > 0).all() and (got["rounds"] == 2).all()
    assert got.loc["extractive", "prompt_s"] > 0 and got.loc["attention_sort", "prompt_s"] > 0
    assert got.loc["baseline", "prompt_s"] == 0
    assert "intervention" not in tiny_lm.identity


def test_bad_lever_configs_are_clear_errors(tiny_lm):
    for kw, match in ((dict(levers=("baseline", "magic")), "unknown levers"),
                      (dict(levers=("u_shape",)), "keep 'baseline'"),
                      (dict(positions=(0, 9)), "at least three gold positions"),
                      (dict(ratios=(1.8, 1.2)), "0 < low <= high"),
                      (dict(sort_rounds=0), "sort_rounds must be"),
                      (dict(channel_scale=1.5), "channel scale must lie in \\[-1, 1\\]")):
        with pytest.raises(ConfigError, match=match):
            levers.LeverConfig(**kw)
    with pytest.raises(ConfigError, match="outside the model's 2 layers"):
        levers.prepare(levers.LeverConfig(num_docs=5, positions=(0, 2, 4), layers=(0, 7)), tiny_lm)
