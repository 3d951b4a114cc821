"""The verdict of a diagnosis: seven stated rules (gold missing; three position patterns: lost in the middle,
primacy, recency; wrong everywhere; interference; length), each with its evidence and a next step, and the
comparison of two models on the same cases.

The position rules read the study's primary measure, stated before the run: under forced choice the gold's
margin keeps how close each choice was, so a handful of cases can show a pattern that right/wrong outcomes
cannot (a model right 0/0/0/0/50% across depths on four cases shows no significant accuracy effect).  Each
also asks that the model be right at least `EDGE_MIN` of the time where its pattern puts the gold best
(accuracy), so a pattern in how wrong a model is is not called a position failure.  The other rules read
accuracy, wrong-source and abstention rates."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import stats
from ..report import compare_tables
from .analysis import case_table, measures, placement_effects

MISSING_SHARE = 0.2  # gold missing from at least this share of the prompts: packing or truncation
EDGE_MIN = 0.5  # position: where the pattern puts the gold best (edges, first or last) at least this accurate
WRONG_MAX = 0.25  # wrong everywhere: no placement above this accuracy
APART_MIN = 0.5  # interference: with no conflicting neighbour at least this accurate
LENGTH_BASE_MIN = 0.5  # length: the case's own length at least this accurate


@dataclass
class Rule:
    name: str
    fired: bool | None  # None: not testable with this design or data
    rule: str
    evidence: str
    next_step: str


@dataclass
class Diagnosis:
    model: str
    records: object  # DataFrame, one row per prompt
    measures: object  # DataFrame (`measures`)
    penalty: stats.Estimate | None  # the primary measure's adjusted middle penalty
    rules: list[Rule] = field(default_factory=list)
    primary: str = "accuracy"  # the measure the position rules read
    effects: dict = field(default_factory=dict)  # measure name -> `placement_effects` (or None), primary first

    @property
    def verdict(self) -> list[str]:
        return [r.name for r in self.rules if r.fired]


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.0f}%"


def _ci(e: stats.Estimate, m: str | stats.Measure = "accuracy") -> str:
    m = stats.measure(m)
    return (f"{m.format(e.value, True)} {m.unit} [{m.format(e.low, True)}, {m.format(e.high, True)}], "
            f"p = {e.p_value:.3g}")


def position_rules(eff: dict | None, acc: dict | None, m: stats.Measure, cases: int) -> list[Rule]:
    """The three position patterns on measure `m`'s placement effects (`eff`), gated by accuracy's (`acc`):
    lost in the middle (the middle below each edge), and where it is not, primacy or recency (the trend over
    depth, falling or rising).  Not testable without 2 cases and 3 placements with the gold."""
    if eff is None:
        why = (f"not testable: {cases} cases with the gold in the prompt at every placement (needs 2 cases and 3 "
               "placements)")
        fired, evidence = [None] * 3, [why] * 3
    else:
        first, last, trend, values = eff["first"], eff["last"], eff["trend"], acc["values"]
        shape = (f"{m.label} by depth ({eff['note']}): " + ", ".join(
            f"{100 * d:.0f}% {m.format(v, True)}" for d, v in zip(eff["depths"], eff["values"])) + f" {m.unit}"
            + ("" if m.name == "accuracy" else "; accuracy, adjusted alike, " + ", ".join(_pct(v) for v in values)))
        middle = first.low > 0 and last.low > 0 and acc["edges"] >= EDGE_MIN
        fired = [middle, not middle and trend.high < 0 and values[0] >= EDGE_MIN,
                 not middle and trend.low > 0 and values[-1] >= EDGE_MIN]
        sloped = f"{shape}; trend from the first depth to the last {_ci(trend, m)} over {trend.n} cases"
        evidence = [f"{shape}; first minus middle {_ci(first, m)}, last minus middle {_ci(last, m)}, middle penalty "
                    f"{_ci(eff['penalty'], m)}, over {first.n} cases", sloped, sloped]
    cut = "or cut the number of documents."
    return [
        Rule("position: lost in the middle (U-shape)", fired[0],
             f"the middle is below each edge on the {m.label} (each edge minus the middle has a 95% t interval "
             f"over cases above 0, adjusted for a conflicting neighbour) and the edges are at least "
             f"{_pct(EDGE_MIN)} accurate", evidence[0],
             "put the best evidence first or last (reorder, e.g. u_shape / langchain in notebook 04), repeat the "
             "question after the documents, " + cut),
        Rule("position: primacy (falls with depth)", fired[1],
             f"not lost in the middle; the trend over depth on the {m.label} (least-squares slope on the gold's "
             f"relative depth, first depth to last, adjusted for a conflicting neighbour) has a 95% t interval "
             f"over cases below 0, and the first placement is at least {_pct(EDGE_MIN)} accurate", evidence[1],
             "put the best evidence first (rank order), keep the prompt's start for the documents that matter, "
             + cut),
        Rule("position: recency (rises with depth)", fired[2],
             f"not lost in the middle; the trend over depth on the {m.label} has a 95% t interval over cases above "
             f"0, and the last placement is at least {_pct(EDGE_MIN)} accurate", evidence[2],
             "put the best evidence last, next to the question (reverse rank order, notebook 04), repeat the "
             "question after the documents, " + cut)]


def diagnose(df, primary: str = "accuracy") -> Diagnosis:
    """Measures, the placement effects of every measure the records hold (`primary` first; the position rules
    read it, the others accuracy) and the verdict rules for one model's records."""
    m = measures(df)
    docs = df[df["condition"] == "documents"]
    base = docs[docs["length"] == 1]
    ok_base = base[(base["status"] == "ok") & base["gold_in_prompt"]]
    rules = []

    missing = 1 - float(docs["gold_in_prompt"].mean())
    rules.append(Rule(
        "gold missing from the prompt (packing or truncation, not position)", missing >= MISSING_SHARE - 1e-9,
        f"the gold is missing from at least {_pct(MISSING_SHARE)} of the prompts with documents",
        f"gold missing from {_pct(missing)} of {len(docs)} prompts" + "".join(
            f"; {r['condition']} {_pct(1 - r['gold_in_prompt'])}" for _, r in m[m["placement"].notna()].iterrows()
            if r["gold_in_prompt"] < 1),
        "raise the context budget, compress or drop low-ranked documents before packing, or put the best-ranked "
        "documents first so truncation cuts the weakest ones."))

    first = stats.primary_measure(ok_base, primary)
    effects = {x.name: placement_effects(ok_base, x.column)
               for x in [first] + [x for x in stats.measures_in(ok_base) if x != first]}
    eff = effects["accuracy"]
    position = position_rules(effects[first.name], eff, first, ok_base["case_id"].nunique())
    rules += position
    position_fired = any(r.fired for r in position)

    by_place = ok_base.groupby("placement")["correct"].mean()
    oracle_acc = float(df.loc[(df["condition"] == "oracle") & (df["status"] == "ok"), "correct"].mean())
    fired = float(by_place.max()) <= WRONG_MAX if len(by_place) else None
    rules.append(Rule(
        "wrong everywhere (evidence, question or reasoning, not position)", fired,
        f"no placement is more than {_pct(WRONG_MAX)} accurate",
        (f"accuracy by placement {', '.join(_pct(v) for v in by_place)}; oracle (gold alone) {_pct(oracle_acc)}"
         if len(by_place) else "not testable: no scored prompt with the gold"),
        ("even the gold alone fails: check that the gold document really states the answer in words the question "
         "uses, that the accepted answers are complete, and whether the model can do this task (try a larger one)."
         if oracle_acc != oracle_acc or oracle_acc <= WRONG_MAX else
         "the gold alone works but not among the other documents: filter or rerank distractors, or shorten the "
         "context.")))

    adj = eff["adjacent"] if eff else None
    if adj is not None:
        near = ok_base["conflict_adjacent"].astype(bool)
        apart = float(ok_base.loc[~near, "correct"].mean())
        fired = adj.high < 0 and apart >= APART_MIN  # may fire beside position: both can be at work
        evidence = (f"accuracy {_pct(apart)} with no conflicting neighbour, "
                    f"{_pct(float(ok_base.loc[near, 'correct'].mean()))} next to one; effect of a conflicting "
                    f"neighbour at the same placement {_ci(adj)} over {adj.n} cases")
    else:
        fired = None
        evidence = "not testable: " + (eff["note"] if eff else "too few cases or placements with the gold")
    kinds = ok_base.loc[ok_base["wrong_source"].astype(bool), "wrong_source_kind"].value_counts()
    if len(kinds):
        evidence += "; wrong-source answers came from: " + ", ".join(f"{k} {v}" for k, v in kinds.items())
    rules.append(Rule(
        "interference from a conflicting document", fired,
        f"at least {_pct(APART_MIN)} accurate with no conflicting document next to the gold, significantly less "
        "accurate with one next to it at the same placement (t interval over cases)",
        evidence,
        "remove superseded versions at indexing time, filter by metadata (region, role, date) before retrieval, "
        "or tell the model how to resolve conflicts (newest version wins) in the instruction."))

    lengths = sorted(docs["length"].unique())
    fired, evidence = None, "not testable: one length only (run with lengths=(1, 2))"
    if len(lengths) > 1:
        long = int(lengths[-1])
        okl = docs[(docs["status"] == "ok") & docs["gold_in_prompt"]]
        wide = okl.pivot_table(index="case_id", columns="length", values="correct", aggfunc="mean")
        wide = wide.reindex(columns=[1, long]).dropna()
        evidence = "not testable: fewer than 2 cases scored at both lengths"
        if len(wide) >= 2:
            tl = stats.PairedTable(tuple(wide.index), (1, long), wide.to_numpy().astype(float))
            diff = stats.difference(tl, 1, long)
            base_acc = float(tl.column(1).mean())
            fired = diff.low > 0 and base_acc >= LENGTH_BASE_MIN and not position_fired
            evidence = (f"accuracy {_pct(base_acc)} at the cases' own length, {_pct(float(tl.column(long).mean()))} "
                        f"at x{long}; difference {_ci(diff)} over {len(tl.ids)} cases")
    rules.append(Rule(
        "length, not position", fired,
        f"at least {_pct(LENGTH_BASE_MIN)} accurate at the cases' own length, significantly less accurate at the "
        "longest (paired t interval over cases), and no position sensitivity at the own length",
        evidence,
        "send fewer or shorter documents (compression, notebook 05), or use a model trained for longer contexts."))
    e = effects[first.name]
    return Diagnosis(str(df["model"].iloc[0]) if "model" in df and len(df) else "", df, m,
                     e["penalty"] if e else None, rules, first.name, effects)


def compare_models(a: Diagnosis, b: Diagnosis):
    """Do two models differ in their position profile on the same cases?  (`report.compare_tables` on
    each case's accuracy by placement.)"""
    return compare_tables(case_table(a.records), case_table(b.records), a.model, b.model,
                          unit="points", what="cases", where="placements")

