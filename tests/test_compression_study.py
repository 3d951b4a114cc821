"""The compression study on the tiny model and its summaries against hand computations."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from litm import compression_study as CS
from litm.errors import ConfigError

CFG = CS.CompressionConfig(num_docs=4, positions=(0, 3), budgets=(300,), strategies=("truncate", "extractive"),
                           limit=2, sentences_per_doc=2, progress=False)


def test_conditions_and_bad_configs():
    assert CFG.conditions() == [("none", None, 0), ("none", None, 3), ("truncate", 300, 0), ("truncate", 300, 3),
                                ("extractive", 300, 0), ("extractive", 300, 3)]
    with pytest.raises(ConfigError, match="unknown compression strategies"):
        replace(CFG, strategies=("zip",))
    with pytest.raises(ConfigError, match="out of range"):
        replace(CFG, positions=(4,))


def test_run_records_survival_and_resumes(tiny_lm, tmp_path):
    cfg = replace(CFG, results_dir=str(tmp_path))
    df = CS.run(cfg, tiny_lm)
    assert len(df) == 2 * 6 and df["status"].eq("ok").all()
    none = df[df["strategy"] == "none"]
    assert none["answer_kept"].all() and none["sentence_kept"].all()
    assert (none["gold_position"] == none["position"]).all()  # uncompressed: the gold stays where it was put
    squeezed = df[df["strategy"] != "none"]
    assert (squeezed["prompt_tokens"] <= 300).all() and (none["prompt_tokens"] > 300).all()
    truncated_last = df[(df["strategy"] == "truncate") & (df["position"] == 3)]
    assert (~truncated_last["sentence_kept"]).all() and truncated_last["gold_position"].isna().all()
    assert (df["num_candidates"] == 4).all()  # every document's answer, whatever compression kept
    again = CS.run(cfg, tiny_lm)
    assert sorted(again["seconds"]) == sorted(df["seconds"])  # nothing recomputed
    with pytest.raises(ConfigError, match="larger than the model's window"):
        CS.run(replace(cfg, budgets=(10_000,)), tiny_lm)


def test_summaries_by_hand():
    rows = []
    for i, (s, b, p, ok, kept) in enumerate([("none", None, 0, 1, 1), ("none", None, 1, 0, 1),
                                             ("truncate", 100, 0, 1, 1), ("truncate", 100, 1, 0, 0),
                                             ("truncate", 100, 0, 0, 1), ("truncate", 100, 1, 1, 0)]):
        rows.append({"example_id": f"e{i}", "strategy": s, "budget": b, "position": p, "correct": bool(ok),
                     "sentence_kept": bool(kept), "answer_kept": bool(kept), "prompt_tokens": 100 + 10 * i,
                     "seconds": 0.5 * i})
    df = pd.DataFrame(rows)
    s = CS.summarize(df).set_index("strategy")
    assert s.loc["truncate", "accuracy"] == 0.5 and s.loc["truncate", "evidence_survival"] == 0.5
    assert s.loc["truncate", "accuracy_evidence_kept"] == 0.5 and s.loc["truncate", "accuracy_evidence_lost"] == 0.5
    assert s.loc["truncate", "prompt_tokens"] == pytest.approx((120 + 130 + 140 + 150) / 4) and s.loc["truncate", "seconds"] == 1.75
    assert s.loc["none", "n_evidence_lost"] == 0
    p = CS.by_position(df).set_index(["strategy", "position"])
    assert p.loc[("truncate", 0), "accuracy"] == 0.5 and p.loc[("none", 1), "accuracy"] == 0.0


def test_compression_figures_draw_from_tables(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from litm import plots

    rows = [{"example_id": f"e{i}", "strategy": s, "budget": b, "position": p, "correct": (i + p) % 2 == 0,
             "sentence_kept": i % 3 != 0, "answer_kept": True, "prompt_tokens": 100 + i, "seconds": 0.1}
            for i in range(3) for s, b in (("none", None), ("truncate", 100), ("truncate", 200)) for p in (0, 4)]
    df = pd.DataFrame(rows)
    summary = CS.summarize(df)
    for name, fig in {"tokens": plots.accuracy_vs_kept_tokens(summary, chance=0.1),
                      "survival": plots.evidence_survival_bars(summary),
                      "positions": plots.position_curves_by_strategy(CS.by_position(df), 100)}.items():
        png, _ = plots.save_figure(fig, name, tmp_path)
        assert png.stat().st_size > 1000


def test_evidence_survival_bars_draw_not_applicable_as_missing_not_zero():
    import matplotlib

    matplotlib.use("Agg")
    from litm import plots

    nan = float("nan")
    summary = pd.DataFrame({"strategy": ["none", "truncate", "extractive"], "budget": [None, 250, 250],
                            "evidence_survival": [1.0, 1.0, 0.4], "accuracy_evidence_kept": [0.5, 0.6, 0.0],
                            "accuracy_evidence_lost": [nan, nan, 0.25]})  # truncate never lost the evidence
    ax = plots.evidence_survival_bars(summary).axes[0]
    heights = [[p.get_height() for p in c] for c in ax.containers]
    assert heights[:2] == [[1.0, 0.4], [0.6, 0.0]]  # a real 0 stays a 0
    assert np.isnan(heights[2][0]) and heights[2][1] == 0.25
    labels = [t for t in ax.texts if t.get_text() == "n/a"]
    assert len(labels) == 1 and labels[0].get_position()[0] == pytest.approx(0 + 0.27)
