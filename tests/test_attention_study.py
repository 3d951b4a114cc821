"""Troughs, calibration, and the join with sweep records: tables checked against eager attention on a tiny
model and against hand computations on constructed tables."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from litm import attention_study as A
from litm.errors import ConfigError, StatsError
from litm.experiment import SweepConfig, docs_for_length, load_examples, prompt_for, sweep
from litm.prompts import Variant, render

from test_attention import eager_reference

CFG = SweepConfig(task="qa", num_docs=4, positions=(0, 2), limit=2, sentences_per_doc=2, closedbook=False,
                  oracle=False, progress=False)


def doc_mass_by_eager(source, prompt):
    """[layer, doc] head-averaged mass from the last query row of eager attention's full matrices."""
    _, keys = eager_reference(source, prompt, [prompt.manifest.num_tokens - 1])  # [layer, head, key]
    return np.stack([keys[:, :, s:e].sum(-1).mean(1) for s, e in prompt.manifest.doc_spans], -1)


def test_document_attention_matches_eager_and_the_sweeps_prompts(tiny_model_dir, tiny_lm):
    table = A.document_attention(tiny_lm, CFG, progress=False)
    layers = tiny_lm.model.config.num_hidden_layers
    assert len(table) == 2 * 2 * 4 * layers
    for (eid, pos), g in table.groupby(["example_id", "position"]):
        example = next(e for e in load_examples(CFG) if e.id == eid)
        prompt = prompt_for(example, "documents", pos, CFG, tiny_lm.tokenizer)
        assert set(g["prompt_sha256"]) == {prompt.manifest.sha256}
        assert g.loc[g["is_gold"], "doc_position"].unique().tolist() == [pos]
        ref = doc_mass_by_eager(str(tiny_model_dir), prompt)
        got = g.pivot(index="layer", columns="doc_position", values="mass").to_numpy()
        np.testing.assert_allclose(got, ref, atol=1e-4)
        tokens = np.array([e - s for s, e in prompt.manifest.doc_spans])
        per_token = g.pivot(index="layer", columns="doc_position", values="per_token").to_numpy()
        np.testing.assert_allclose(per_token, ref / tokens, atol=1e-4)


def test_position_bias_rotates_every_document_through_every_position(tiny_model_dir, tiny_lm):
    bias = A.position_bias(tiny_lm, CFG, progress=False)
    examples = load_examples(CFG)
    layers, heads = tiny_lm.model.config.num_hidden_layers, tiny_lm.model.config.num_attention_heads
    assert len(bias) == 2 * 4 * 4 * layers * heads  # examples x rotations x positions x layers x heads
    for eid, g in bias.groupby("example_id"):  # a Latin square: each document once at each position
        square = g[(g["layer"] == 0) & (g["head"] == 0)].pivot(index="rotation", columns="doc_position",
                                                                values="doc_id")
        assert all(len(set(square[c])) == 4 for c in square) and all(len(set(r)) == 4 for r in square.to_numpy())
    example, r = examples[1], 3
    docs = example.documents[r:] + example.documents[:r]
    prompt = render(replace(example, documents=docs), tiny_lm.tokenizer, Variant())
    got = bias[(bias["example_id"] == example.id) & (bias["rotation"] == r)]
    assert got["doc_id"].iloc[:4].tolist() == [d.id for d in docs] and set(got["prompt_sha256"]) == {
        prompt.manifest.sha256}
    _, keys = eager_reference(str(tiny_model_dir), prompt, [prompt.manifest.num_tokens - 1])  # [layer, head, key]
    ref = np.stack([keys[:, :, s:e].sum(-1) for s, e in prompt.manifest.doc_spans], -1)  # [layer, head, doc]
    np.testing.assert_allclose(got.sort_values(["layer", "head", "doc_position"])["mass"].to_numpy().reshape(
        ref.shape), ref, atol=1e-4)
    keys = ["rotation", "layer", "doc_position"]
    averaged = A.position_bias(tiny_lm, CFG, examples[:1], by_head=False, progress=False).set_index(keys)["mass"]
    per_head = bias[bias["example_id"] == examples[0].id].groupby(keys)["mass"].mean()
    np.testing.assert_allclose(averaged.sort_index(), per_head, atol=1e-6)
    info = bias.attrs["litm"]
    tokens = [e - s for ex in examples for k in range(4) for s, e in render(
        replace(ex, documents=ex.documents[k:] + ex.documents[:k]), tiny_lm.tokenizer, Variant()).manifest.doc_spans]
    assert info["estimator"] == "rotation" and info["rotations"] == 4 and info["queries"] == "last"
    assert info["examples"] == [e.id for e in examples]
    assert info["layout"] == {"template": "ours:qa", "chat": False, "questions": 1, "documents": 4,
                              "doc_format": "paper"}
    assert info["doc_tokens"] == {"mean": pytest.approx(np.mean(tokens)), "min": min(tokens), "max": max(tokens)}


def _rotation_table(log_mass):
    """A position_bias-shaped table from log_mass[example, rotation, layer, head, slot] (one head: no column)."""
    rows = []
    for (e, r, layer, h, k), v in np.ndenumerate(log_mass):
        rows.append({"example_id": f"e{e}", "rotation": r, "layer": layer, "doc_position": k, "mass": np.exp(v),
                     **({"head": h} if log_mass.shape[3] > 1 else {})})
    return pd.DataFrame(rows)


def test_slot_bias_cancels_content_and_normalisers_over_a_rotation():
    """log mass = b[slot] + content[doc] - log Z[rotation]: averaging over a full rotation leaves b, centred."""
    rng = np.random.default_rng(0)
    n, b = 5, np.array([[0.8, -0.2, -0.5, -0.4, 0.3], [0.0, 1.0, 2.0, 3.0, 4.0]])  # [head, slot]
    content = rng.normal(0, 2, size=(2, n))  # two examples' documents
    log_mass = np.zeros((2, n, 1, 2, n))
    for e in range(2):
        for r in range(n):
            logit = b + content[e][(np.arange(n) + r) % n]  # slot k holds document (k + r) mod n
            log_mass[e, r, 0] = logit - np.log(np.exp(logit).sum(-1, keepdims=True) + rng.uniform(1, 50))
    got = A.slot_bias(_rotation_table(log_mass))
    np.testing.assert_allclose(got[0], b - b.mean(-1, keepdims=True), atol=1e-12)
    averaged = np.log(np.exp(log_mass).mean(axis=3))  # heads averaged before the log
    expected = averaged.mean(axis=(0, 1))[0]
    np.testing.assert_allclose(A.slot_bias(_rotation_table(log_mass), by_head=False)[0, 0],
                               expected - expected.mean(), atol=1e-12)
    with pytest.raises(ConfigError, match="by_head=True"):
        A.slot_bias(_rotation_table(log_mass[:, :, :, :1]))


def _table(values, gold):
    """A constructed attention table: values[(example, position)] = per-document values for layers 0, 1."""
    rows = []
    for (eid, pos), layers in values.items():
        for layer, docs in enumerate(layers):
            for d, v in enumerate(docs):
                rows.append({"example_id": eid, "position": pos, "doc_position": d, "doc_id": f"{eid}-{d}",
                             "is_gold": d == gold[(eid, pos)], "layer": layer, "mass": v, "per_token": v / 10,
                             "prompt_sha256": f"{eid}{pos}"})
    return pd.DataFrame(rows)


def test_troughs_average_each_example_once_with_t_intervals():
    # two examples, two prompts each; the gold (excluded) carries a huge value that must not count
    values = {("a", 0): [[9, 1, 2], [9, 3, 4]], ("a", 2): [[5, 7, 9], [1, 1, 9]],
              ("b", 0): [[9, 2, 2], [9, 2, 2]], ("b", 2): [[4, 4, 9], [6, 6, 9]]}
    gold = {("a", 0): 0, ("a", 2): 2, ("b", 0): 0, ("b", 2): 2}
    t = A.troughs(_table(values, gold), by_layer=False)
    # position 1: example a -> (1 + 3 + 7 + 1) / 4 = 3, example b -> (2 + 2 + 4 + 6) / 4 = 3.5
    row = t[t["doc_position"] == 1].iloc[0]
    x = np.array([3.0, 3.5])
    half = st.t.ppf(0.975, 1) * x.std(ddof=1) / np.sqrt(2)
    assert row["mean"] == pytest.approx(3.25) and row["n"] == 2
    assert row["ci_low"] == pytest.approx(3.25 - half) and row["ci_high"] == pytest.approx(3.25 + half)
    # position 0 only from the prompts where it is a distractor: a -> (5 + 1) / 2, b -> (4 + 6) / 2
    assert t[t["doc_position"] == 0]["mean"].iloc[0] == pytest.approx(4.0)
    per_layer = A.troughs(_table(values, gold), layers=[1])
    assert set(per_layer["layer"]) == {1}
    # layer 1, position 1: a -> (3 + 1) / 2 = 2, b -> (2 + 6) / 2 = 4
    assert per_layer[per_layer["doc_position"] == 1]["mean"].iloc[0] == pytest.approx(3.0)
    with_gold = A.troughs(_table(values, gold), by_layer=False, include_gold=True)
    assert with_gold[with_gold["doc_position"] == 0]["mean"].iloc[0] == pytest.approx(((9 + 9 + 5 + 1) / 4 + (9 + 9 + 4 + 6) / 4) / 2)


def _bias(values):
    """A one-example, one-rotation, one-head bias table (`values[layer, position]` its masses)."""
    values = np.atleast_2d(values)
    return _rotation_table(np.log(values)[None, None, :, None, :])


def test_calibration_removes_the_positional_bias_from_the_ranking():
    # the first document always gets e times the attention for its position; the gold (in the middle) has more
    # content
    values = {("a", 1): [[6, 3, 1]], ("b", 1): [[5.5, 2, 1]], ("c", 0): [[7, 1, 1]]}
    gold = {("a", 1): 1, ("b", 1): 1, ("c", 0): 0}
    table = _table(values, gold)
    bias = _bias([np.e, 1.0, 1.0])  # slot_bias: [2/3, -1/3, -1/3]
    scores = A.relevance_scores(table, bias, value="mass")
    a = scores[scores["example_id"] == "a"].set_index("doc_position")
    np.testing.assert_allclose(a["calibrated"], np.log([6, 3, 1]) - np.array([2, -1, -1]) / 3)
    np.testing.assert_allclose(a["bias"], np.array([2, -1, -1]) / 3)
    r = A.recall_by_position(scores, ks=(1, 2)).set_index(["method", "position", "k"])
    assert r.loc[("vanilla", 1, 1), "recall"] == 0.0
    assert r.loc[("calibrated", 1, 1), "recall"] == 0.5  # a: 3e > 6, b: 2e < 5.5
    assert r.loc[("vanilla", 1, 2), "recall"] == 1.0
    assert r.loc[("calibrated", 0, 1), "recall"] == 1.0  # c: 7 / e still beats 1 and 1
    assert r.loc[("vanilla", 0, 1), "n"] == 1
    lo, hi = r.loc[("calibrated", 1, 1), ["ci_low", "ci_high"]]
    assert (lo, hi) == pytest.approx((0.09453120573833562, 0.9054687942616644))  # Wilson 1/2


def test_bad_layers_and_missing_bias_positions_are_clear_errors():
    table = _table({("a", 0): [[1, 2]]}, {("a", 0): 0})
    with pytest.raises(ConfigError, match="layers"):
        A.troughs(table, layers=[5])
    with pytest.raises(ConfigError, match="positions \\[1\\]"):
        A.relevance_scores(table, _bias([1.0]))
    with pytest.raises(ConfigError, match="at least one"):
        A.document_attention(None, CFG, examples=[])


def _records(rows):
    return pd.DataFrame([{"condition": "documents", "status": "ok", **r} for r in rows])


def test_join_checks_prompts_and_reports_attention_by_outcome():
    values = {("a", 0): [[4, 1]], ("a", 1): [[3, 2]], ("b", 0): [[6, 1]], ("b", 1): [[3, 1]]}
    gold = {k: k[1] for k in values}
    table = _table(values, gold)
    scores = A.relevance_scores(table, value="mass")
    recs = _records([{"example_id": "a", "position": 0, "correct": True, "gold_loglik": -1.0, "prompt_sha256": "a0"},
                     {"example_id": "a", "position": 1, "correct": False, "gold_loglik": -2.0, "prompt_sha256": "a1"},
                     {"example_id": "b", "position": 0, "correct": False, "gold_loglik": -3.0, "prompt_sha256": "b0"},
                     {"example_id": "b", "position": 1, "correct": False, "gold_loglik": -4.0, "prompt_sha256": "b1"}])
    A.check_same_prompts(table, recs)
    joined = A.join_outcomes(scores, recs)
    assert joined.set_index(["example_id", "position"])["gold_attention"].to_dict() == {
        ("a", 0): 4, ("a", 1): 2, ("b", 0): 6, ("b", 1): 1}
    t = A.attention_and_accuracy(joined).set_index("position")
    assert t.loc[0, "accuracy"] == 0.5 and t.loc[0, "attention"] == 5.0
    assert t.loc[0, "attention_if_right"] == 4.0 and t.loc[0, "attention_if_wrong"] == 6.0
    assert np.isnan(t.loc[1, "attention_if_right"]) and t.loc[1, "attention_if_wrong"] == 1.5
    changed = recs.assign(prompt_sha256=["a0", "a1", "XX", "b1"])
    with pytest.raises(ConfigError, match="1 prompts differ"):
        A.check_same_prompts(table, changed)
    with pytest.raises(ConfigError, match="no sweep record"):
        A.join_outcomes(scores, recs.iloc[:3])


def test_attention_outcome_model_agrees_with_a_logistic_fit_on_one_row_per_question():
    import statsmodels.api as sm

    rng = np.random.default_rng(3)
    att = rng.normal(size=300)
    y = rng.random(300) < 1 / (1 + np.exp(-(0.3 + 1.2 * att)))
    joined = pd.DataFrame({"example_id": [f"q{i}" for i in range(300)], "position": 0, "gold_attention": att,
                           "correct": y})
    got = A.attention_outcome_model(joined)
    z = (att - att.mean()) / att.std(ddof=1)
    ref = sm.Logit(y.astype(float), sm.add_constant(z)).fit(disp=0)
    assert got["odds_ratio_per_sd"] == pytest.approx(np.exp(ref.params[1]), rel=1e-4)
    assert got["ci_low"] > 1 and got["questions"] == 300
    with pytest.raises(StatsError, match="right and wrong"):
        A.attention_outcome_model(joined.assign(correct=True))


def test_sinks_by_length_match_eager_attention(tiny_model_dir, tiny_lm):
    cfg = replace(CFG, num_docs=2, positions=(0,))
    table = A.sinks_by_length(tiny_lm, cfg, (250, 400), progress=False)
    assert sorted(table["target_length"].unique()) == [250, 400]
    for L, g in table.groupby("target_length"):
        n = int(g["num_tokens"].iloc[0])
        assert n <= L
        docs = docs_for_length(cfg, tiny_lm.tokenizer, L)
        pool = max(docs_for_length(cfg, tiny_lm.tokenizer, x) for x in (250, 400))
        c = replace(cfg, num_docs=docs, limit=1, positions=(0,), generate_docs=pool)
        prompt = prompt_for(load_examples(c)[0], "documents", 0, c, tiny_lm.tokenizer)
        assert prompt.manifest.num_tokens == n
        _, keys = eager_reference(str(tiny_model_dir), prompt, list(range(n)))
        got = g.pivot(index="layer", columns="head", values="first").to_numpy()
        np.testing.assert_allclose(got, keys[:, :, 0], atol=1e-4)


def test_a_prompt_over_the_window_is_a_clear_error(tmp_path):
    from conftest import build_tiny_model
    from litm.models import load_model

    lm = load_model(str(build_tiny_model(tmp_path, max_positions=64)), device="cpu", reuse=False)
    with pytest.raises(ConfigError, match="window of 64"):
        A.document_attention(lm, CFG, progress=False)


def test_join_with_a_real_sweep_on_the_tiny_model(tiny_lm, tmp_path):
    cfg = replace(CFG, results_dir=str(tmp_path))
    records = sweep(cfg, tiny_lm)
    table = A.document_attention(tiny_lm, cfg, progress=False)
    A.check_same_prompts(table, records)
    joined = A.join_outcomes(A.relevance_scores(table), records)
    assert len(joined) == 4 and joined["correct"].isin([True, False]).all()


def test_attention_figures_draw_from_tables(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from litm import plots

    values = {(e, p): [[3, 1, 2], [2, 1, 3]] for e in "abc" for p in (0, 2)}
    table = _table(values, {k: k[1] for k in values})
    scores = A.relevance_scores(table, _bias([[2.0, 1.0, 1.0], [1.0, 1.0, 2.0]]))
    joined = scores[scores["is_gold"]].rename(columns={"vanilla": "gold_attention"}).assign(correct=[1, 0, 1, 1, 0, 0])
    sink = pd.DataFrame({"num_tokens": np.repeat([100, 200], 4), "layer": np.tile([0, 0, 1, 1], 2),
                         "head": np.tile([0, 1], 4), "first": [0.9, 0.1, 0.6, 0.2, 0.8, 0.1, 0.4, 0.7],
                         "first_four": 0.95})
    figures = {"heat": plots.attention_heatmap(A.troughs(table)), "strength": plots.sink_strength(sink),
               "map": plots.sink_map(sink), "curves": plots.attention_and_accuracy_curves(A.attention_and_accuracy(joined)),
               "recall": plots.recall_curves(A.recall_by_position(scores))}
    assert "2 heads" in figures["map"].axes[0].get_title()  # at 200 tokens: (0, 0) and (1, 1)
    for name, fig in figures.items():
        png, _ = plots.save_figure(fig, name, tmp_path)
        assert png.stat().st_size > 1000


def test_attention_scores_are_log_attention_minus_the_bias(tiny_model_dir, tiny_lm):
    example = load_examples(CFG)[0]
    prompt = render(example, tiny_lm.tokenizer, Variant())
    q0, q1 = prompt.manifest.question_spans[-1]
    _, keys = eager_reference(str(tiny_model_dir), prompt, list(range(q0, q1)))  # [layer, head, key]
    per_token = np.stack([keys[:, :, s:e].sum(-1).mean(1) / (e - s) for s, e in prompt.manifest.doc_spans], -1)
    np.testing.assert_allclose(A.attention_scores(tiny_lm, example), per_token.mean(0), atol=1e-5)
    bias = _bias([[1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 4.0, 8.0]])  # layer 1: log 2 apart, centred at 1.5 log 2
    got = A.attention_scores(tiny_lm, example, bias, layers=[1])
    np.testing.assert_allclose(got, np.log(per_token[1]) - (np.arange(4) - 1.5) * np.log(2), atol=1e-5)


def test_the_findings_in_words_come_from_the_tables():
    # planted: at 400 tokens token 0 gets 0.6 in one of two heads and 0.2 in the other; the middle distractors
    # get half the edges' attention; the answer follows attention strongly; calibration 9 of 12 against 2 of 12
    sink = pd.DataFrame({"num_tokens": [100, 100, 400, 400], "first": [0.9, 0.1, 0.6, 0.2]})
    curve = pd.DataFrame({"doc_position": [0, 1, 2, 3], "mean": [0.2, 0.1, 0.08, 0.2], "ci_low": 0.0,
                          "ci_high": 0.3, "n": 12})
    rng = np.random.default_rng(0)
    att = rng.normal(size=300)
    joined = pd.DataFrame({"example_id": [f"q{i}" for i in range(300)], "position": 0, "gold_attention": att,
                           "correct": rng.random(300) < 1 / (1 + np.exp(-2 * att))})
    lo9, hi9 = st.binomtest(9, 12).proportion_ci(method="wilson")
    lo2, hi2 = st.binomtest(2, 12).proportion_ci(method="wilson")
    recall = pd.DataFrame({"method": ["vanilla", "calibrated"], "position": 4, "k": 1, "recall": [2 / 12, 9 / 12],
                           "ci_low": [lo2, lo9], "ci_high": [hi2, hi9], "n": 12})
    text = A.describe(sink, curve, joined, recall, middle=4)
    assert "at 400 tokens the first token gets 40% of each token's attention" in text
    assert "1 of the 2 put over half" in text
    assert f"{(0.1 + 0.08) / 2 / 0.2:.2f} times the attention" in text and "least at document 3" in text
    assert "a trough." in text and "goes with a right answer" in text
    assert "ranks it first in 9 of 12 prompts (75%" in text and "plain attention in 2 (17%" in text
    assert "the intervals do not overlap" in text
    flat = A.describe(sink, curve.assign(mean=[0.1, 0.2, 0.2, 0.1]), joined.assign(correct=True), recall, 4)
    assert "no trough." in flat and "not fitted" in flat
