"""The strategies experiment end to end on the tiny model, its summaries against hand computations, and
prefix-cache reuse and prefill against cold prefill."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from litm import prefix, strategies as S
from litm.data import fictional_qa_records, generate_fictional_qa, shared_document_questions, write_jsonl
from litm.errors import ConfigError, DataError, StatsError
from litm.runner import candidates
from litm.prompts import Variant, render
from litm.types import Document, Example

CFG = S.StrategyConfig(pool=6, k=4, oracle_positions=(0, 3), variants=("after", "both"), limit=3,
                       sentences_per_doc=2, progress=False)


def test_conditions_cross_the_first_variant_only_unless_asked():
    assert CFG.conditions() == [("rank", "after"), ("reverse", "after"), ("u_shape", "after"),
                                ("langchain", "after"), ("random", "after"), ("gold@0", "after"),
                                ("gold@3", "after"), ("rank", "both")]
    assert len(replace(CFG, cross=True).conditions()) == 7 * 2


@pytest.mark.parametrize("kwargs, match", [
    ({"strategies": ("zigzag",)}, "zigzag"), ({"variants": ("loud",)}, "loud"), ({"retriever": "tfidf"}, "tfidf"),
    ({"k": 7}, "k=7"), ({"oracle_positions": (4,)}, "out of range"), ({"limit": None}, "limit"),
    ({"strategies": (), "oracle_positions": ()}, "nothing to run"),
])
def test_bad_configs_are_clear_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        replace(CFG, **kwargs)


def _retrieved(k=4):
    docs = tuple(Document(f"d{i}", f"T{i}", f"text {i}", is_gold=i == 5, answer=f"a{i}") for i in range(6))
    ex = Example("e", "q?", ("a5",), docs, "qa")
    return S.Retrieved(ex, docs[:k], gold_pool_rank=6)  # the retriever ranked the gold last: missed


def test_only_runs_the_named_conditions():
    assert S.only(CFG, ["rank|after", "langchain|after"]).conditions() == [("rank", "after"), ("langchain", "after")]
    assert S.only(CFG, ["rank|after", "rank|both"]).conditions() == [("rank", "after"), ("rank", "both")]
    assert S.only(CFG, ["gold@3|after", "reverse|after"]).conditions() == [("reverse", "after"), ("gold@3", "after")]
    assert set(S.only(CFG, ["rank|after", "u_shape|both"]).conditions()) == {
        ("rank", "after"), ("u_shape", "after"), ("rank", "both"), ("u_shape", "both")}
    with pytest.raises(ConfigError, match="'arrangement\\|variant'"):
        S.only(CFG, ["rank"])


def test_oracle_placement_brings_a_missed_gold_in_place_of_the_kth_document():
    r = _retrieved()
    assert [d.id for d in S.arranged(r, "gold@1", 0).documents] == ["d0", "d5", "d1", "d2"]
    assert [d.id for d in S.arranged(r, "reverse", 0).documents] == ["d3", "d2", "d1", "d0"]
    assert S.arranged(r, "random", 0).documents == S.arranged(r, "random", 0).documents


def test_run_on_the_tiny_model_records_every_condition_and_resumes(tiny_lm, tmp_path):
    cfg = replace(CFG, results_dir=str(tmp_path))
    df = S.run(cfg, tiny_lm)
    assert len(df) == 3 * len(cfg.conditions())
    assert df["status"].eq("ok").all() and df["gold_retrieved"].all()  # BM25 finds the invented name
    rev = df[df["condition"] == "reverse|after"]
    assert all(p == [3, 2, 1, 0] for p in rev["rank_positions"])
    lc = df[df["condition"] == "langchain|after"]  # k = 4, even: rank 1 last, rank 2 first
    assert all(p[:2] == [3, 0] for p in lc["rank_positions"])
    assert (df.loc[df["condition"] == "gold@3|after", "gold_index"] == 3).all()
    # the prompts are the ones the strategy names: rendered again by hand, they hash the same
    pools = S.load_pools(cfg)
    r = S.retrieve(pools[0], cfg)
    prompt = render(S.arranged(r, "u_shape", cfg.seed), tiny_lm.tokenizer, Variant(query_aware=True))
    row = df[(df["example_id"] == pools[0].id) & (df["arrangement"] == "u_shape")].iloc[0]
    assert row["prompt_sha256"] != prompt.manifest.sha256  # u_shape ran with the "after" variant
    prompt = render(S.arranged(r, "u_shape", cfg.seed), tiny_lm.tokenizer, Variant())
    assert row["prompt_sha256"] == prompt.manifest.sha256
    again = S.run(cfg, tiny_lm)
    assert again.sort_values(["condition", "example_id"])["latency_s"].tolist() == \
        df.sort_values(["condition", "example_id"])["latency_s"].tolist()


def test_attention_sorting_starts_from_the_retrievers_order_and_records_every_round(tiny_lm, tmp_path):
    from litm.attention_study import document_masses

    cfg = replace(CFG, strategies=("rank", "attention_sort"), oracle_positions=(), variants=("after",),
                  results_dir=str(tmp_path))
    df = S.run(cfg, tiny_lm).set_index("example_id")
    attend = document_masses(tiny_lm, Variant())
    for pool in S.load_pools(cfg):
        row = df[df["arrangement"] == "attention_sort"].loc[pool.id]
        orders = row["sort_orders"]
        ranked = [d.id for d in S.retrieve(pool, cfg).ranked]
        assert len(orders) == cfg.sort_rounds + 1 and orders[0] == ranked and row["doc_ids"] == orders[-1]
        by_id = {d.id: d for d in pool.documents}
        for before, after in zip(orders, orders[1:]):  # each round: ascending by the mass in the order before it
            mass = attend(replace(pool, documents=tuple(by_id[i] for i in before)))
            assert after == [before[i] for i in sorted(range(len(before)), key=lambda i: mass[i])]
    with pytest.raises(ConfigError, match="sort_rounds"):
        replace(CFG, sort_rounds=0)


def test_a_missed_gold_is_wrong_under_forced_choice_and_scored_otherwise(tiny_lm, tmp_path, monkeypatch):
    # a retriever that ranks the gold last, so the top k misses it
    monkeypatch.setattr(S, "retrieval_scores", lambda ex, name: [-1.0 if d.is_gold else 1.0 for d in ex.documents])
    cfg = replace(CFG, oracle_positions=(1,), variants=("after",), strategies=("rank",), results_dir=str(tmp_path))
    calls = []
    from litm import runner

    real_choice = runner.choice
    monkeypatch.setattr(runner, "choice", lambda lm, prompts, *a: calls.append(len(prompts)) or
                        real_choice(lm, prompts, *a))
    df = S.run(cfg, tiny_lm)
    missed = df[df["arrangement"] == "rank"]
    assert (~missed["gold_retrieved"]).all() and missed["gold_index"].isna().all()
    assert (missed["correct"] == False).all() and (missed["gold_pool_rank"] == 6).all()
    oracle = df[df["arrangement"] == "gold@1"]
    assert (oracle["gold_index"] == 1).all() and oracle["gold_loglik"].notna().all()
    assert sum(calls) == 3, "only the oracle prompts (which hold the gold) went to the model"
    loglik = S.run(replace(cfg, scoring="loglik", results_dir=str(tmp_path / "ll")), tiny_lm)
    assert loglik.loc[loglik["arrangement"] == "rank", "gold_loglik"].notna().all()  # the answer without evidence


def test_liu_files_need_loglik_or_generate(tiny_lm, tmp_path):
    path = write_jsonl(fictional_qa_records(2, 5, seed=3, sentences_per_doc=2), tmp_path / "pool.jsonl")
    cfg = replace(CFG, data=str(path), pool=5, k=3, retriever="bm25", variants=("after",), limit=None,
                  oracle_positions=(1,),
                  results_dir=str(tmp_path / "r"))
    with pytest.raises(ConfigError, match="forced choice"):  # Liu-format files carry no per-document answers
        S.run(cfg, tiny_lm)
    df = S.run(replace(cfg, scoring="loglik", strategies=("rank",), oracle_positions=()), tiny_lm)
    assert len(df) == 2 and df["gold_loglik"].notna().all()


def _records(values):
    rows = []
    for cond, outcomes in values.items():
        a, v = cond.split("|")
        for i, ok in enumerate(outcomes):
            rows.append({"example_id": f"q{i}", "condition": cond, "position": None, "arrangement": a, "variant": v,
                         "status": "ok", "correct": bool(ok), "gold_retrieved": True, "gold_index": 0,
                         "num_docs_shown": 4, "rank_positions": [0, 3, 1, 2] if a == "u" else [0, 1, 2, 3]})
    return pd.DataFrame(rows)


def test_summary_is_paired_against_the_baseline():
    df = _records({"r|after": [1, 1, 0, 0, 1, 0], "u|after": [1, 1, 1, 0, 1, 1]})
    s = S.summarize(df).set_index("condition")
    assert s.loc["r|after", "accuracy"] == pytest.approx(0.5) and s.loc["u|after", "accuracy"] == pytest.approx(5 / 6)
    e = S.effects(df).set_index("condition")
    assert list(e.index) == ["u|after"] and e.loc["u|after", "measure"] == "accuracy"
    assert e.loc["u|after", "diff"] == pytest.approx(2 / 6)
    assert e.loc["u|after", "mcnemar_p"] == pytest.approx(0.5)  # 2 discordant pairs, both one way: 2 * 0.5**2
    # t interval of the per-question differences 0, 0, 1, 0, 0, 1 (sd sqrt(4/15)), not the bootstrap's [0, 2/3]
    half = 2.5705818366 * (4 / 15) ** 0.5 / 6 ** 0.5  # t(5) 97.5% quantile
    assert (e.loc["u|after", "diff_low"], e.loc["u|after", "diff_high"]) == pytest.approx((1 / 3 - half, 1 / 3 + half))
    place = S.rank_placement(df, ranks=2).set_index(["arrangement", "rank"])
    assert place.loc[("u", 2), "after"] == 1.0 and place.loc[("r", 2), "before"] == 1.0
    assert (place.loc[("r", 1), "mean_position"], place.loc[("r", 1), "min_position"]) == (1.0, 1)
    with pytest.raises(StatsError, match="baseline"):
        S.effects(df, baseline="x|y")


# ----------------------------------------------------------------------------- prefix caching
def test_reuse_counts_the_longest_prefix_shared_with_any_earlier_prompt():
    r = prefix.reuse([[1, 2, 3, 4], [1, 2, 9, 9, 9], [1, 2, 3, 7], [5]])
    assert (r.total_tokens, r.reused_tokens) == (14, 0 + 2 + 3 + 0)
    assert prefix.reuse([[1, 2], [1, 2]]).reused_tokens == 1  # the last token always runs
    assert prefix.common_prefix([1, 2, 3], [1, 2]) == 2


def test_layouts_of_questions_sharing_documents():
    qs = shared_document_questions(generate_fictional_qa(1, 4, seed=1, sentences_per_doc=1)[0])
    assert [q.gold.id for q in qs] == [d.id for d in qs[0].documents]
    rel = [[1.0 if i == j else 0.1 * i for i in range(4)] for j in range(4)]  # question j: document j first
    ids = [d.id for d in qs[0].documents]
    static = prefix.layout(qs, "static", rel)
    assert all([d.id for d in q.documents] == ids for q in static)
    per = prefix.layout(qs, "per_query", rel)  # u_shape of each ranking: rank 1 first
    assert [q.documents[0].id for q in per] == [q.gold.id for q in qs]
    top = prefix.layout(qs, "static_dynamic_top", rel)
    assert all([d.id for d in q.documents] == ids + [q.gold.id + "#top"] for q in top)
    assert candidates(top[2]) == (candidates(qs[2])[0], 2)  # the repeated gold is one candidate, not two
    with pytest.raises(ConfigError, match="unknown layout"):
        prefix.layout(qs, "sideways", rel)
    with pytest.raises(DataError, match="generated fictional-QA"):
        shared_document_questions(Example("x", "q", ("a",), (Document("d", "Plain", "t", True, answer="a"),), "qa"))


def test_warm_prefill_reuses_the_cache_and_gives_the_same_logits(tiny_lm):
    qs = shared_document_questions(generate_fictional_qa(1, 3, seed=2, sentences_per_doc=2)[0])
    ids = [render(q, tiny_lm.tokenizer, Variant()).input_ids for q in qs]
    clock = iter(range(1000))  # every read of the clock one second later: each round's times are known
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prefix.time, "perf_counter", lambda: next(clock))
        t = prefix.timed_prefill(tiny_lm, ids)
    assert t.shared_tokens == min(prefix.common_prefix(ids[0], p) for p in ids) > 20
    assert t.max_logit_diff < 1e-4 and t.tolerance == 1e-4 and t.agrees
    assert t.repeats == 3 and t.cold_s == t.warm_s == 1  # medians of three timed rounds, each 1 s apart
    with pytest.raises(ConfigError, match="repeats"):
        prefix.timed_prefill(tiny_lm, ids, repeats=0)
    summary, rows = prefix.layout_study(tiny_lm, qs, np.eye(3).tolist(), time_first=2)
    assert list(summary["layout"]) == list(prefix.LAYOUTS) and len(rows) == 9
    assert summary.set_index("layout").loc["static", "reuse_fraction"] > summary.set_index("layout").loc[
        "per_query", "reuse_fraction"]


def test_strategy_figures_draw_from_tables(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from litm import plots

    df = _records({"r|after": [1, 0, 1], "u|after": [1, 1, 0], "gold@0|after": [1, 1, 1], "r|xml": [0, 0, 1]})
    layouts = pd.DataFrame({"layout": list(prefix.LAYOUTS), "accuracy": [0.2, 0.4, 0.5], "ci_low": [0.1, 0.2, 0.3],
                            "ci_high": [0.5, 0.6, 0.7], "reuse_fraction": [0.9, 0.1, 0.8], "speedup": [3.0, 1.0, 2.5]})
    for name, fig in {"acc": plots.strategy_accuracy(S.summarize(df), chance=0.25),
                      "place": plots.rank_placement(S.rank_placement(df)),
                      "reuse": plots.accuracy_vs_reuse(layouts)}.items():
        png, _ = plots.save_figure(fig, name, tmp_path)
        assert png.stat().st_size > 1000


def test_attention_retriever_and_cited_generations_on_the_tiny_model(tiny_lm, tmp_path):
    from litm.metrics import parse_citations

    cfg = replace(CFG, retriever="attention", strategies=("rank",), oracle_positions=(), variants=("cite",),
                  scoring="generate", max_new_tokens=6, limit=2, results_dir=str(tmp_path))
    df = S.run(cfg, tiny_lm)
    assert len(df) == 2 and df["gold_pool_rank"].between(1, 6).all()
    for _, r in df.iterrows():
        assert r["citations"] == parse_citations(r["prediction"])
        assert r["cited_gold"] == (r["gold_index"] is not None and r["gold_index"] == r["gold_index"]
                                   and int(r["gold_index"]) + 1 in r["citations"])
        assert r["supported"] == (r["correct"] and r["cited_gold"])


def test_shared_prefix_choice_scores_as_the_plain_pass_and_prefills_each_prefix_once(tiny_lm):
    from litm import runner
    from litm.experiment import SweepConfig, load_examples, prompt_for

    cfg = SweepConfig(task="qa", num_docs=6, positions=(0, 2, 5), limit=2, sentences_per_doc=2)
    prompts, cands, gold = [], [], []
    for e in load_examples(cfg):
        for p in cfg.positions:
            prompts.append(prompt_for(e, "documents", p, cfg, tiny_lm.tokenizer))
            c = candidates(e)
            cands.append(c[0])
            gold.append(c[1])
    plain = runner.choice(tiny_lm, prompts, cands, gold, batch_size=2)
    shared, stats = runner.shared_choice(tiny_lm, prompts, cands, gold)
    for a, b in zip(plain, shared):
        np.testing.assert_allclose(a.candidate_logliks, b.candidate_logliks, atol=1e-4)
        assert a.gold_rank == b.gold_rank
    seqs = [tuple(p.input_ids) for p in prompts]
    distinct_prefixes = len({s[:k] for s in seqs for k in range(1, len(s) + 1)})  # the trie's nodes
    assert stats.prefill_tokens == distinct_prefixes < stats.total_tokens == sum(map(len, seqs))


def test_strategy_and_compression_figures_show_paired_differences_on_a_continuous_measure(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from litm import compression_study as CS
    from litm import plots

    df = _records({"r|after": [1, 0, 1, 0], "u|after": [1, 1, 0, 1], "gold@0|after": [1, 1, 1, 1]})
    df["gold_margin"] = [0.5, -1.0, 0.2, -0.3, 0.9, 0.1, -0.2, 0.4, 2.0, 1.5, 1.0, 0.5]
    eff = S.effects(df)
    fig = plots.strategy_accuracy(S.summarize(df), effects=eff)
    _, bx = fig.axes
    diffs = bx.lines[0].get_xdata()  # bottom to top: the conditions after the baseline, in order
    want = [np.mean(df[df.condition == c].gold_margin.to_numpy() - df[df.condition == "r|after"].gold_margin.to_numpy())
            for c in ("u|after", "gold@0|after")]
    assert list(diffs) == pytest.approx(want)
    comp = pd.DataFrame([{"example_id": f"q{i}", "strategy": s, "budget": b, "position": p, "status": "ok",
                          "correct": m > 0, "gold_margin": m, "prompt_tokens": 300 if b else 700,
                          "answer_kept": True, "sentence_kept": True, "seconds": 0.0}
                         for i in range(3) for s, b in (("none", None), ("truncate", 250)) for p in (0, 9)
                         for m in [i - (0.5 if s == "truncate" else 0.0) + p / 9]])
    ceff = CS.effects(comp)
    row = ceff[ceff.measure == "margin"].iloc[0]
    assert row["arm"] == "truncate@250" and row["diff"] == pytest.approx(-0.5)
    fig = plots.accuracy_vs_kept_tokens(CS.summarize(comp), effects=ceff)
    assert len(fig.axes) == 2 and fig.axes[1].lines[0].get_xdata()[0] == pytest.approx(-0.5)


def test_sort_rounds_name_only_the_attention_sorting_runs():
    plain = S.Strategies(replace(CFG, strategies=("rank",)))
    both = S.Strategies(replace(CFG, strategies=("rank", "attention_sort")))
    rank = {"arrangement": "rank", "variant": "after"}
    assert plain.run_config({}, rank) == both.run_config({}, rank)  # adding attention sorting moves no other run
    sort = {"arrangement": "attention_sort", "variant": "after"}
    assert both.run_config({}, sort)["sort_rounds"] == 2
    assert both.run_config({}, sort) != S.Strategies(replace(CFG, strategies=("rank", "attention_sort"),
                                                            sort_rounds=3)).run_config({}, sort)
