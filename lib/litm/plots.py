"""Figures, drawn from results tables (never from a live model) and saved through `save_figure`."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .experiment import summarize
from .stats import edges_and_middle, measures_in, middle_penalty, paired_table, primary_measure, value_column
from .stats import measure as as_measure

FIGURES_DIR = Path(os.environ.get("LITM_FIGURES", "figures"))
# Okabe and Ito's palette, distinguishable with every common colour-vision deficiency. `_c(i)` is its i-th colour
# (matplotlib's "C0".. would resolve against whatever palette is in force when the figure is saved).
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
# The width at which the README shows a full-width figure (GitHub's column, about 830 px at 96 px per inch): a
# wider figure is scaled down, and its text with it. Our figures keep text at 8 points or more at that size.
README_WIDTH_IN = 8.6
STYLE = {"font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10,
         "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.fontsize": 9, "figure.titlesize": 11}


def _c(i: int) -> str:
    return OKABE_ITO[i % len(OKABE_ITO)]


def styled(fn):
    """Draw `fn`'s figure with the font sizes above and the palette as the default colour cycle."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import matplotlib as mpl
        from cycler import cycler

        with mpl.rc_context({**STYLE, "axes.prop_cycle": cycler(color=OKABE_ITO)}):
            return fn(*args, **kwargs)

    return wrapper


MARK_HEIGHT = 0.08  # the share of a panel's height one far baseline's mark takes (`reference_line`)


def reference_line(ax, value: float, label: str, limits: tuple[float, float], color="grey", linestyle="--",
                   slot: int = 0) -> bool:
    """A baseline at `value`: a line where it lies within reach of the data (`limits`, widened by half their
    span), else a labelled arrow at the top or bottom edge, so that a far baseline does not set the axis.
    Returns whether it was drawn as a line."""
    lo, hi = limits
    if near(value, limits):
        ax.axhline(value, color=color, linestyle=linestyle, linewidth=1.2, label=label)
        return True
    top = value > hi
    ax.annotate(f"{label}: {value:+.3g} {'↑' if top else '↓'}", xy=(0.99, 0.98 - MARK_HEIGHT * slot if top else
                0.02 + MARK_HEIGHT * slot), xycoords="axes fraction", ha="right", va="top" if top else "bottom",
                color=color, fontsize=9, bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=color, lw=0.8))
    return False


def near(value: float, limits: tuple[float, float]) -> bool:
    """Whether a baseline lies within reach of the data: inside `limits` widened by half their span."""
    reach = max(limits[1] - limits[0], 1e-9) / 2
    return limits[0] - reach <= value <= limits[1] + reach


def counts(values) -> str:
    """Sample sizes for a label: "12", or "11/12" where they differ."""
    return "/".join(str(v) for v in sorted({int(v) for v in values}))


def data_limits(*arrays, pad: float = 0.08) -> tuple[float, float]:
    """The span of the data (lines and their bands), padded by `pad` of it on each side."""
    values = np.concatenate([np.asarray(a, dtype=float).ravel() for a in arrays])
    values = values[np.isfinite(values)]
    lo, hi = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    span = (hi - lo) or max(abs(hi), 1.0)
    return lo - pad * span, hi + pad * span


def save_figure(fig, name: str, directory: str | Path | None = None) -> list[Path]:
    """Save `fig` as `<directory>/<name>.png` and `.pdf` (directory: LITM_FIGURES or ./figures); the same figure
    gives the same bytes (no creation date in the PDF), so a committed figure changes only when its data do."""
    d = Path(directory) if directory is not None else FIGURES_DIR
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / f"{name}.{ext}" for ext in ("png", "pdf")]
    for p in paths:
        fig.savefig(p, dpi=150, bbox_inches="tight", metadata={"CreationDate": None} if p.suffix == ".pdf" else None)
    return paths


def _finish(fig, title: str | None, ax=None):
    """Title the axes (or, without them, the figure), tighten the layout, keep text readable, return the figure."""
    if title:
        (ax.set_title if ax is not None else fig.suptitle)(title)
    fig.tight_layout()
    return floor_fonts(fig)


def floor_fonts(fig, points: float = 8.0, rect=None):
    """Raise every text below `points` once the saved figure (its tight bounding box) is scaled to the README's
    width, so that a wide figure's labels stay readable where it is shown."""
    from matplotlib.text import Text

    for _ in range(2):  # larger text widens the box a little: check once more
        width = fig.get_tightbbox(fig.canvas.get_renderer()).width
        need = points * max(1.0, width / README_WIDTH_IN)
        small = [t for t in fig.findobj(Text) if t.get_text() and t.get_fontsize() < need - 1e-9]
        if not small:
            break
        for t in small:
            t.set_fontsize(need)
        fig.tight_layout(**({"rect": rect} if rect else {}))
    return fig


def _n_note(table, what: str = "questions at each position") -> str:
    """A second x-label line with the table's n ("n = 12", or "n = 11/12" where they differ); empty without n."""
    if "n" not in table or not len(table):
        return ""
    return f"\nn = {counts(table['n'].dropna())} {what}"


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


@styled
def position_curve(df, label_by: str | None = None, ax=None, title: str | None = None, chance: float | None = None,
                   measure: str | None = None, unit: str = "document"):
    """Two panels against the gold position (1-based): accuracy with Wilson 95% bands, and a continuous
    measure with t 95% bands (`measure`, default the margin, else the gold log-likelihood), one line per
    value of `label_by`; closed-book and oracle are dashed and dotted lines where they lie near the data, and
    labelled arrows at the edge where they do not (the data set the axis). `unit` names what moves ("document",
    "key-value pair"). Records holding one measure, or a given `ax`, get one panel (`measure` if given, else the
    first held)."""
    import matplotlib.pyplot as plt

    cont = _continuous(df, measure)
    panels = list(dict.fromkeys([m for m in measures_in(df) if m.binary] + ([cont] if cont else [])))
    if ax is not None:
        fig, axes, panels = ax.figure, [ax], [cont if measure else panels[0]]
    else:
        fig, axes = plt.subplots(1, len(panels), figsize=(4.3 * len(panels), 3.6), squeeze=False)
        axes = list(axes[0])
    groups = [(None, df)] if label_by is None else list(df.groupby(label_by, sort=False))
    scoring = df["scoring"].iloc[0] if "scoring" in df else ""
    xs = sorted(int(p) + 1 for p in df.loc[df["condition"] == "documents", "position"].dropna().unique())
    for a, m in zip(axes, panels):
        y, lo, hi = m.summary
        baselines, spans, ns = [], [], {}
        for i, (label, g) in enumerate(groups):
            color = _c(i)
            s = summarize(g)
            docs = s[s["condition"] == "documents"].sort_values("position")
            ns[label] = counts(docs["n"])
            x = docs["position"].astype(int).to_numpy() + 1
            a.plot(x, docs[y], marker="o", color=color, label=label if label is not None else "full context")
            a.fill_between(x, docs[lo], docs[hi], color=color, alpha=0.2)
            spans += [docs[y], docs[lo], docs[hi]]
            for cond, style in (("closedbook", "--"), ("oracle", ":")):
                row = s[s["condition"] == cond]
                if len(row) and y in row and np.isfinite(float(row[y].iloc[0])):
                    name = {"closedbook": "closed-book"}.get(cond, cond)
                    baselines.append((float(row[y].iloc[0]), name + (f" ({label})" if label is not None else ""),
                                      color, style))
        if m.binary:
            limits = (-0.02, 1.02)
            if chance is not None:
                baselines.append((chance, "chance", "grey", "-."))
        else:
            limits = data_limits(*spans)
            if m.name == "margin":
                baselines.append((0.0, "tie with the best other", "grey", "-."))
        slots, edge = 0, {True: 0.0, False: 0.0}  # the axes' share the marks take at the top and the bottom
        for value, label, color, style in baselines:
            if reference_line(a, value, label, limits, color, style, slot=slots):
                pad = 0.04 * (limits[1] - limits[0])  # a line just outside the data: widen the axis to show it
                limits = (min(limits[0], value - pad) if value < limits[0] else limits[0],
                          max(limits[1], value + pad) if value > limits[1] else limits[1])
            else:
                slots += 1
                edge[value > limits[1]] = MARK_HEIGHT * slots + 0.02
        # room for the marks: the data fill the rest of the panel, so no mark sits on the curve
        total = (limits[1] - limits[0]) / (1 - edge[True] - edge[False])
        a.set_ylim(limits[0] - edge[False] * total, limits[1] + edge[True] * total)
        n_note = (f"n = {next(iter(ns.values()))} questions at each position" if len(set(ns.values())) == 1
                  else "n at each position: " + ", ".join(f"{v} ({k})" for k, v in ns.items()))
        a.set_xlabel(f"Position of the gold {unit} (1 = first)\n{n_note}")
        a.set_ylabel(_axis_label(m, scoring))
        if xs:
            a.set_xticks(xs)
        a.grid(alpha=0.3)
        a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.36), ncol=2, frameon=False)
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


@styled
def depth_length_heatmap(df, depths: int = 10, ax=None, title: str | None = None):
    """Needle-in-a-haystack style heatmap: rows are the gold's depth, columns the prompt length; cells are
    accuracy (or mean gold log-likelihood) at the document nearest that depth for that length, each with its
    n. Colours from cividis (ordered in lightness, readable with any colour-vision deficiency)."""
    import pandas as pd

    value = value_column(df)
    acc = value == "correct"
    ok = df[df["status"] == "ok"]
    lengths = sorted(ok["target_length"].unique())
    levels = [i / (depths - 1) for i in range(depths)]
    cells = pd.DataFrame(index=[f"{round(100 * d)}%" for d in levels], columns=lengths, dtype=float)
    counts = cells.copy()
    for L in lengths:
        g = ok[ok["target_length"] == L]
        n = int(g["num_docs"].iloc[0])
        for d, label in zip(levels, cells.index):
            x = g.loc[g["position"] == round(d * (n - 1)), value].dropna().astype(float)
            cells.loc[label, L], counts.loc[label, L] = (x.mean() if len(x) else np.nan), len(x)
    fig, ax = _new_axes(ax, (1.3 * len(lengths) + 2.6, 0.42 * depths + 1.6))
    grid = cells.to_numpy(dtype=float)
    im = ax.imshow(grid, aspect="auto", cmap="cividis", vmin=0 if acc else None, vmax=1 if acc else None)
    ax.set_xticks(range(len(lengths)), [str(int(L)) for L in lengths])
    ax.set_yticks(range(depths), cells.index)
    ax.set_xlabel("Prompt length (target, tokens)")
    ax.set_ylabel("Depth of the gold document\n(the document nearest it)")
    lo, hi = (0.0, 1.0) if acc else (np.nanmin(grid), np.nanmax(grid))
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            dark = (v - lo) / ((hi - lo) or 1) < 0.55  # cividis is dark at the low end
            ax.text(j, i, (f"{100 * v:.0f}%" if acc else f"{v:.1f}") + f" (n={int(counts.iloc[i, j])})",
                    ha="center", va="center", fontsize=8, color="white" if dark else "black")
    fig.colorbar(im, ax=ax, label="Accuracy" if acc else "Mean gold log-likelihood (nats)")
    return _finish(fig, title, ax)


@styled
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


@styled
def sink_strength(sink_table, ax=None, title: str | None = None):
    """Mean attention to token 0 (solid) and to the first four tokens (dashed) per layer, averaged over
    heads, one colour per prompt length (from `attention_study.sinks_by_length`)."""
    fig, ax = _new_axes(ax, (6.5, 4))
    for i, (n, g) in enumerate(sink_table.groupby("num_tokens")):
        by_layer = g.groupby("layer")[["first", "first_four"]].mean()
        ax.plot(by_layer.index, by_layer["first"], color=_c(i), marker=".", label=f"{n} tokens: token 0")
        ax.plot(by_layer.index, by_layer["first_four"], color=_c(i), linestyle="--", linewidth=1,
                label=f"{n} tokens: tokens 0-3")
    ax.set_xlabel("Layer")
    ax.set_ylabel("Mean attention over all queries and heads")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _finish(fig, title, ax)


@styled
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
    return floor_fonts(fig)


@styled
def attention_and_accuracy_curves(table, title: str | None = None):
    """Two panels from `attention_study.attention_and_accuracy`: attention on the gold document and accuracy,
    each against the gold position with 95% intervals."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.6, 3.6))
    x = table["position"].to_numpy() + 1
    for ax, (y, lo, hi, label, color) in zip((a1, a2), (
            ("attention", "attention_ci_low", "attention_ci_high", "Attention on the gold document", _c(2)),
            ("accuracy", "ci_low", "ci_high", "Accuracy", _c(0)))):
        ax.plot(x, table[y], marker="o", color=color)
        ax.fill_between(x, table[lo], table[hi], color=color, alpha=0.2)
        ax.set_xticks(x)
        ax.set_xlabel("Position of the gold document (1 = first)" + _n_note(table))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    a2.set_ylim(-0.02, 1.02)
    return _finish(fig, title)


@styled
def recall_curves(recall_table, title: str | None = None):
    """Recall@k of the gold document ranked by attention, vanilla against calibrated, by gold position
    (one panel per k, Wilson 95% intervals), from `attention_study.recall_by_position`."""
    import matplotlib.pyplot as plt

    ks = sorted(recall_table["k"].unique())
    fig, axes = plt.subplots(1, len(ks), figsize=(min(5, 8.6 / len(ks)) * len(ks), 3.6), squeeze=False)
    for ax, k in zip(axes[0], ks):
        for i, (method, g) in enumerate(recall_table[recall_table["k"] == k].groupby("method", sort=False)):
            g = g.sort_values("position")
            x = g["position"].to_numpy() + 1
            ax.plot(x, g["recall"], marker="o", color=_c(i), label=method)
            ax.fill_between(x, g["ci_low"], g["ci_high"], color=_c(i), alpha=0.15)
            ax.set_xticks(x)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("Position of the gold document (1 = first)" + _n_note(recall_table[recall_table["k"] == k]))
        ax.set_ylabel(f"Recall@{k} of the gold by attention")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _finish(fig, title)


def _panels(effects, measure, size, sharey: bool = False):
    """A figure with a left panel, and a right one for the paired differences on a continuous measure when
    `effects` (from `stats.versus_baseline`) hold one; returns (figure, left axes, right axes or None, measure)."""
    import matplotlib.pyplot as plt

    held = [] if effects is None else [m for m in dict.fromkeys(effects["measure"]) if as_measure(m).binary is False]
    name = measure or (held[-1] if held else None)
    if name is None:
        fig, ax = plt.subplots(figsize=size)
        return fig, ax, None, None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(2 * size[0], size[1]), sharey=sharey)
    return fig, ax, bx, as_measure(name)


def _difference_panel(ax, effects, m, column: str, labels, baseline: str, y=None):
    """Paired differences from the baseline with 95% t intervals, one row per label (at `y`, the rows of a panel
    it shares its y axis with; else its own rows, labelled), a line at 0."""
    e = effects[effects["measure"] == m.name].set_index(column).reindex(labels)
    own = y is None
    y = np.arange(len(labels))[::-1] if own else np.asarray(y)
    ax.errorbar(e["diff"], y, xerr=[e["diff"] - e["diff_low"], e["diff_high"] - e["diff"]], fmt="o", color=_c(2),
                capsize=3)
    ax.axvline(0, color=_c(0), linestyle="--", linewidth=1)
    if own:
        ax.set_yticks(y, [str(x).replace("|", " · ") for x in labels])
    n = int(e["n"].dropna().iloc[0]) if e["n"].notna().any() else 0
    ax.set_xlabel(f"{m.label.capitalize()} minus {baseline} ({m.unit})\n95% paired t interval, n = {n} questions")
    ax.grid(alpha=0.3, axis="x")


@styled
def strategy_accuracy(summary, title: str | None = None, chance: float | None = None, effects=None,
                      measure: str | None = None):
    """Accuracy (Wilson 95%) of each strategy x variant condition from `strategies.summarize`, oracle
    placements in grey, other variants in orange, the dashed line the first (baseline) condition; with
    `effects` (`strategies.effects`), a second panel: each condition minus the baseline on a continuous
    measure (`measure`, default the margin, else the gold log-likelihood), paired over questions."""
    fig, ax, bx, m = _panels(effects, measure, (4.4, 0.34 * len(summary) + 1.5), sharey=True)
    y = np.arange(len(summary))[::-1]
    colors = ["grey" if a.startswith("gold@") else (_c(1) if v != summary["variant"].iloc[0] else _c(0))
              for a, v in zip(summary["arrangement"], summary["variant"])]
    acc = summary["accuracy"].to_numpy()
    for yi, a, lo, hi, c in zip(y, acc, summary["ci_low"], summary["ci_high"], colors):
        ax.errorbar(a, yi, xerr=[[a - lo], [hi - a]], fmt="o", color=c, capsize=3)
    ax.axvline(acc[0], color=_c(0), linestyle="--", linewidth=1)
    if chance is not None:
        ax.axvline(chance, color="grey", linestyle="-.", linewidth=0.8, label="chance")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(y, [c.replace("|", " · ") for c in summary["condition"]])
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel(f"Accuracy (95% Wilson interval)\nn = {counts(summary['n'])} questions per condition")
    ax.grid(alpha=0.3, axis="x")
    if bx is not None:
        base = summary["condition"].iloc[0]
        _difference_panel(bx, effects, m, "condition", list(summary["condition"].iloc[1:]), base.replace("|", " · "),
                          y=y[1:])  # each condition on its own row in both panels
        bx.annotate("the baseline", (0, y[0]), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8,
                    color=_c(0))
        bx.tick_params(labelleft=False)
    return _finish(fig, title, None if bx is not None else ax)


@styled
def rank_placement(placement, title: str | None = None):
    """Where each arrangement puts the retriever's rank 1, 2 and 3 documents (from `strategies.rank_placement`):
    their mean place in the prompt (1 = first document), with a line from the least to the greatest place over
    the prompts, one row per arrangement; the shaded half is the second half of the documents."""
    base = placement[placement["variant"] == placement["variant"].iloc[0]]
    arrangements = list(dict.fromkeys(base["arrangement"]))
    ranks = sorted(base["rank"].unique())
    k = int(base["num_docs"].max())
    fig, ax = _new_axes(None, (6.4, 0.55 * len(arrangements) + 1.9))
    y = np.arange(len(arrangements))[::-1]
    markers = "osD^v"
    for j, r in enumerate(ranks):
        g = base[base["rank"] == r].set_index("arrangement").reindex(arrangements)
        yj = y + (len(ranks) - 1) / 2 * 0.22 - j * 0.22
        ax.hlines(yj, g["min_position"], g["max_position"], color=_c(j), linewidth=1.2)
        ax.plot(g["mean_position"], yj, markers[j % len(markers)], color=_c(j), markersize=7,
                label=f"rank {r}")
    ax.axvspan(k / 2 + 0.5, k + 0.5, color="grey", alpha=0.1, lw=0)
    ax.set_yticks(y, arrangements)
    ax.set_xticks(range(1, k + 1))
    ax.set_xlim(0.5, k + 0.5)
    n = counts(base["n"])
    ax.set_xlabel("Place in the prompt (1 = first document; shaded: second half)\n"
                  f"marker: the mean; line: least to greatest; n = {n} prompts per arrangement")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3 - 0.02 * len(arrangements)), ncol=len(ranks), frameon=False)
    return _finish(fig, title, ax)


@styled
def accuracy_vs_reuse(layout_summary, title: str | None = None):
    """Accuracy (Wilson 95%) against the fraction of prompt tokens a prefix cache reuses, one point per
    layout, annotated with the measured warm/cold prefill speed-up (from `prefix.layout_study`)."""
    fig, ax = _new_axes(None, (6, 4))
    for i, r in enumerate(layout_summary.itertuples()):
        ax.errorbar(r.reuse_fraction, r.accuracy, yerr=[[r.accuracy - r.ci_low], [r.ci_high - r.accuracy]],
                    fmt="o", color=_c(i), capsize=3, label=r.layout)
        ax.annotate(f"{r.layout}\nprefill x{r.speedup:.1f}", (r.reuse_fraction, r.accuracy),
                    textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("Prompt tokens reused by a prefix cache")
    ax.set_ylabel("Forced-choice accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return _finish(fig, title, ax)


@styled
def accuracy_vs_kept_tokens(summary, title: str | None = None, chance: float | None = None, effects=None,
                            measure: str | None = None):
    """Accuracy (Wilson 95%) against the mean prompt tokens kept, one line per compression strategy across
    its budgets, the uncompressed prompt as a star (from `compression_study.summarize`); with `effects`
    (`compression_study.effects`), a second panel: each strategy and budget minus the uncompressed prompt on
    a continuous measure (default the margin, else the gold log-likelihood), paired over questions."""
    fig, ax, bx, m = _panels(effects, measure, (4.4, 3.8))
    for i, (s, g) in enumerate(summary.groupby("strategy", sort=False)):
        g = g.sort_values("prompt_tokens")
        err = [g["accuracy"] - g["ci_low"], g["ci_high"] - g["accuracy"]]
        style = dict(marker="*", markersize=12, linestyle="none", color="black") if s == "none" else \
            dict(marker="o", color=_c(i))
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


@styled
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
        ax.bar(at, s[col], 0.27, color=_c(j), label=label)
        for xi in at[s[col].isna().to_numpy()]:
            ax.text(xi, 0.01, "n/a", ha="center", va="bottom", rotation=90, fontsize=6, color=_c(j))
    ax.set_xticks(x, [f"{r.strategy}\n@{int(r.budget)}" for r in s.itertuples()], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("Share")
    ax.legend(fontsize=7, loc="upper right")
    return _finish(fig, title, ax)


@styled
def position_curves_by_strategy(by_position, budget: int, title: str | None = None):
    """Accuracy by the gold's position for the uncompressed prompt and each strategy at one budget
    (from `compression_study.by_position`): does compression flatten the curve?"""
    fig, ax = _new_axes(None, (6.5, 4.2))
    d = by_position[(by_position["budget"] == budget) | (by_position["strategy"] == "none")]
    for i, (s, g) in enumerate(d.groupby("strategy", sort=False)):
        g = g.sort_values("position")
        ax.plot(g["position"] + 1, g["accuracy"], marker="o", color="black" if s == "none" else _c(i),
                linewidth=2.2 if s == "none" else 1.2, label=s)
    ax.set_xticks(sorted(d["position"].unique() + 1))
    ax.set_xlabel("Position of the gold document before compression (1 = first)")
    ax.set_ylabel("Forced-choice accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _finish(fig, title or f"Position curves at a budget of {budget} tokens", ax)


@styled
def diagnosis_curves(measures_by_model, title: str | None = None):
    """Notebook 07, one panel per measure against the depth where the gold really started (its first token's
    depth in the document region, averaged over the prompts): the gold's margin (the primary measure under
    forced choice, t 95% over cases), accuracy (Wilson 95%), and the wrong-source and abstention rates; one
    colour per model. The oracle and closed-book prompts are points in their own columns at the right, side by
    side, so neither hides the other; one far off the data's range is a labelled arrow at that column's edge.
    `measures_by_model` is [(model, diagnose.measures(...)), ...]."""
    import matplotlib.pyplot as plt

    has_margin = any(m["margin"].notna().any() for _, m in measures_by_model if "margin" in m)
    panels = ([("margin", "margin_low", "margin_high", "Gold margin (nats; t 95%)")] if has_margin
              else []) + [("accuracy", "ci_low", "ci_high", "Accuracy (Wilson 95%)"),
                          ("wrong_source", None, None, "Wrong-source answers (share)"),
                          ("abstained", None, None, "Abstentions (share)")]
    rows = -(-len(panels) // 2)
    fig, axes = plt.subplots(rows, 2, figsize=(8.4, 3.1 * rows), squeeze=False)
    axes = list(axes.flat)
    models = len(measures_by_model)
    first = measures_by_model[0][1]
    ticks = first[(first["placement"].notna()) & (first["length"] == 1)].sort_values("placement")
    tick_x = (100 * ticks["gold_region_depth"]).to_numpy()
    slots = {"oracle": 120.0, "closedbook": 140.0}  # the baselines' columns, right of the depth axis
    for ax, (col, lo_col, hi_col, label) in zip(axes, panels):
        spans, base = [], []
        for i, (name, m) in enumerate(measures_by_model):
            color = _c(i)
            d = m[(m["placement"].notna()) & (m["length"] == 1)].sort_values("placement")
            x = (100 * d["gold_region_depth"]).to_numpy()
            marker = "o" if lo_col else "s"
            ax.plot(x, d[col], marker=marker, color=color, label=name)
            spans.append(d[col])
            if lo_col:
                ax.fill_between(x, d[lo_col], d[hi_col], color=color, alpha=0.2)
                spans += [d[lo_col], d[hi_col]]
            for cond, at in slots.items():
                row = m[m["condition"] == cond]
                if len(row) and np.isfinite(float(row[col].iloc[0])):
                    r = row.iloc[0]
                    xi = at + (i - (models - 1) / 2) * 4
                    base.append((xi, float(r[col]), (float(r[lo_col]), float(r[hi_col])) if lo_col else None,
                                 color, cond))
        limits = (-0.02, 1.02) if col != "margin" else data_limits(*spans)
        for xi, value, ci, color, cond in base:
            if near(value, limits):
                err = None if ci is None or not np.isfinite(ci).all() else [[value - ci[0]], [ci[1] - value]]
                ax.errorbar([xi], [value], yerr=err, fmt="D" if cond == "oracle" else "v", color=color, capsize=2,
                            markersize=5)
                pad = 0.04 * (limits[1] - limits[0])
                limits = (min(limits[0], value - pad), max(limits[1], value + pad))
            else:
                top = value > limits[1]
                ax.annotate(f"{value:+.3g}\n{'↑' if top else '↓'}", xy=(xi, 0.98 if top else 0.02),
                            xycoords=("data", "axes fraction"), ha="center", va="top" if top else "bottom",
                            color=color, fontsize=8)
        ax.set_ylim(*limits)
        if col == "margin":
            ax.axhline(0, color="grey", linewidth=0.8, linestyle="-.")
        ax.axvline(108, color="grey", linewidth=0.8)
        ax.set_xticks(list(np.round(tick_x)) + list(slots.values()),
                      [f"{v:.0f}%" for v in tick_x] + ["oracle", "closed-\nbook"])
        ax.set_xlim(-5, 150)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    n = counts(r.n for _, m in measures_by_model for r in m[m["placement"].notna() & (m["length"] == 1)].itertuples())
    cases = counts(m["cases"].max() for _, m in measures_by_model if "cases" in m)
    for ax in axes[len(panels) - 2:len(panels)]:
        ax.set_xlabel(f"Depth where the gold starts in the document region\n"
                      f"n = {n} prompts per depth" + (f" ({cases} cases)" if cases else ""))
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(1, models), frameon=False, bbox_to_anchor=(0.5, -0.02))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return floor_fonts(fig, rect=(0, 0.06, 1, 1))


@styled
def lever_curves(table, title: str | None = None, chance: float | None = None, columns: int = 3):
    """Notebook 08: one small panel per lever (a `levers.by_position` table on one measure), the lever's mean by
    the gold's rank in the retrieved list with its 95% band beside the baseline's (black), so no lever's range
    squeezes another's; each panel's y range is set by its own two curves, and says its n."""
    import matplotlib.pyplot as plt

    m = as_measure(table["measure"].iloc[0])
    names = [lv for lv in dict.fromkeys(table["lever"]) if lv != "baseline"]
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.9 * columns, 2.6 * rows), squeeze=False, sharex=True)
    base = table[table["lever"] == "baseline"].sort_values("position")
    ranks = sorted(table["position"].unique() + 1)
    for k, ax in enumerate(axes.flat):
        if k >= len(names):
            ax.set_visible(False)
            continue
        lever = names[k]
        for g, color, label in ((base, "#000000", "baseline"),
                                (table[table["lever"] == lever].sort_values("position"), _c(0), "the lever")):
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


@styled
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
    fig, axes = plt.subplots(1, len(names), figsize=(4.3 * len(names), 0.28 * k * len(levers) + 1.8), squeeze=False,
                             sharey=True)
    for ax, name in zip(axes[0], names):
        m = as_measure(name)
        for j, estimand in enumerate(estimands):
            e = changes[(changes["measure"] == name) & (changes["estimand"] == estimand)].set_index("lever").reindex(levers)
            y = (len(levers) - 1 - np.arange(len(levers))) * (k + 1) + (k - 1 - j)
            mid, lo, hi = (m.scale(e[c].to_numpy(dtype=float)) for c in ("change", "change_low", "change_high"))
            ax.errorbar(mid, y, xerr=[mid - lo, hi - mid], fmt="s" if j == 0 else "o", color=_c(j - 1) if j else "#000000",
                        capsize=2, markersize=5, label=f"{estimand}" + (" (edges minus middle)" if j == 0 else ""))
        ax.axvline(0, color="grey", linestyle="--", linewidth=1)
        ax.set_yticks((len(levers) - 1 - np.arange(len(levers))) * (k + 1) + (k - 1) / 2, levers)
        n = int(changes.loc[changes["measure"] == name, "n"].max())
        ax.set_xlabel(f"Lever minus baseline\non the {m.name} ({m.unit}),\n95% paired t, n = {n} questions", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _finish(fig, title)
