"""Paper-ready reports from stored results: tables (markdown, LaTeX), tests and figures; and `compare`,
which says whether two runs differ in their position profile (and can gate a CI pipeline)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import stats
from .errors import StatsError
from .experiment import summarize
from .store import read_manifest, read_records, study_config
from .study import config_hash

# Config fields that may differ between the two sides of a comparison without being said: the model goes
# with its weights.
_COMPARABLE = {"model", "chat", "weights"}


def _run_dirs(path: Path) -> list[Path]:
    return [path] if (path / "manifest.json").is_file() else sorted(p.parent for p in path.glob("*/manifest.json"))


def load_results(paths) -> "pd.DataFrame":
    """Records of every position-sweep run folder under `paths` (a run folder, or a folder of them), with
    its config; the runs of other studies there (strategies, compression, diagnosis) are left out.

    Adds `config_hash` (the run) and `sweep_id` (the run's config without its condition: the runs of
    one sweep share it).  Folders written before run configs held the model's run identity read the same.
    """
    import pandas as pd

    paths = [Path(x) for x in ([paths] if isinstance(paths, (str, Path)) else paths)]
    rows = []
    for p in paths:
        dirs = _run_dirs(p)
        if not dirs:
            raise StatsError(f"{p}: no results (no <hash>/manifest.json below it). Pass a results folder.")
        for d in dirs:
            manifest = read_manifest(d)
            cfg = dict(manifest["config"])
            if cfg.get("kind", "sweep") != "sweep":
                continue
            sweep_cfg = study_config(manifest)  # without the fields its manifest names as the condition
            sid = config_hash(sweep_cfg)
            for r in read_records(d / "records.jsonl", manifest.get("key", "example_id"))[0]:
                rows.append({**r, "model": cfg.get("model"), "task": cfg.get("task"),
                             "num_docs": cfg.get("num_docs"), "config_hash": d.name, "sweep_id": sid,
                             "sweep_config": json.dumps(sweep_cfg, sort_keys=True)})
    if not rows:
        raise StatsError(f"no position-sweep records under {', '.join(map(str, paths))}.")
    return pd.DataFrame(rows)


@dataclass
class SweepReport:
    """The numbers of one sweep: the per-condition summary (every measure) and, per measure with the primary
    one first, the middle penalty with its paired tests."""

    sweep_id: str
    config: dict
    summary: "pd.DataFrame"
    effects: list[stats.Effect]  # primary first; empty with fewer than three gold positions
    primary: stats.Measure
    n_questions: int  # paired questions under the primary measure
    dropped: int
    runs: list[str]

    @property
    def penalty(self) -> stats.Estimate | None:
        """The primary measure's middle penalty."""
        return self.effects[0].estimate if self.effects else None


def analyse(df, primary: str | None = None) -> list[SweepReport]:
    """One SweepReport per sweep found in `df` (from `load_results` or `sweep()`); `primary` names the
    measure to lead with (default: the first the records hold, see `stats.measures_in`)."""
    out = []
    for sid, g in df.groupby("sweep_id", sort=False):
        # the runs of one sweep may hold different questions (e.g. notebooks that share a folder with other
        # limits or positions): the paired analysis takes the questions run under every condition
        runs = g.groupby("example_id")["config_hash"].nunique()
        unrun = int((runs < g["config_hash"].nunique()).sum())
        g = g[g["example_id"].isin(runs[runs == g["config_hash"].nunique()].index)]
        first = stats.primary_measure(g, primary)
        held = [first] + [m for m in stats.measures_in(g) if m != first]
        tables = {m.name: stats.paired_table(g, m.column) for m in held}
        t = tables[first.name]
        positions = [c for c in t.conditions if isinstance(c, (int, np.integer))]
        effects = ([stats.middle_effect(tables[m.name], m) for m in held] if len(positions) >= 3
                   else [])
        out.append(SweepReport(sid, json.loads(g["sweep_config"].iloc[0]), summarize(g), effects, first,
                               len(t.ids), t.dropped + unrun, sorted(g["config_hash"].unique())))
    return out


def _cond_label(row) -> str:
    return f"gold at {int(row.position) + 1}" if row.condition == "documents" else row.condition


def _held(r: SweepReport) -> list[stats.Measure]:
    return [r.primary] + [m for m in stats.MEASURES.values() if m != r.primary and m.summary[0] in r.summary]


def effect_line(e: stats.Effect, what: str = "Middle penalty (edges minus middle)") -> str:
    """One sentence: an effect's estimate, interval, n and tests."""
    m, est = e.measure, e.estimate
    tests = "; ".join(f"{t.name} p = {t.p_value:.3g}" for t in e.tests)
    return (f"{what}, {m.label}: {m.format(est.value, True)} {m.unit}, 95% CI [{m.format(est.low, True)}, "
            f"{m.format(est.high, True)}], n = {est.n} questions (t interval, t-test p = {est.p_value:.3g}; "
            f"{tests}).")


def position_length_line(coefficients, questions: int, fewest: int = 30) -> str:
    """One sentence on `stats.position_length_model`'s table: the U term (depth squared; above 0 the middle
    does worse than both ends) and its change per 1,000 tokens, each with its 95% interval and p.  The intervals
    are cluster-robust, over `questions` clusters; below `fewest` that interval is too narrow to be read (a sandwich
    estimate needs tens of clusters), and the sentence says so instead of reading it."""
    def term(name):
        r = coefficients.loc[name]
        return f"{r['estimate']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}], p = {r['p']:.2g}"

    u, ux = "I(depth ** 2)", "I(depth ** 2):length_k"
    head = (f"Depth x length (logistic GEE, log-odds, clustered by question, {questions} questions): the U term "
            "(depth squared, centred depth, above 0 when the middle does worse than both ends) is ")
    if questions < fewest:
        return (head + f"{term(u)} and its change per 1,000 tokens {term(ux)}; with {questions} questions (clusters) "
                f"these cluster-robust intervals and p-values are not to be read (over so few clusters a sandwich "
                f"interval is too narrow; this grid is a demonstration: set GRID_LIMIT to {fewest} or more for a test).")
    shape, r = coefficients.loc[u], coefficients.loc[ux]
    at = ("a U at this length" if shape["ci_low"] > 0 else "an inverted U" if shape["ci_high"] < 0
          else "no U that the interval can tell from none")
    change = ("the U deepens as the prompt grows" if r["ci_low"] > 0 else "the U flattens as the prompt grows"
              if r["ci_high"] < 0 else "these prompts cannot tell whether the U changes with length")
    return head + f"{term(u)}, {at}; its change per 1,000 tokens is {term(ux)}: {change}."


def difference_line(effects, condition, baseline: str, measure: str, column: str = "condition") -> str:
    """One sentence for a row of `stats.versus_baseline`: the paired difference, its interval, n and tests."""
    m = stats.measure(measure)
    rows = effects[(effects[column] == condition) & (effects["measure"] == m.name)]
    if rows.empty:
        raise StatsError(f"no {m.label} difference for {condition!r}; the table holds "
                         f"{sorted(set(effects[column]))} on {sorted(set(effects['measure']))}.")
    r = rows.iloc[0]
    tests = "; ".join(f"{name} p = {r[col]:.3g}" for name, col in (("McNemar", "mcnemar_p"), ("Wilcoxon", "wilcoxon_p"))
                      if col in r and r[col] == r[col])
    return (f"{condition} minus {baseline}, {m.label}: {m.format(r['diff'], True)} {m.unit}, 95% CI "
            f"[{m.format(r['diff_low'], True)}, {m.format(r['diff_high'], True)}], n = {int(r['n'])} questions "
            f"(t interval, t-test p = {r['t_p']:.3g}; {tests}).")


def to_markdown(reports: list[SweepReport]) -> str:
    lines = ["# Position-sweep report", ""]
    for r in reports:
        c, held = r.config, _held(r)
        lines += [f"## {c.get('task')} · {c.get('model')} · {c.get('num_docs')} documents · {c.get('scoring')}", "",
                  f"Sweep `{r.sweep_id}`; {r.n_questions} paired questions"
                  + (f" ({r.dropped} left out: not run or not scored under every condition)" if r.dropped else "")
                  + f"; primary measure: {r.primary.label}.", ""]
        heads = [f"{m.label} ({'%' if m.binary else m.unit}) [95% CI]" for m in held]
        lines += ["| condition | n | too long | " + " | ".join(heads) + " |",
                  "| --- | ---: | ---: |" + " ---: |" * len(held)]
        for row in r.summary.itertuples():
            cells = [f"{m.format(getattr(row, v))} [{m.format(getattr(row, lo))}, {m.format(getattr(row, hi))}]"
                     for m in held for v, lo, hi in [m.summary]]
            lines.append(f"| {_cond_label(row)} | {row.n} | {row.too_long} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += [("- **" + effect_line(e) + "** (primary)") if i == 0 else "- " + effect_line(e)
                  for i, e in enumerate(r.effects)]
        lines += ["", f"Model: {c.get('model')}; runs (config hashes): {', '.join(r.runs)}", ""]
    return "\n".join(lines)


def to_latex(reports: list[SweepReport]) -> str:
    out = []
    for r in reports:
        c, held = r.config, _held(r)
        out += [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{lr" + "r" * len(held) + "}", r"\toprule",
                r"Condition & $n$ & " + " & ".join(m.label.capitalize() + (r" (\%)" if m.binary else f" ({m.unit})")
                                                   for m in held) + r" \\", r"\midrule"]
        for row in r.summary.itertuples():
            cells = [f"{m.format(getattr(row, v))} [{m.format(getattr(row, lo))}, {m.format(getattr(row, hi))}]"
                     for m in held for v, lo, hi in [m.summary]]
            out.append(f"{_cond_label(row)} & {row.n} & " + " & ".join(cells) + r" \\")
        if r.effects:
            out.append(r"\midrule")
            by = {e.measure.name: e.estimate for e in r.effects}
            cells = [f"{m.format(by[m.name].value, True)} [{m.format(by[m.name].low, True)}, "
                     f"{m.format(by[m.name].high, True)}]" if m.name in by else "" for m in held]
            out.append(f"Middle penalty & {r.effects[0].estimate.n} & " + " & ".join(cells) + r" \\")
        model = str(c.get("model")).replace("_", r"\_")
        tests = "; ".join(f"{e.measure.label}: " + ", ".join(f"{t.name} $p={t.p_value:.3g}$" for t in e.tests)
                          for e in r.effects)
        out += [r"\bottomrule", r"\end{tabular}",
                f"\\caption{{{c.get('task')}, {model}, {c.get('num_docs')} documents, {c.get('scoring')} scoring; "
                f"primary measure: {r.primary.label}. Wilson (accuracy) or $t$ (continuous) 95\\% intervals; middle "
                f"penalty (edges minus middle) paired over questions, $t$ interval. {tests}. "
                f"Sweep \\texttt{{{r.sweep_id}}}.}}}}", r"\end{table}", ""]
    return "\n".join(out)


def to_table(reports: list[SweepReport]):
    """The per-position numbers as one long table: a row per model x task x documents x condition x measure,
    with the value, its 95% interval (Wilson for accuracy, t for the others), n and the prompts too long to
    score; `position` is 1-based (empty for closed-book and oracle), `sweep_id` says which run it is."""
    import pandas as pd

    rows = []
    for r in reports:
        c = r.config
        for row in r.summary.itertuples():
            for m in _held(r):
                v, lo, hi = (getattr(row, col) for col in m.summary)
                rows.append({"model": c.get("model"), "task": c.get("task"), "num_docs": c.get("num_docs"),
                             "scoring": c.get("scoring"), "condition": row.condition,
                             "position": int(row.position) + 1 if row.condition == "documents" else None,
                             "measure": m.name, "unit": "share" if m.binary else m.unit, "value": v, "ci_low": lo,
                             "ci_high": hi, "n": row.n, "too_long": row.too_long, "primary": m == r.primary,
                             "sweep_id": r.sweep_id})
    table = pd.DataFrame(rows)
    if len(table):
        table["position"] = table["position"].astype("Int64")
    return table


def write_report(paths, out_dir: str | Path = "reports", primary: str | None = None) -> dict:
    """Analyse results and write report.md, report.tex, report.csv (`to_table`: the per-position numbers) and
    one position-curve figure per sweep."""
    import matplotlib.pyplot as plt

    from .plots import position_curve, save_figure

    df = load_results(paths)
    reports = analyse(df, primary=primary)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, tex = to_markdown(reports), to_latex(reports)
    (out / "report.md").write_text(md)
    (out / "report.tex").write_text(tex)
    to_table(reports).to_csv(out / "report.csv", index=False)
    figures = []
    for r in reports:
        g = df[df["sweep_id"] == r.sweep_id]
        fig = position_curve(g, title=f"{r.config.get('task')} - {r.config.get('model')}",
                             measure=None if r.primary.binary else r.primary.name,
                             unit="key-value pair" if r.config.get("task") == "kv" else "document")
        figures += save_figure(fig, f"position-curve-{r.sweep_id}", out)
        plt.close(fig)
    return {"markdown": md, "latex": tex, "csv": out / "report.csv", "figures": figures, "reports": reports}


# ----------------------------------------------------------------------------- compare
@dataclass
class Comparison:
    verdict: str  # "regression" | "improvement" | "no significant difference"
    penalty_change: stats.Estimate | None  # B's middle penalty minus A's
    mean_change: stats.Estimate  # B's mean over positions minus A's
    differences: dict  # config fields that differ between A and B
    n_questions: int
    text: str


def _one_sweep(df, side: str):
    if df["sweep_id"].nunique() != 1:
        raise StatsError(f"{side} mixes {df['sweep_id'].nunique()} different configs; pass the results of one "
                         "sweep per side (e.g. one --results folder per model).")
    return json.loads(df["sweep_config"].iloc[0])


def compare(a_paths, b_paths, different_configs: bool = False, level: float = 0.95,
            measure: str | None = None) -> Comparison:
    """Do runs A and B (same questions, same positions) differ in their position profile?

    Decided by paired t intervals over questions of the change in middle penalty and in the mean over the
    gold positions, on `measure` (default: accuracy, else the gold log-likelihood).  A regression is a
    significantly larger penalty or a significantly lower mean in B.
    """
    a, b = load_results(a_paths), load_results(b_paths)
    ca, cb = _one_sweep(a, "A"), _one_sweep(b, "B")
    diffs = {k: (ca.get(k), cb.get(k)) for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)}
    unsaid = {k: v for k, v in diffs.items() if k not in _COMPARABLE}
    if unsaid and not different_configs:
        raise StatsError(f"A and B differ in {sorted(unsaid)} ({unsaid}); compare runs that differ only in "
                         f"the model, or say so with different_configs=True (--different-configs).")
    a, b = a[a["condition"] == "documents"], b[b["condition"] == "documents"]
    m = stats.primary_measure(a, measure) if measure else None
    ta, tb = stats.paired_table(a, m and m.column), stats.paired_table(b, m and m.column)
    if set(ta.ids) != set(tb.ids) and not different_configs:
        raise StatsError(f"A and B are not paired: {len(ta.ids)} and {len(tb.ids)} questions, "
                         f"{len(set(ta.ids) & set(tb.ids))} in common. Run both on the same data, seed and limit.")
    return compare_tables(ta, tb, ca.get("model"), cb.get("model"), diffs, level)


def compare_tables(ta: "stats.PairedTable", tb: "stats.PairedTable", name_a, name_b, diffs: dict | None = None,
                   level: float = 0.95, unit: str | None = None,
                   what: str = "questions", where: str = "positions") -> Comparison:
    """`compare` on two paired tables (units x gold positions) of the same units: the change in middle
    penalty and in the mean over positions, B minus A, each unit's own change with a t interval over the
    common units."""
    diffs = diffs or {}
    if ta.conditions != tb.conditions:
        raise StatsError(f"A and B have different gold positions ({ta.conditions} vs {tb.conditions}).")
    common = sorted(set(ta.ids) & set(tb.ids))
    if len(common) < 2:
        raise StatsError(f"A and B are not paired: {len(ta.ids)} and {len(tb.ids)} {what}, {len(common)} "
                         "in common. Run both on the same data, seed and limit.")
    positions = list(ta.conditions)
    va, vb = (t.values[[t.ids.index(i) for i in common]] for t in (ta, tb))
    mean_change = stats.t_estimate(vb.mean(1) - va.mean(1), level)
    penalty_change = (stats.t_estimate((vb - va) @ stats.penalty_weights(positions, positions), level)
                      if len(positions) >= 3 else None)
    worse = (penalty_change is not None and penalty_change.low > 0) or mean_change.high < 0
    better = (penalty_change is not None and penalty_change.high < 0) or mean_change.low > 0
    verdict = "regression" if worse else "improvement" if better else "no significant difference"
    unit = unit or ("points" if ta.binary and tb.binary else "nats")
    scale = 100 if unit == "points" else 1
    lines = [f"A: {name_a}   B: {name_b}   ({len(common)} paired {what}, {where} "
             f"{[p + 1 for p in positions]})"]
    if diffs:
        lines.append("Configs differ in: " + ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in diffs.items()))
    for name, e in (("middle penalty, B - A", penalty_change), ("mean over positions, B - A", mean_change)):
        if e is not None:
            lines.append(f"{name}: {scale * e.value:+.1f} {unit}, {int(level * 100)}% CI [{scale * e.low:+.1f}, "
                         f"{scale * e.high:+.1f}] (paired t, p = {e.p_value:.3g})")
    lines.append(f"verdict: {verdict}"
                 + (" (decided by the interval that excludes 0 above)" if verdict != "no significant difference" else ""))
    return Comparison(verdict, penalty_change, mean_change, diffs, len(common), "\n".join(lines))
