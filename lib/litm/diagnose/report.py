"""The markdown report of a diagnosis (measures, verdict, comparison) and its figure."""
from __future__ import annotations

from pathlib import Path

from .. import stats
from .analysis import length_spread
from .design import DiagnoseConfig
from .verdict import Diagnosis, _pct


def position_lines(d: Diagnosis) -> list[str]:
    """The middle penalty and the trend over depth of each measure (adjusted for a conflicting neighbour, t
    intervals over cases), the primary one first."""
    lines = []
    for name, eff in d.effects.items():
        m = stats.measure(name)
        for key, what in (("penalty", "middle penalty (edges minus middle)"),
                          ("trend", "trend over depth (first depth to last)")):
            e = eff[key] if eff else None
            text = ("not estimable (needs 2 cases with the gold at 3 placements)" if e is None else
                    f"{m.format(e.value, True)} {m.unit}, 95% CI [{m.format(e.low, True)}, {m.format(e.high, True)}], "
                    f"n = {e.n} cases, p = {e.p_value:.3g}")
            lines.append(f"{'Primary: ' if name == d.primary else ''}{what}, {m.label} (adjusted for a conflicting "
                         f"neighbour, t interval over cases): {text}")
    return lines


def to_markdown(diagnoses: list[Diagnosis], config: DiagnoseConfig, comparison=None, figures=()) -> str:
    d0 = diagnoses[0]
    docs = d0.records[d0.records["condition"] == "documents"]
    rows = docs[docs["length"] == 1].groupby("case_id")["order"].nunique()
    spread = length_spread(d0.records)
    lines = [f"# Position diagnosis: {config.cases or 'cases'}", "",
             f"{docs['case_id'].nunique()} cases; gold at depths {', '.join(f'{100 * x:.0f}%' for x in config.depths)} "
             f"of the document region; {rows.min()}{'' if rows.min() == rows.max() else f'-{rows.max()}'} distractor orders (Latin-square rows) x "
             f"{len(config.seeds)} seed(s) per placement; lengths {', '.join(f'x{x}' for x in config.lengths)}; "
             f"template: {config.template or 'ours' + (' (asks for citations)' if config.cite else '')}; "
             f"{len(d0.records)} prompts per model.", "",
             f"Prompt length within a case, across placements and orders: at most {spread['tokens'].max():.0f} tokens "
             f"({100 * spread['share'].max():.1f}%) apart. Depth is set by the gold's slot among the documents; the table "
             "gives the token offset where the gold actually starts and its depth within the document region."]
    for d in diagnoses:
        lines += ["", f"## {d.model}", "", "### Measures by placement", "",
                  "| condition | x | n | accuracy [95% CI] | supported | wrong source | abstained | gold in prompt "
                  "| gold starts at token | depth in region | prompt tokens (min-max) |",
                  "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
        for _, r in d.measures.iterrows():
            start = "" if r["gold_token_start"] != r["gold_token_start"] else f"{r['gold_token_start']:.0f}"
            depth = "" if r["gold_region_depth"] != r["gold_region_depth"] else f"{r['gold_region_depth']:.2f}"
            lines.append(f"| {r['condition']} | {r['length']} | {r['n']} | {_pct(r['accuracy'])} [{_pct(r['ci_low'])}, "
                         f"{_pct(r['ci_high'])}] | {_pct(r['supported'])} | {_pct(r['wrong_source'])} | "
                         f"{_pct(r['abstained'])} | {_pct(r['gold_in_prompt'])} | {start} | {depth} | "
                         f"{r['prompt_tokens']:.0f} ({r['tokens_min']}-{r['tokens_max']}) |")
        lines += [""] + [f"- {line}" for line in position_lines(d)]
        lines += ["", "### Verdict", ""]
        lines.append(f"**{'; '.join(d.verdict) or 'no rule fired: no clear failure pattern at this sample size'}**")
        lines += ["", "| rule | fired | when it fires | evidence | next step |", "|---|---|---|---|---|"]
        for r in d.rules:
            state = {True: "**yes**", False: "no", None: "not testable"}[r.fired]
            lines.append(f"| {r.name} | {state} | {r.rule} | {r.evidence} | {r.next_step if r.fired else ''} |")
    if comparison is not None:
        lines += ["", "## Comparison of the two models", "", "```", comparison.text, "```"]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures if str(f).endswith(".png")]
    return "\n".join(lines) + "\n"


def write_report(diagnoses: list[Diagnosis], config: DiagnoseConfig, out_dir: str | Path, comparison=None) -> dict:
    """report.md and figures (accuracy and failure rates by placement, one line per model) in `out_dir`."""
    from ..plots import diagnosis_curves, save_figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = save_figure(diagnosis_curves([(d.model, d.measures) for d in diagnoses]), "diagnosis", out)
    text = to_markdown(diagnoses, config, comparison, figs)
    (out / "report.md").write_text(text, encoding="utf-8")
    return {"markdown": text, "figures": figs, "path": out / "report.md"}

