"""Reports and comparisons from stored results; the position x length grid."""
import json
import time

import numpy as np
import pytest

from litm import SweepConfig, sweep
from litm.cli import main
from litm.errors import ConfigError, StatsError
from litm.experiment import Sweep, depth_positions, grid
from litm.report import analyse, compare, load_results, position_length_line, to_markdown, write_report
from litm.store import ResultStore
from litm.study import config_hash

# a run identity as `models.run_identity` gives it, for results written without a model
IDENTITY = {"weights": {"kind": "test"}, "dtype": "float32", "device": "cpu", "attn_implementation": "sdpa",
            "backend": "transformers"}


def _synthetic(root, accuracy_by_position: dict, n: int = 60, seed: int = 0, **config):
    """Write a sweep's results directly: question i is right at position p with the given probability."""
    rng = np.random.default_rng(seed)
    base = SweepConfig(task="qa", positions=tuple(accuracy_by_position), limit=n, closedbook=False, oracle=False,
                       **config)
    for pos, acc in accuracy_by_position.items():
        rc = Sweep(base).run_config(IDENTITY, {"condition": "documents", "position": pos})
        store = ResultStore(root, config_hash(rc), rc)
        for i in range(n):
            store.append({"example_id": f"q{i}", "condition": "documents", "position": pos, "status": "ok",
                          "correct": bool(rng.random() < acc), "gold_loglik": -1.0, "gold_rank": 1,
                          "prompt_tokens": 500, "gold_rel_depth": pos / 10})
    return root


def test_report_numbers_match_the_records(tiny_lm, tmp_path):
    cfg = SweepConfig(task="qa", num_docs=5, positions=(0, 2, 4), limit=8, sentences_per_doc=2,
                      results_dir=str(tmp_path / "res"), progress=False)
    df = sweep(cfg, tiny_lm)
    out = write_report([tmp_path / "res"], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    tex = (tmp_path / "rep" / "report.tex").read_text()
    assert r"\begin{tabular}" in tex and r"\bottomrule" in tex
    assert len(out["figures"]) == 2 and all(p.is_file() for p in out["figures"])
    for pos in (0, 2, 4):  # every measure per position, computed here from the raw records
        g = df[(df.condition == "documents") & (df.position == pos)]
        (row,) = [line for line in md.splitlines() if line.startswith(f"| gold at {pos + 1} | 8 | 0 |")]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3].startswith(f"{100 * g.correct.mean():.1f} [")
        assert cells[4].startswith(f"{g.gold_loglik.mean():.2f} [")
        assert cells[5].startswith(f"{g.gold_margin.mean():.2f} [")
    acc = {p: df[(df.condition == "documents") & (df.position == p)].correct.mean() for p in (0, 2, 4)}
    (rep,) = out["reports"]
    assert rep.primary.name == "accuracy" and [e.measure.name for e in rep.effects] == ["accuracy", "loglik", "margin"]
    assert rep.penalty.value == pytest.approx((acc[0] + acc[4]) / 2 - acc[2])
    assert [t.name for t in rep.effects[0].tests] == ["Cochran's Q", "sign test"]
    assert [t.name for t in rep.effects[2].tests] == ["paired t", "Wilcoxon signed-rank"]
    assert "smollm2" not in md and str(tiny_lm.name) in md
    import pandas as pd

    table = pd.read_csv(out["csv"])  # one row per condition x measure, the numbers computed here from the records
    assert len(table) == 5 * 3 and set(table["measure"]) == {"accuracy", "loglik", "margin"}
    for pos in (0, 2, 4):
        g = df[(df.condition == "documents") & (df.position == pos)]
        rows = table[(table["condition"] == "documents") & (table["position"] == pos + 1)].set_index("measure")
        assert rows.loc["accuracy", "value"] == pytest.approx(g.correct.mean())
        assert rows.loc["margin", "value"] == pytest.approx(g.gold_margin.mean())
        assert (rows["n"] == 8).all() and (rows["num_docs"] == 5).all() and (rows["model"] == tiny_lm.name).all()
        lo, hi = rows.loc["loglik", ["ci_low", "ci_high"]]
        sem = g.gold_loglik.std(ddof=1) / np.sqrt(8)
        assert hi - lo == pytest.approx(2 * 2.3646 * sem, rel=1e-3)  # t(7) 97.5% quantile
    assert table.loc[table["measure"] == "accuracy", "primary"].all()
    assert table.loc[table["condition"] == "closedbook", "position"].isna().all()
    assert analyse(df)[0].sweep_id == rep.sweep_id, "a sweep() table and its stored records agree"


def test_report_keeps_sweeps_apart(tmp_path):
    _synthetic(tmp_path / "r", {0: 0.9, 4: 0.5, 9: 0.9}, seed=1)
    _synthetic(tmp_path / "r", {0: 0.5, 4: 0.5, 9: 0.5}, seed=2, num_docs=12)
    reports = analyse(load_results([tmp_path / "r"]))
    assert len(reports) == 2 and {r.config["num_docs"] for r in reports} == {10, 12}
    other = ResultStore(tmp_path / "r", "strategies1234ab", {**IDENTITY, "kind": "strategies"}, key="example_id",
                        condition=("arrangement", "variant"))
    other.append({"example_id": "q0", "condition": "rank|after", "position": None, "status": "ok", "correct": True})
    assert len(analyse(load_results([tmp_path / "r"]))) == 2, "another study's runs are not sweeps"
    with pytest.raises(StatsError, match="no position-sweep records"):
        load_results([other.dir])


def test_compare_flags_a_regression_and_exits_nonzero(tmp_path, capsys):
    a = _synthetic(tmp_path / "a", {0: 0.8, 4: 0.8, 9: 0.8}, n=150, seed=3)
    b = _synthetic(tmp_path / "b", {0: 0.8, 4: 0.3, 9: 0.8}, n=150, seed=4, model="other-model")
    result = compare(a, b)
    assert result.verdict == "regression"
    assert result.penalty_change.low > 0 and result.differences == {"model": ("smollm2-135m", "other-model")}
    assert main(["compare", str(a), str(b)]) == 1
    assert "verdict: regression" in capsys.readouterr().out
    assert main(["compare", str(b), str(a)]) == 0  # the other way round it improved
    assert compare(a, a).verdict == "no significant difference"


def test_compare_refuses_mixed_or_unpaired_runs(tmp_path):
    a = _synthetic(tmp_path / "a", {0: 0.8, 4: 0.5, 9: 0.8})
    mixed = _synthetic(_synthetic(tmp_path / "m", {0: 0.8, 4: 0.5, 9: 0.8}), {0: 0.8, 4: 0.5, 9: 0.8}, num_docs=12)
    with pytest.raises(StatsError, match="mixes 2 different configs"):
        compare(a, mixed)
    other = _synthetic(tmp_path / "o", {0: 0.8, 4: 0.5, 9: 0.8}, num_docs=12)
    with pytest.raises(StatsError, match="num_docs"):
        compare(a, other)
    assert compare(a, other, different_configs=True).differences == {"num_docs": (10, 12)}
    fewer = _synthetic(tmp_path / "f", {0: 0.8, 4: 0.5, 9: 0.8}, n=40, model="x")
    with pytest.raises(StatsError, match="not paired"):
        compare(a, fewer)
    with pytest.raises(StatsError, match="no results"):
        load_results([tmp_path / "nothing-here"])


def test_a_report_pairs_the_questions_every_run_of_a_sweep_holds(tmp_path):
    from litm.stats import paired_table

    root = _synthetic(tmp_path / "r", {0: 0.8, 4: 0.5, 9: 0.8}, n=20)
    f = next(p for p in root.glob("*/records.jsonl")
             if json.loads((p.parent / "manifest.json").read_text())["config"]["position"] == 4)
    f.write_text("\n".join(f.read_text().splitlines()[:12]) + "\n")  # one run holds 12 questions, two hold 20
    df = load_results([root])
    with pytest.raises(StatsError, match="same questions"):  # asked directly, unpaired conditions are an error
        paired_table(df)
    (rep,) = analyse(df)  # a report over a shared folder pairs what every run holds
    assert rep.n_questions == 12 and rep.dropped == 8 and set(rep.summary["n"]) == {12}
    assert "(8 left out: not run or not scored under every condition)" in to_markdown([rep])


def test_depth_positions_are_evenly_spaced():
    assert depth_positions(10, 10) == list(range(10))
    assert depth_positions(19, 10) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    assert depth_positions(3, 10) == [0, 1, 2]
    with pytest.raises(ConfigError):
        depth_positions(5, 1)


def test_grid_shares_questions_across_lengths(tiny_lm, tmp_path):
    from litm.plots import depth_length_heatmap

    cfg = SweepConfig(task="qa", limit=2, sentences_per_doc=2, results_dir=str(tmp_path), progress=False)
    df = grid(cfg, [500, 1000], depths=4, model=tiny_lm)
    for L, g in df.groupby("target_length"):
        assert (g.prompt_tokens <= L).all()
        n = int(g.num_docs.iloc[0])
        assert sorted(g.position.unique()) == depth_positions(n, 4)
        assert np.allclose(g.depth, g.position / (n - 1))
    short, long_ = (df[df.target_length == L] for L in (500, 1000))
    assert long_.num_docs.iloc[0] > short.num_docs.iloc[0]
    assert set(short.example_id) == set(long_.example_id)
    fig = depth_length_heatmap(df, depths=4)
    assert fig.axes[0].get_xlabel().startswith("Prompt length")
    with pytest.raises(ConfigError, match="window"):
        grid(cfg, [10_000], model=tiny_lm)
    with pytest.raises(ConfigError, match="only one document"):
        grid(cfg, [180], model=tiny_lm)  # one document is about 171 tokens here


def test_reports_read_stores_without_changing_them(tmp_path):
    root = _synthetic(tmp_path / "r", {0: 0.8, 4: 0.5, 9: 0.8}, n=10)
    f = next(root.glob("*/records.jsonl"))
    with open(f, "a") as fh:
        fh.write('{"example_id": "q3", "status": "o')  # a write cut short by a kill
    before = f.read_bytes()
    df = load_results([root])
    assert len(df) == 30 and f.read_bytes() == before
    assert not df.duplicated(["config_hash", "example_id"]).any()


def test_the_closing_sentence_names_the_middle_the_penalty_uses(tmp_path):
    from litm.plots import describe_curve

    df = load_results(_synthetic(tmp_path / "r", {0: 0.8, 3: 0.6, 6: 0.2, 9: 0.9}, n=40))
    acc = {p: df[df.position == p].correct.mean() for p in (0, 3, 6, 9)}
    text = describe_curve(df)
    edges, middle = (acc[0] + acc[9]) / 2, (acc[3] + acc[6]) / 2  # four positions: the middle is the two central
    assert (f"The edges (positions 1 and 10) average {100 * edges:.0f}% against {100 * middle:.0f}% in the middle "
            f"(positions 4 and 7): a middle penalty of {100 * (edges - middle):+.1f} points, 95% CI [") in text
    assert text.startswith("Primary measure, accuracy") and text.endswith("n = 40 paired questions.")
    assert analyse(df)[0].penalty.value == pytest.approx(edges - middle)
    assert "weakest" not in text and f"{100 * min(acc[3], acc[6]):.0f}% in the middle" not in text


def _hand_table():
    """Four questions at positions 0, 4, 9 and the oracle, with every measure written out by hand."""
    import pandas as pd

    margins = {0: [2.0, 1.0, -1.0, 0.5], 4: [-1.0, -2.0, 0.5, -0.5], 9: [1.5, 0.5, 1.0, -0.25], None: [3, 2, 2.5, 1.0]}
    rows = []
    for pos, ms in margins.items():
        for i, m in enumerate(ms):
            rows.append({"example_id": f"q{i}", "condition": "oracle" if pos is None else "documents",
                         "position": pos, "status": "ok", "scoring": "choice", "correct": m > 0,
                         "gold_loglik": -4.0 + m, "gold_margin": m, "prompt_tokens": 100})
    return pd.DataFrame(rows), margins


def test_position_curve_draws_accuracy_and_the_margin_side_by_side_from_a_hand_made_table(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from litm.plots import position_curve, save_figure
    from scipy import stats as st
    from statsmodels.stats.proportion import proportion_confint

    df, margins = _hand_table()
    fig = position_curve(df, chance=0.25)
    ax, bx = fig.axes
    acc = [np.mean(np.array(margins[p]) > 0) for p in (0, 4, 9)]
    assert list(ax.lines[0].get_xdata()) == [1, 5, 10] and ax.lines[0].get_ydata() == pytest.approx(acc)
    assert bx.lines[0].get_ydata() == pytest.approx([np.mean(margins[p]) for p in (0, 4, 9)])
    band = {round(y, 9) for y in ax.collections[0].get_paths()[0].vertices[:, 1]}
    for p in (0, 4, 9):  # the Wilson band, from statsmodels
        k = int(np.sum(np.array(margins[p]) > 0))
        assert {round(v, 9) for v in proportion_confint(k, 4, method="wilson")} <= band
    band = {round(y, 9) for y in bx.collections[0].get_paths()[0].vertices[:, 1]}
    for p in (0, 4, 9):  # the t band, from scipy
        lo, hi = st.t.interval(0.95, 3, loc=np.mean(margins[p]), scale=st.sem(margins[p]))
        assert {round(lo, 9), round(hi, 9)} <= band
    oracle = [ln for ln in bx.lines if ln.get_label() == "oracle"]
    assert oracle and oracle[0].get_ydata()[0] == pytest.approx(np.mean(margins[None]))
    assert "margin" in bx.get_ylabel() and "accuracy" in ax.get_ylabel().lower()
    assert len(position_curve(df, measure="loglik").axes) == 2
    assert len(position_curve(df.assign(correct=None, gold_margin=None)).axes) == 1  # log-likelihood scoring
    png, pdf = save_figure(fig, "two-panel", tmp_path)
    assert png.stat().st_size > 1000
    first = (png.read_bytes(), pdf.read_bytes())
    time.sleep(1.1)  # a creation date would now differ by a second
    save_figure(fig, "two-panel", tmp_path)
    assert (png.read_bytes(), pdf.read_bytes()) == first  # the same figure, the same bytes


def test_the_margin_is_the_gold_loglik_minus_the_best_other_candidates_by_another_route(tiny_lm, tmp_path):
    from litm.experiment import load_examples, prompt_for
    from litm.runner import candidates, loglik

    cfg = SweepConfig(task="qa", num_docs=4, positions=(0, 3), limit=3, sentences_per_doc=2, closedbook=False,
                      oracle=False, results_dir=str(tmp_path), progress=False)
    df = sweep(cfg, tiny_lm)
    for e in load_examples(cfg):
        cands, gold = candidates(e)
        for pos in (0, 3):
            prompt = prompt_for(e, "documents", pos, cfg, tiny_lm.tokenizer)
            each = [s.gold_loglik for s in loglik(tiny_lm, [prompt] * len(cands), cands, batch_size=1)]
            margin = each[gold] - max(v for j, v in enumerate(each) if j != gold)
            (rec,) = df[(df.example_id == e.id) & (df.position == pos)].to_dict("records")
            assert rec["gold_margin"] == pytest.approx(margin, abs=1e-4) and rec["correct"] == (rec["gold_margin"] > 0)



def test_the_position_length_sentence_reads_the_u_term_and_its_change_with_length():
    import pandas as pd

    # planted coefficients: a clear U (interval above 0) whose change with length straddles 0
    table = pd.DataFrame({"estimate": [1.5, 0.2], "ci_low": [0.5, -0.4], "ci_high": [2.5, 0.8], "p": [0.003, 0.51]},
                         index=["I(depth ** 2)", "I(depth ** 2):length_k"])
    text = position_length_line(table, questions=40)
    assert "40 questions" in text and "+1.50 [+0.50, +2.50], p = 0.003, a U at this length" in text
    assert "+0.20 [-0.40, +0.80], p = 0.51: these prompts cannot tell whether the U changes" in text
    deeper = table.assign(ci_low=[-1.0, 0.1], ci_high=[4.0, 0.3])
    assert "no U that the interval can tell" in position_length_line(deeper, questions=40)
    assert "the U deepens as the prompt grows" in position_length_line(deeper, questions=40)
    few = position_length_line(deeper, questions=3)  # three clusters: the sandwich interval is not read
    assert "not to be read" in few and "deepens" not in few and "GRID_LIMIT to 30" in few
