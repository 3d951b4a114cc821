"""Reports and comparisons from stored results; the position x length grid."""
import json

import numpy as np
import pytest

from litm import SweepConfig, sweep
from litm.cli import main
from litm.errors import ConfigError, StatsError
from litm.experiment import Sweep, depth_positions, grid
from litm.report import analyse, compare, load_results, write_report
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
    out = write_report([tmp_path / "res"], tmp_path / "rep", n_boot=500)
    md = (tmp_path / "rep" / "report.md").read_text()
    tex = (tmp_path / "rep" / "report.tex").read_text()
    assert r"\begin{tabular}" in tex and r"\bottomrule" in tex
    assert len(out["figures"]) == 2 and all(p.is_file() for p in out["figures"])
    for pos in (0, 2, 4):  # accuracy per position, computed here from the raw records
        acc = df[(df.condition == "documents") & (df.position == pos)].correct.mean()
        assert f"| gold at {pos + 1} | 8 | 0 | {100 * acc:.1f} |" in md
    acc = {p: df[(df.condition == "documents") & (df.position == p)].correct.mean() for p in (0, 2, 4)}
    (rep,) = out["reports"]
    assert rep.penalty.value == pytest.approx((acc[0] + acc[4]) / 2 - acc[2])
    assert {t.name.split(":")[0] for t in rep.tests} == {"Cochran's Q", "McNemar exact"}
    assert "smollm2" not in md and str(tiny_lm.name) in md
    assert analyse(df, n_boot=200)[0].sweep_id == rep.sweep_id, "a sweep() table and its stored records agree"


def test_report_keeps_sweeps_apart(tmp_path):
    _synthetic(tmp_path / "r", {0: 0.9, 4: 0.5, 9: 0.9}, seed=1)
    _synthetic(tmp_path / "r", {0: 0.5, 4: 0.5, 9: 0.5}, seed=2, num_docs=12)
    reports = analyse(load_results([tmp_path / "r"]), n_boot=500)
    assert len(reports) == 2 and {r.config["num_docs"] for r in reports} == {10, 12}
    other = ResultStore(tmp_path / "r", "strategies1234ab", {**IDENTITY, "kind": "strategies"}, key="example_id",
                        condition=("arrangement", "variant"))
    other.append({"example_id": "q0", "condition": "rank|after", "position": None, "status": "ok", "correct": True})
    assert len(analyse(load_results([tmp_path / "r"]), n_boot=500)) == 2, "another study's runs are not sweeps"
    with pytest.raises(StatsError, match="no position-sweep records"):
        load_results([other.dir])


def test_compare_flags_a_regression_and_exits_nonzero(tmp_path, capsys):
    a = _synthetic(tmp_path / "a", {0: 0.8, 4: 0.8, 9: 0.8}, n=150, seed=3)
    b = _synthetic(tmp_path / "b", {0: 0.8, 4: 0.3, 9: 0.8}, n=150, seed=4, model="other-model")
    result = compare(a, b, n_boot=2000)
    assert result.verdict == "regression"
    assert result.penalty_change.low > 0 and result.differences == {"model": ("smollm2-135m", "other-model")}
    assert main(["compare", str(a), str(b), "--n-boot", "1000"]) == 1
    assert "verdict: regression" in capsys.readouterr().out
    assert main(["compare", str(b), str(a), "--n-boot", "1000"]) == 0  # the other way round it improved
    assert compare(a, a, n_boot=1000).verdict == "no significant difference"


def test_compare_refuses_mixed_or_unpaired_runs(tmp_path):
    a = _synthetic(tmp_path / "a", {0: 0.8, 4: 0.5, 9: 0.8})
    mixed = _synthetic(_synthetic(tmp_path / "m", {0: 0.8, 4: 0.5, 9: 0.8}), {0: 0.8, 4: 0.5, 9: 0.8}, num_docs=12)
    with pytest.raises(StatsError, match="mixes 2 different configs"):
        compare(a, mixed)
    other = _synthetic(tmp_path / "o", {0: 0.8, 4: 0.5, 9: 0.8}, num_docs=12)
    with pytest.raises(StatsError, match="num_docs"):
        compare(a, other)
    assert compare(a, other, different_configs=True, n_boot=500).differences == {"num_docs": (10, 12)}
    fewer = _synthetic(tmp_path / "f", {0: 0.8, 4: 0.5, 9: 0.8}, n=40, model="x")
    with pytest.raises(StatsError, match="not paired"):
        compare(a, fewer)
    with pytest.raises(StatsError, match="no results"):
        load_results([tmp_path / "nothing-here"])


def test_unpaired_conditions_in_one_sweep_are_an_error(tmp_path):
    root = _synthetic(tmp_path / "r", {0: 0.8, 4: 0.5, 9: 0.8}, n=20)
    f = next(p for p in root.glob("*/records.jsonl")
             if json.loads((p.parent / "manifest.json").read_text())["config"]["position"] == 4)
    f.write_text("\n".join(f.read_text().splitlines()[:10]) + "\n")
    with pytest.raises(StatsError, match="same questions"):
        analyse(load_results([root]))


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
            "(positions 4 and 7).") in text
    assert analyse(df, n_boot=200)[0].penalty.value == pytest.approx(edges - middle)
    assert "weakest" not in text and f"{100 * min(acc[3], acc[6]):.0f}% in the middle" not in text
