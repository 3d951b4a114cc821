"""Diagnosing a user's RAG cases: reading and validating cases, the Latin-square design, fixed prompt length,
the measures, and each verdict rule firing on a case built for it and on no other."""
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from litm import diagnose as dg
from litm.cli import main
from litm.errors import ConfigError, DataError
from litm.prompts import render
from litm.types import Document, Example

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "samples" / "rag_cases.jsonl"
TEMPLATE = ROOT / "data" / "samples" / "rag_template.txt"


def _case(i: int, n_docs: int = 6, adversarial: bool = False) -> dict:
    docs = [{"id": f"c{i}-gold", "title": f"Policy {i}", "version": "2", "date": "2024-01-01",
             "text": f"The allowance for team {i} is {10 + i} days per year."}]
    kinds = ["outdated", "other_region", "contradicting"] if adversarial else []
    for j in range(1, n_docs):
        kind = kinds[j - 1] if j - 1 < len(kinds) else None
        docs.append({"id": f"c{i}-d{j}", "title": f"Note {i}.{j}", "text": f"Unrelated note {j} about topic {i}.",
                     **({"kind": kind, "answer": f"{30 + j} days"} if kind else {})})
    return {"id": f"case{i}", "question": f"What is the allowance for team {i}?", "answers": [f"{10 + i} days"],
            "gold_id": f"c{i}-gold", "documents": docs}


def _write(tmp_path, records, name="cases.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return p


# ------------------------------------------------------------------------------------------ input
def test_sample_file_reads_and_metadata_goes_into_titles():
    cases = dg.read_cases(SAMPLE)
    assert len(cases) == 10 and len({c.id for c in cases}) == len(cases)  # 4 a pilot's, 6 a study's (notebook 07)
    pl = cases[4]
    assert pl.gold.id == "hr-pl-de-v3"
    assert pl.gold.title == "Parental Leave Policy (Germany) [version 3, 2024-01-01, HR handbook]"
    kinds = Counter(d.kind for c in cases for d in c.documents)
    assert kinds["outdated"] == kinds["other_region"] == kinds["contradicting"] == len(cases)


def test_a_datasets_table_reads_like_the_file():
    import datasets

    ds = datasets.load_dataset("json", data_files=str(SAMPLE), split="train")
    assert dg.read_cases(ds) == dg.read_cases(SAMPLE)


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.update(gold_id="nope"), "gold_id 'nope' is not among its documents"),
    (lambda r: r["documents"][2].pop("id"), "document #3: has no 'id'"),
    (lambda r: r.update(answers=[]), "'answers' must be a non-empty list"),
    (lambda r: r.pop("question"), "missing field 'question'"),
    (lambda r: r["documents"][1].update(id="c0-gold"), "appears twice"),
    (lambda r: r["documents"][1].update(kind="sneaky"), "kind 'sneaky'"),
])
def test_bad_cases_are_one_clear_error(tmp_path, mutate, message):
    r = _case(0)
    mutate(r)
    with pytest.raises(DataError, match=message) as exc:
        dg.read_cases(_write(tmp_path, [_case(1), r]))
    assert "cases.jsonl:2" in str(exc.value)


def test_template_without_placeholders_and_too_few_documents(tmp_path):
    t = tmp_path / "t.txt"
    t.write_text("Context:\n{search_results}\nAnswer:")
    with pytest.raises(ConfigError, match=r"lacks the placeholder\(s\) \{question\}"):
        dg.DiagnoseConfig(cases=str(SAMPLE), template=str(t))
    case = dg.read_cases(_write(tmp_path, [_case(0, n_docs=4)]))[0]
    with pytest.raises(DataError, match="has 4 documents.*at least 5 documents"):
        dg.design(case)
    assert len(dg.design(case, depths=(0.0, 0.5, 1.0))) == 3 * 3 + 2


# ----------------------------------------------------------------------------------------- design
@pytest.mark.parametrize("n_docs, depths", [(6, dg.DEPTHS), (9, dg.DEPTHS), (5, (0.0, 0.5, 1.0))])
def test_latin_square_puts_each_distractor_next_to_the_gold_equally_often(tmp_path, n_docs, depths):
    case = dg.read_cases(_write(tmp_path, [_case(0, n_docs)]))[0]
    trials = [t for t in dg.design(case, depths, seeds=(0, 1)) if t.condition == "documents"]
    distractors = {d.id for d in case.documents if not d.is_gold}
    per_placement = {}
    for t in trials:
        docs = t.example.documents
        assert docs[t.slot].is_gold and sorted(d.id for d in docs) == sorted(d.id for d in case.documents)
        per_placement.setdefault(t.placement, Counter()).update(d.id for d in dg.neighbours(t.example))
    assert len(per_placement) == len(depths)
    for p, counts in per_placement.items():
        assert set(counts) == distractors and len(set(counts.values())) == 1, (p, counts)
    totals = sum(per_placement.values(), Counter())
    assert len(set(totals.values())) == 1
    # the same rows (orders) at every placement, and each placement's gold on its own slot
    orders = {p: sorted((t.seed, t.order) for t in trials if t.placement == p) for p in per_placement}
    assert len({tuple(v) for v in orders.values()}) == 1
    assert len({t.slot for t in trials}) == len(depths)


def test_prompt_length_stays_within_tolerance_across_placements(tiny_lm):
    tol = 0.01  # stated in docs/diagnosis.md: prompts of one case differ by at most 1% across placements and orders
    for case in dg.read_cases(SAMPLE):
        for variant in (dg.DiagnoseConfig().variant(), dg.DiagnoseConfig(template=str(TEMPLATE)).variant()):
            lengths = [len(render(t.example, tiny_lm.tokenizer, variant).input_ids)
                       for t in dg.design(case) if t.condition == "documents"]
            assert (max(lengths) - min(lengths)) <= tol * min(lengths), (case.id, min(lengths), max(lengths))


def test_adversarial_copies_for_user_data():
    case = dg.read_cases(SAMPLE)[5]  # vpn-port
    plain = Example(case.id, case.question, case.answers, tuple(d for d in case.documents if d.kind is None), "qa")
    out = dg.with_adversarial(plain, ("outdated", "contradicting"), ["443", "1194", "8443", "22"])
    new = out.documents[len(plain.documents):]
    assert [d.kind for d in new] == ["outdated", "contradicting"]
    assert [d.answer for d in new] == ["1194", "8443"]  # "443" is the accepted answer: skipped
    assert new[0].text == case.gold.text.replace("443", "1194") and "superseded" in new[0].title
    with pytest.raises(DataError, match="appears verbatim"):
        dg.with_adversarial(Example("x", "q", ("absent",), (Document("g", "", "text", True),), "qa"), ("outdated",), ["y"])


def test_skip_leaves_the_pilots_cases_out_of_the_study():
    config = dg.DiagnoseConfig(cases=str(SAMPLE), limit=2, skip=4)
    every, chosen = dg.prepare_cases(config)
    assert [c.id for c in chosen] == ["parental-leave-de", "vpn-port"] and len(every) == 10
    assert {t.case_id for t in dg.trials_for(config, every, chosen)} == {"parental-leave-de", "vpn-port"}
    assert [c.id for c in dg.prepare_cases(dg.DiagnoseConfig(cases=str(SAMPLE), skip=8))[1]] == [
        "retention-us", "admin-passwords"]
    with pytest.raises(ConfigError, match="10 cases; skipping 10 leaves none"):
        dg.prepare_cases(dg.DiagnoseConfig(cases=str(SAMPLE), skip=10))


# ---------------------------------------------------------------------------------------- measures
@pytest.mark.parametrize("prediction, expected", [
    ("14 days [3]", dict(correct=True, supported=True, wrong_source=False, abstained=False)),
    ("14 days [1]", dict(correct=True, supported=False, wrong_source=False, abstained=False)),
    ("31 days [1]", dict(correct=False, supported=False, wrong_source=True, wrong_source_kind="outdated")),
    ("It is 99 days [2]", dict(correct=False, wrong_source=True, wrong_source_kind="distractor")),
    ("I don't know.", dict(correct=False, abstained=True, wrong_source=False)),
    ("The documents do not say; cannot determine.", dict(correct=False, abstained=True)),
    ("", dict(correct=False, abstained=True)),
])
def test_answers_are_scored_for_support_source_and_abstention(tmp_path, prediction, expected):
    case = dg.read_cases(_write(tmp_path, [_case(4, adversarial=True)]))[0]
    docs = list(case.documents)
    docs = [docs[1], docs[4], docs[0]] + docs[2:4] + docs[5:]  # outdated first, a plain distractor second, gold third
    got = dg.score_answer(prediction, Example(case.id, case.question, case.answers, tuple(docs), "qa"), True)
    for k, v in expected.items():
        assert got[k] == v, (k, got)


def test_forced_choice_candidates_and_scores(tmp_path):
    case = dg.read_cases(_write(tmp_path, [_case(2, adversarial=True)]))[0]
    cands, source = dg.choices(case)
    assert cands == ["12 days", "31 days", "32 days", "33 days", dg.ABSTAIN_ANSWER]
    assert dg.score_choice("32 days", case)["wrong_source_kind"] == "other_region"
    assert dg.score_choice(dg.ABSTAIN_ANSWER, case)["abstained"] and dg.score_choice("12 days", case)["correct"]


def test_the_trend_over_depth_is_each_cases_least_squares_slope_first_depth_to_last():
    import numpy as np
    import pandas as pd
    from scipy import stats as st

    rng = np.random.default_rng(3)
    depths = np.array(dg.DEPTHS)
    rows = pd.DataFrame([{"case_id": f"c{c}", "condition": "documents", "length": 1, "status": "ok",
                          "gold_in_prompt": True, "conflict_adjacent": False, "placement": p, "depth": d,
                          "order": o, "gold_margin": c * d + rng.normal()}
                         for c in range(5) for p, d in enumerate(depths) for o in range(2)])
    means = rows.pivot_table(index="case_id", columns="placement", values="gold_margin").to_numpy()
    slopes = np.array([np.polyfit(depths, m, 1)[0] * (depths[-1] - depths[0]) for m in means])
    penalties = (means[:, 0] + means[:, -1]) / 2 - means[:, 2]
    eff = dg.case_effects(rows, "gold_margin")
    assert np.allclose(eff["trend"], slopes) and np.allclose(eff["penalty"], penalties)
    # balanced, nothing to adjust for: the cluster-robust intervals are the t intervals of the cases' own values
    pe = dg.placement_effects(rows, "gold_margin")
    for key, values in (("trend", slopes), ("penalty", penalties), ("last", means[:, -1] - means[:, 2])):
        low, high = st.ttest_1samp(values, 0).confidence_interval(0.95)
        assert (pe[key].value, pe[key].low, pe[key].high) == pytest.approx((values.mean(), low, high)), key


# ----------------------------------------------------------------------------------------- verdict
def _fake_run(tiny_lm, tmp_path, monkeypatch, cases, decide, **cfg):
    """Run the whole pipeline on the tiny model's tokenizer with answers decided by `decide(item)`."""
    from litm import study
    from litm.runner import Scored

    def outcome(self, item, scored):
        right = item.prompt.manifest.gold_index is not None and decide(item)
        answer = item.example.answers[0] if right else "no idea"
        return {"prediction": answer, **dg.score_answer(answer, item.example, False)}

    monkeypatch.setattr(study, "score", lambda lm, prompts, *a: [Scored(prediction="") for _ in prompts])
    monkeypatch.setattr(dg.DiagnoseStudy, "outcome", outcome)
    config = dg.DiagnoseConfig(cases=str(_write(tmp_path, cases)), results_dir=str(tmp_path / "res"), progress=False,
                               **cfg)
    return dg.diagnose(dg.run(config, tiny_lm))


LAST = len(dg.DEPTHS) - 1
CONSTRUCTED = {
    "gold missing from the prompt (packing or truncation, not position)":
        (False, lambda it: True, {"max_prompt_tokens": "gold-cut"}),
    "position: lost in the middle (U-shape)": (False, lambda it: it.fields["placement"] in (0, LAST), {}),
    "position: primacy (falls with depth)": (False, lambda it: it.fields["placement"] == 0, {}),
    "position: recency (rises with depth)": (False, lambda it: it.fields["placement"] == LAST, {}),
    "wrong everywhere (evidence, question or reasoning, not position)": (False, lambda it: False, {}),
    "interference from a conflicting document":
        (True, lambda it: not any(d.kind for d in dg.neighbours(it.example)), {}),
    "length, not position": (False, lambda it: it.fields["length"] == 1, {"lengths": (1, 2)}),
}


@pytest.mark.parametrize("rule", list(CONSTRUCTED),
                         ids=["missing", "middle", "primacy", "recency", "wrong", "interference", "length"])
def test_each_verdict_rule_fires_on_its_case_and_no_other(tiny_lm, tmp_path, monkeypatch, rule):
    adversarial, decide, cfg = CONSTRUCTED[rule]
    cases = [_case(i, adversarial=adversarial) for i in range(4)]
    if cfg.get("max_prompt_tokens") == "gold-cut":  # a budget that keeps three or four of the six documents
        ex = dg.read_cases(_write(tmp_path, cases[:1], "one.jsonl"))[0]
        cfg = {"max_prompt_tokens": len(render(Example(ex.id, ex.question, ex.answers, ex.documents[:3], "qa"),
                                               tiny_lm.tokenizer, dg.DiagnoseConfig().variant()).input_ids) + 2}
    d = _fake_run(tiny_lm, tmp_path, monkeypatch, cases, decide, **cfg)
    fired = [r.name for r in d.rules if r.fired]
    assert fired == [rule], [(r.name, r.fired, r.evidence) for r in d.rules]


def test_cli_writes_a_report_for_two_models(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "report"
    code = main(["diagnose", str(SAMPLE), "--model", str(tiny_model_dir), "--second-model", str(tiny_model_dir),
                 "--template", str(TEMPLATE), "--limit", "2", "--depths", "0,0.5,0.95", "--orders", "2", "--seeds", "0",
                 "--max-new-tokens", "4", "--results", str(tmp_path / "res"), "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    md = (out / "report.md").read_text()
    assert "### Verdict" in md and "## Comparison of the two models" in md and "verdict:" in md
    assert "- Primary: trend over depth (first depth to last), accuracy" in md  # generation: the rules read accuracy
    assert "| 0% | 1 | 4 |" in md  # 2 cases x 2 orders at the first placement
    assert (out / "diagnosis.png").stat().st_size > 1000 and "wrote" in text


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    bad = _case(0)
    bad["gold_id"] = "missing"
    assert main(["diagnose", str(_write(tmp_path, [bad])), "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "gold_id 'missing'" in err and "Traceback" not in err
