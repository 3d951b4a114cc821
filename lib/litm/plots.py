"""Figures, drawn from results tables (never from a live model) and saved through `save_figure`."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .experiment import summarize
from .stats import edges_and_middle, measures_in, middle_penalty, paired_table, primary_measure, value_column
from .stats import measure as as_measure

FIGURES_DIR = Path(os.environ.get("LITM_FIGURES", "figures"))


def save_figure(fig, name: str, directory: str | Path | None = None) -> list[Path]:
    """Save `fig` as `<directory>/<name>.png` and `.pdf` (directory: LITM_FIGURES or ./figures)."""
    d = Path(directory) if directory is not None else FIGURES_DIR
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / f"{name}.{ext}" for ext in ("png", "pdf")]
    for p in paths:
        fig.savefig(p, dpi=150, bbox_inches="tight")
    return paths


def _finish(fig, title: str | None, ax=None):
    """Title the axes (or, without them, the figure), tighten the layout, return the figure."""
    if title:
        (ax.set_title if ax is not None else fig.suptitle)(title)
    fig.tight_layout()
    return fig


def _new_axes(ax, size):
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size) if ax is None else (ax.figure, ax)


def _continuous(df, measure=None):
    """The measure a second panel shows: `measure`, else the margin, else the gold log-likelihood (None
    when the records hold neither)."""
    if measure is not None:
        return primary_measure(df, measure)
    return next((m for m in reversed(measures_in(df)) if not m.binary), None)


def _axis_label(m, scoring: str) -> str:
    if m.binary:
        return "Forced-choice accuracy" if scoring == "choice" else "Accuracy"
    return {"margin": "Mean gold margin (nats)",
            "loglik": "Mean gold log-likelihood (nats)"}[m.name]


def position_curve(df, label_by: str | None = None, ax=None, title: str | None = None, chance: float | None = None,
                   measure: str | None = None):
    """Two panels against the gold position (1-based): accuracy with Wilson 95% bands, and a continuous
    measure with t 95% bands (`measure`, default the margin, else the gold log-likelihood), one line per
    value of `label_by`, closed-book and oracle as dashed and dotted lines.  Records holding one measure,
    or a given `ax`, get one panel (`measure` if given, else the first held)."""
    import matplotlib.pyplot as plt

    cont = _continuous(df, measure)
    panels = list(dict.fromkeys([m for m in measures_in(df) if m.binary] + ([cont] if cont else [])))
    if ax is not None:
        fig, axes, panels = ax.figure, [ax], [cont if measure else panels[0]]
    else:
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
        axes = list(axes[0])
    groups = [(None, df)] if label_by is None else list(df.groupby(label_by, sort=False))
    scoring = df["scoring"].iloc[0] if "scoring" in df else ""
    xs = sorted(int(p) + 1 for p in df.loc[df["condition"] == "documents", "position"].dropna().unique())
    for a, m in zip(axes, panels):
        y, lo, hi = m.summary
        for i, (label, g) in enumerate(groups):
            color = f"C{i}"
            s = summarize(g)
            docs = s[s["condition"] == "documents"].sort_values("position")
            x = docs["position"].astype(int).to_numpy() + 1
            a.plot(x, docs[y], marker="o", color=color, label=label if label is not None else "full context")
            a.fill_between(x, docs[lo], docs[hi], color=color, alpha=0.2)
            for cond, style in (("closedbook", "--"), ("oracle", ":")):
                row = s[s["condition"] == cond]
                if len(row) and y in row:
                    a.axhline(float(row[y].iloc[0]), color=color, linestyle=style, linewidth=1.2,
                              label=f"{cond}" + (f" ({label})" if label is not None else ""))
        if m.binary:
            if chance is not None:
                a.axhline(chance, color="grey", linewidth=0.8, linestyle="-.", label="chance")
            a.set_ylim(-0.02, 1.02)
        elif m.name == "margin":
            a.axhline(0, color="grey", linewidth=0.8, linestyle="-.", label="tie with the best other")
        a.set_xlabel("Position of the document with the answer (1 = first)")
        a.set_ylabel(_axis_label(m, scoring))
        if xs:
            a.set_xticks(xs)
        a.grid(alpha=0.3)
        a.legend(fontsize=8, loc="best")
    return _finish(fig, title, ax)


def describe_curve(df, primary: str | None = None) -> str:
    """The numbers behind a position curve, one sentence per measure with `primary` first (default: the
    first the records hold): each position and baseline, and the edges against the middle as the middle
    penalty defines them (`stats.edges_and_middle`), with its paired t interval and n."""
    s = summarize(df)
    first = primary_measure(df, primary)
    docs = s[s["condition"] == "documents"].sort_values("position")
    sentences = []
    for m in [first] + [m for m in measures_in(df) if m != first]:
        col = m.summary[0]
        fmt = (lambda v: f"{100 * v:.0f}%") if m.binary else (lambda v: f"{v:.2f}")
        parts = [f"position {int(r.position) + 1}: {fmt(r[col])} (n={r.n})" for _, r in docs.iterrows()]
        parts += [f"{r.condition}: {fmt(r[col])}" for _, r in s[s["condition"] != "documents"].iterrows()]
        text = f"{'Primary measure, ' if m == first else ''}{m.label} by gold position: " + ", ".join(parts)
        if len(docs) >= 3:
            value = dict(zip(docs["position"].astype(int), docs[col]))
            edges, middle = edges_and_middle(list(value))
            names = " and ".join(str(p + 1) for p in middle)
            est = middle_penalty(paired_table(df, m.column))
            text += (f". The edges (positions {edges[0] + 1} and {edges[1] + 1}) average "
                     f"{fmt(np.mean([value[p] for p in edges]))} against {fmt(np.mean([value[p] for p in middle]))} "
                     f"in the middle (position{'s' if len(middle) > 1 else ''} {names}): a middle penalty of "
                     f"{m.format(est.value, True)} {m.unit}, 95% CI [{m.format(est.low, True)}, "
                     f"{m.format(est.high, True)}], n = {est.n} paired questions")
        sentences.append(text + ".")
    return "\n".join(sentences)


def depth_length_heatmap(df, depths: int = 10, ax=None, title: str | None = None):
    """Needle-in-a-haystack style heatmap: rows are the gold's depth, columns the prompt length; cells are
    accuracy (or mean gold log-likelihood) at the position nearest that depth for that length."""
    import pandas as pd

    value = value_column(df)
    acc = value == "correct"
    ok = df[df["status"] == "ok"]
    lengths = sorted(ok["target_length"].unique())
    levels = [i / (depths - 1) for i in range(depths)]
    cells = pd.DataFrame(index=[f"{round(100 * d)}%" for d in levels], columns=lengths, dtype=float)
    for L in lengths:
        g = ok[ok["target_length"] == L]
        n = int(g["num_docs"].iloc[0])
        for d, label in zip(levels, cells.index):
            cells.loc[label, L] = g.loc[g["position"] == round(d * (n - 1)), value].astype(float).mean()
    fig, ax = _new_axes(ax, (1.4 * len(lengths) + 2.5, 5))
    im = ax.imshow(cells.to_numpy(dtype=float), aspect="auto", cmap="RdYlGn",
                   vmin=0 if acc else None, vmax=1 if acc else None)
    ax.set_xticks(range(len(lengths)), [str(int(L)) for L in lengths])
    ax.set_yticks(range(depths), cells.index)
    ax.set_xlabel("Prompt length (target, tokens)")
    ax.set_ylabel("Depth of the gold document")
    for (i, j), v in np.ndenumerate(cells.to_numpy(dtype=float)):
        if not np.isnan(v):
            ax.text(j, i, f"{100 * v:.0f}" if acc else f"{v:.1f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="Accuracy" if acc else "Mean gold log-likelihood")
    return _finish(fig, title, ax)


def attention_heatmap(trough_table, ax=None, title: str | None = None):
    """Layer x document-position heatmap from `attention_study.troughs(..., by_layer=True)`: each layer's
    mean attention per document divided by that layer's mean over positions (1 = the layer's average),
    so the shape across positions shows in every layer whatever its scale."""
    from matplotlib.colors import TwoSlopeNorm

    wide = trough_table.pivot(index="layer", columns="doc_position", values="mean").sort_index()
    rel = wide.div(wide.mean(axis=1), axis=0).to_numpy(dtype=float)
    fig, ax = _new_axes(ax, (0.45 * wide.shape[1] + 3, 0.16 * wide.shape[0] + 2))
    spread = max(float(np.nanmax(np.abs(rel - 1))), 1e-6)
    im = ax.imshow(rel, aspect="auto", origin="lower", cmap="RdBu_r",
                   norm=TwoSlopeNorm(vcenter=1.0, vmin=max(0.0, 1 - spread), vmax=1 + spread))
    ax.set_xticks(range(wide.shape[1]), [str(int(c) + 1) for c in wide.columns])
    ax.set_xlabel("Document position (1 = first)")
    ax.set_ylabel("Layer")
    fig.colorbar(im, ax=ax, label="Attention / the layer's mean over positions")
    return _finish(fig, title, ax)


def sink_strength(sink_table, ax=None, title: str | None = None):
    """Mean attention to token 0 (solid) and to the first four tokens (dashed) per layer, averaged over
    heads, one colour per prompt length (from `attention_study.sinks_by_length`)."""
    fig, ax = _new_axes(ax, (6.5, 4))
    for i, (n, g) in enumerate(sink_table.groupby("num_tokens")):
        by_layer = g.groupby("layer")[["first", "first_four"]].mean()
        ax.plot(by_layer.index, by_layer["first"], color=f"C{i}", marker=".", label=f"{n} tokens: token 0")
        ax.plot(by_layer.index, by_layer["first_four"], color=f"C{i}", linestyle="--", linewidth=1,
                label=f"{n} tokens: tokens 0-3")
    ax.set_xlabel("Layer")
    ax.set_ylabel("Mean attention over all queries and heads")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _finish(fig, title, ax)


def sink_map(sink_table, num_tokens: int | None = None, ax=None, title: str | None = None):
    """Layer x head map of the mean attention to token 0 for one prompt length (the longest by default);
    heads above 0.5 (sinks) are marked with a dot."""
    n = int(sink_table["num_tokens"].max()) if num_tokens is None else num_tokens
    wide = sink_table[sink_table["num_tokens"] == n].pivot(index="layer", columns="head", values="first").sort_index()
    fig, ax = _new_axes(ax, (0.35 * wide.shape[1] + 3, 0.16 * wide.shape[0] + 2))
    im = ax.imshow(wide.to_numpy(dtype=float), aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=1)
    layer_idx, head_idx = np.nonzero(wide.to_numpy(dtype=float) > 0.5)
    ax.scatter(head_idx, layer_idx, s=8, color="cyan")
    ax.set_xlabel("Head")
    ax.set_ylabel("Layer")
    fig.colorbar(im, ax=ax, label="Mean attention to token 0")
    ax.set_title(title or f"Sinks at {n} tokens: {len(layer_idx)} heads put over half on token 0 (dots)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def attention_and_accuracy_curves(table, title: str | None = None):
    """Two panels from `attention_study.attention_and_accuracy`: attention on the gold document and accuracy,
    each against the gold position with 95% intervals."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = table["position"].to_numpy() + 1
    for ax, (y, lo, hi, label, color) in zip((a1, a2), (
            ("attention", "attention_ci_low", "attention_ci_high", "Attention on the gold document", "C2"),
            ("accuracy", "ci_low", "ci_high", "Accuracy", "C0"))):
        ax.plot(x, table[y], marker="o", color=color)
        ax.fill_between(x, table[lo], table[hi], color=color, alpha=0.2)
        ax.set_xticks(x)
        ax.set_xlabel("Position of the gold document (1 = first)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    a2.set_ylim(-0.02, 1.02)
    return _finish(fig, title)


def recall_curves(recall_table, title: str | None = None):
    """Recall@k of the gold document ranked by attention, vanilla against calibrated, by gold position
    (one panel per k, Wilson 95% intervals), from `attention_study.recall_by_position`."""
    import matplotlib.pyplot as plt

    ks = sorted(recall_table["k"].unique())
    fig, axes = plt.subplots(1, len(ks), figsize=(5 * len(ks), 3.8), squeeze=False)
    for ax, k in zip(axes[0], ks):
        for i, (method, g) in enumerate(recall_table[recall_table["k"] == k].groupby("method", sort=False)):
            g = g.sort_values("position")
            x = g["position"].to_numpy() + 1
            ax.plot(x, g["recall"], marker="o", color=f"C{i}", label=method)
            ax.fill_between(x, g["ci_low"], g["ci_high"], color=f"C{i}", alpha=0.15)
            ax.set_xticks(x)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("Position of the gold document (1 = first)")
        ax.set_ylabel(f"Recall@{k} of the gold by attention")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _finish(fig, title)


def _panels(effects, measure, size):
    """A figure with a left panel, and a right one for the paired differences on a continuous measure when
    `effects` (from `stats.versus_baseline`) hold one; returns (figure, left axes, right axes or None, measure)."""
    import matplotlib.pyplot as plt

    held = [] if effects is None else [m for m in dict.fromkeys(effects["measure"]) if as_measure(m).binary is False]
    name = measure or (held[-1] if held else None)
    if name is None:
        fig, ax = plt.subplots(figsize=size)
        return fig, ax, None, None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(2 * size[0], size[1]))
    return fig, ax, bx, as_measure(name)


def _difference_panel(ax, effects, m, column: str, labels, baseline: str):
    """Paired differences from the baseline with 95% t intervals, one row per label, a line at 0."""
    e = effects[effects["measure"] == m.name].set_index(column).reindex(labels)
    y = np.arange(len(labels))[::-1]
    ax.errorbar(e["diff"], y, xerr=[e["diff"] - e["diff_low"], e["diff_high"] - e["diff"]], fmt="o", color="C2",
                capsize=3)
    ax.axvline(0, color="C0", linestyle="--", linewidth=1)
    ax.set_yticks(y, [str(x).replace("|", " · ") for x in labels])
    n = int(e["n"].dropna().iloc[0]) if e["n"].notna().any() else 0
    ax.set_xlabel(f"{m.label.capitalize()} minus {baseline} ({m.unit}; 95% paired t interval, n = {n})")
    ax.grid(alpha=0.3, axis="x")


def strategy_accuracy(summary, title: str | None = None, chance: float | None = None, effects=None,
                      measure: str | None = None):
    """Accuracy (Wilson 95%) of each strategy x variant condition from `strategies.summarize`, oracle
    placements in grey, other variants in orange, the dashed line the first (baseline) condition; with
    `effects` (`strategies.effects`), a second panel: each condition minus the baseline on a continuous
    measure (`measure`, default the margin, else the gold log-likelihood), paired over questions."""
    fig, ax, bx, m = _panels(effects, measure, (7, 0.38 * len(summary) + 1.5))
    y = np.arange(len(summary))[::-1]
    colors = ["grey" if a.startswith("gold@") else ("C1" if v != summary["variant"].iloc[0] else "C0")
              for a, v in zip(summary["arrangement"], summary["variant"])]
    acc = summary["accuracy"].to_numpy()
    for yi, a, lo, hi, c in zip(y, acc, summary["ci_low"], summary["ci_high"], colors):
        ax.errorbar(a, yi, xerr=[[a - lo], [hi - a]], fmt="o", color=c, capsize=3)
    ax.axvline(acc[0], color="C0", linestyle="--", linewidth=1)
    if chance is not None:
        ax.axvline(chance, color="grey", linestyle="-.", linewidth=0.8, label="chance")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(y, [c.replace("|", " · ") for c in summary["condition"]])
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("Accuracy (95% Wilson interval)")
    ax.grid(alpha=0.3, axis="x")
    if bx is not None:
        base = summary["condition"].iloc[0]
        _difference_panel(bx, effects, m, "condition", list(summary["condition"].iloc[1:]), base.replace("|", " · "))
        bx.set_ylim(ax.get_ylim()[0], ax.get_ylim()[1] - 1)
    return _finish(fig, title, None if bx is not None else ax)


def rank_placement_bars(placement, title: str | None = None):
    """For each arrangement, the share of prompts where the retriever's rank 1, 2, 3 documents sit in the
    first half of the documents (solid) or the second half (hatched), from `strategies.rank_placement`."""
    base = placement[placement["variant"] == placement["variant"].iloc[0]]
    arrangements = list(dict.fromkeys(base["arrangement"]))
    ranks = sorted(base["rank"].unique())
    fig, ax = _new_axes(None, (1.1 * len(arrangements) + 2, 3.8))
    width = 0.8 / len(ranks)
    for j, r in enumerate(ranks):
        g = base[base["rank"] == r].set_index("arrangement").reindex(arrangements)
        x = np.arange(len(arrangements)) + (j - (len(ranks) - 1) / 2) * width
        ax.bar(x, g["before"], width, color=f"C{j}", label=f"rank {r}: first half")
        ax.bar(x, g["after"], width, bottom=g["before"], color=f"C{j}", alpha=0.35, hatch="//",
               label=f"rank {r}: second half")
    ax.set_xticks(range(len(arrangements)), arrangements, rotation=20)
    ax.set_ylabel("Share of prompts")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=len(ranks), loc="upper center", bbox_to_anchor=(0.5, -0.22))
    return _finish(fig, title, ax)


def accuracy_vs_reuse(layout_summary, title: str | None = None):
    """Accuracy (Wilson 95%) against the fraction of prompt tokens a prefix cache reuses, one point per
    layout, annotated with the measured warm/cold prefill speed-up (from `prefix.layout_study`)."""
    fig, ax = _new_axes(None, (6, 4))
    for i, r in enumerate(layout_summary.itertuples()):
        ax.errorbar(r.reuse_fraction, r.accuracy, yerr=[[r.accuracy - r.ci_low], [r.ci_high - r.accuracy]],
                    fmt="o", color=f"C{i}", capsize=3, label=r.layout)
        ax.annotate(f"{r.layout}\nprefill x{r.speedup:.1f}", (r.reuse_fraction, r.accuracy),
                    textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("Prompt tokens reused by a prefix cache")
    ax.set_ylabel("Forced-choice accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return _finish(fig, title, ax)


def accuracy_vs_kept_tokens(summary, title: str | None = None, chance: float | None = None, effects=None,
                            measure: str | None = None):
    """Accuracy (Wilson 95%) against the mean prompt tokens kept, one line per compression strategy across
    its budgets, the uncompressed prompt as a star (from `compression_study.summarize`); with `effects`
    (`compression_study.effects`), a second panel: each strategy and budget minus the uncompressed prompt on
    a continuous measure (default the margin, else the gold log-likelihood), paired over questions."""
    fig, ax, bx, m = _panels(effects, measure, (6.5, 4.2))
    for i, (s, g) in enumerate(summary.groupby("strategy", sort=False)):
        g = g.sort_values("prompt_tokens")
        err = [g["accuracy"] - g["ci_low"], g["ci_high"] - g["accuracy"]]
        style = dict(marker="*", markersize=12, linestyle="none", color="black") if s == "none" else \
            dict(marker="o", color=f"C{i}")
        ax.errorbar(g["prompt_tokens"], g["accuracy"], yerr=err, capsize=3, label=s, alpha=0.9, **style)
    if chance is not None:
        ax.axhline(chance, color="grey", linestyle="-.", linewidth=0.8, label="chance")
    ax.set_xlabel("Prompt tokens after compression (mean)")
    ax.set_ylabel("Forced-choice accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    if bx is not None:
        _difference_panel(bx, effects, m, "arm", list(dict.fromkeys(effects["arm"])), "uncompressed")
    return _finish(fig, title, None if bx is not None else ax)


def evidence_survival_bars(summary, title: str | None = None):
    """For each strategy and budget: how often the gold's answer sentence survived, and the accuracy with
    the evidence kept and with it lost (a lost-evidence error is a packing failure, not a position one).
    An accuracy without prompts to count (the evidence never lost, or never kept) is no bar and "n/a"."""
    s = summary[summary["strategy"] != "none"]
    fig, ax = _new_axes(None, (0.75 * len(s) + 2.5, 4))
    x = np.arange(len(s))
    for j, (col, label) in enumerate((("evidence_survival", "evidence survived"),
                                      ("accuracy_evidence_kept", "accuracy, evidence kept"),
                                      ("accuracy_evidence_lost", "accuracy, evidence lost"))):
        at = x + (j - 1) * 0.27
        ax.bar(at, s[col], 0.27, color=f"C{j}", label=label)
        for xi in at[s[col].isna().to_numpy()]:
            ax.text(xi, 0.01, "n/a", ha="center", va="bottom", rotation=90, fontsize=6, color=f"C{j}")
    ax.set_xticks(x, [f"{r.strategy}\n@{int(r.budget)}" for r in s.itertuples()], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("Share")
    ax.legend(fontsize=7, loc="upper right")
    return _finish(fig, title, ax)


def position_curves_by_strategy(by_position, budget: int, title: str | None = None):
    """Accuracy by the gold's position for the uncompressed prompt and each strategy at one budget
    (from `compression_study.by_position`): does compression flatten the curve?"""
    fig, ax = _new_axes(None, (6.5, 4.2))
    d = by_position[(by_position["budget"] == budget) | (by_position["strategy"] == "none")]
    for i, (s, g) in enumerate(d.groupby("strategy", sort=False)):
        g = g.sort_values("position")
        ax.plot(g["position"] + 1, g["accuracy"], marker="o", color="black" if s == "none" else f"C{i}",
                linewidth=2.2 if s == "none" else 1.2, label=s)
    ax.set_xticks(sorted(d["position"].unique() + 1))
    ax.set_xlabel("Position of the gold document before compression (1 = first)")
    ax.set_ylabel("Forced-choice accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _finish(fig, title or f"Position curves at a budget of {budget} tokens", ax)


def diagnosis_curves(measures_by_model, title: str | None = None):
    """Notebook 07: accuracy (Wilson 95%) by the gold's depth at the cases' own length, oracle and
    closed-book as dashed and dotted lines (left); wrong-source and abstention rates (right); one colour
    per model.  `measures_by_model` is [(model, diagnose.measures(...)), ...]."""
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, m) in enumerate(measures_by_model):
        color = f"C{i}"
        d = m[(m["placement"].notna()) & (m["length"] == 1)].sort_values("placement")
        x = np.arange(len(d))
        ax.plot(x, d["accuracy"], marker="o", color=color, label=name)
        ax.fill_between(x, d["ci_low"], d["ci_high"], color=color, alpha=0.2)
        for cond, style in (("oracle", "--"), ("closedbook", ":")):
            row = m[m["condition"] == cond]
            if len(row):
                ax.axhline(float(row["accuracy"].iloc[0]), color=color, linestyle=style, linewidth=1.2,
                           label=f"{cond} ({name})")
        bx.plot(x, d["wrong_source"], marker="s", color=color, label=f"wrong source ({name})")
        bx.plot(x, d["abstained"], marker="^", color=color, linestyle="--", label=f"abstained ({name})")
        for a in (ax, bx):
            a.set_xticks(x, d["condition"])
    ax.set_ylabel("Accuracy")
    bx.set_ylabel("Share of answers")
    for a in (ax, bx):
        a.set_xlabel("Depth of the gold document in the document region")
        a.set_ylim(-0.02, 1.02)
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="best")
    return _finish(fig, title)


def lever_curves(table, title: str | None = None, chance: float | None = None, columns: int = 3):
    """Notebook 08: one small panel per lever (a `levers.by_position` table on one measure), the lever's mean by
    the gold's rank in the retrieved list with its 95% band beside the baseline's (black), so no lever's range
    squeezes another's; each panel's y range is set by its own two curves, and says its n."""
    import matplotlib.pyplot as plt

    m = as_measure(table["measure"].iloc[0])
    names = [lv for lv in dict.fromkeys(table["lever"]) if lv != "baseline"]
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.9 * rows), squeeze=False, sharex=True)
    base = table[table["lever"] == "baseline"].sort_values("position")
    ranks = sorted(table["position"].unique() + 1)
    for k, ax in enumerate(axes.flat):
        if k >= len(names):
            ax.set_visible(False)
            continue
        lever = names[k]
        for g, color, label in ((base, OKABE_ITO[0], "baseline"),
                                (table[table["lever"] == lever].sort_values("position"), OKABE_ITO[4], "the lever")):
            ax.plot(g["position"] + 1, g["mean"], marker="o", color=color, linewidth=1.6, label=label)
            ax.fill_between(g["position"] + 1, g["ci_low"], g["ci_high"], color=color, alpha=0.15)
        if m.binary and chance is not None:
            ax.axhline(chance, color="grey", linestyle="-.", linewidth=0.8, label="chance")
        n = int(table.loc[table["lever"].isin(["baseline", lever]), "n"].min())
        ax.set_title(f"{lever} (n = {n})", fontsize=10)
        ax.set_xticks(ranks)
        ax.grid(alpha=0.3)
        if k % columns == 0:
            ax.set_ylabel(_axis_label(m, "choice"), fontsize=9)
        if k >= len(names) - columns:
            ax.set_xlabel("Rank of the gold (1 = first)", fontsize=9)
        ax.tick_params(labelbottom=True)
    axes.flat[0].legend(fontsize=7, loc="best")
    return _finish(fig, title)


# Okabe and Ito's colour-blind-safe palette (black first)
OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#F0E442")


def lever_forest(changes, title: str | None = None):
    """Notebook 08: a forest plot per measure (`levers.penalty_changes`): for each lever, its change against the
    baseline in the middle penalty (black; left of 0 the curve flattens) and at each gold rank (coloured; above
    0 the lever lifts that rank), paired over questions with 95% t intervals."""
    import matplotlib.pyplot as plt

    changes = changes[changes["estimand"] != "mean over positions"]
    names = list(dict.fromkeys(changes["measure"]))
    levers = list(dict.fromkeys(changes["lever"]))
    estimands = list(dict.fromkeys(changes["estimand"]))  # the middle penalty, then each rank
    k = len(estimands)
    fig, axes = plt.subplots(1, len(names), figsize=(5.6 * len(names), 0.28 * k * len(levers) + 1.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        m = as_measure(name)
        for j, estimand in enumerate(estimands):
            e = changes[(changes["measure"] == name) & (changes["estimand"] == estimand)].set_index("lever").reindex(levers)
            y = (len(levers) - 1 - np.arange(len(levers))) * (k + 1) + (k - 1 - j)
            mid, lo, hi = (m.scale(e[c].to_numpy(dtype=float)) for c in ("change", "change_low", "change_high"))
            ax.errorbar(mid, y, xerr=[mid - lo, hi - mid], fmt="s" if j == 0 else "o", color=OKABE_ITO[j % 8],
                        capsize=2, markersize=5, label=f"{estimand}" + (" (edges minus middle)" if j == 0 else ""))
        ax.axvline(0, color="grey", linestyle="--", linewidth=1)
        ax.set_yticks((len(levers) - 1 - np.arange(len(levers))) * (k + 1) + (k - 1) / 2, levers)
        n = int(changes.loc[changes["measure"] == name, "n"].max())
        ax.set_xlabel(f"Lever minus baseline on the {m.name} ({m.unit}),\n95% paired t interval, n = {n} questions",
                      fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _finish(fig, title)
