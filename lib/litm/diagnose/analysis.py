"""What a diagnosis measures: per placement accuracy, support, wrong-source and abstention rates, where
the gold really sat, the Latin square's balance, and the placement effects adjusted for a conflicting
neighbour (cluster-robust t intervals over cases): the middle penalty, each edge against the middle, and the
trend over depth."""
from __future__ import annotations

import numpy as np

from .. import stats


def measures(df):
    """Per placement (and length) and for the baselines: accuracy with its Wilson interval, the gold's margin
    with a t interval over cases (forced choice), supported accuracy, wrong-source and abstention rates, how
    often the gold made it into the prompt, where it started (token offset, and depth within the document
    region) and the prompt length."""
    import pandas as pd

    rows = []
    for (length, p), g in df[df["condition"] == "documents"].groupby(["length", "placement"]):
        rows.append(_measure_row(g, f"{100 * g['depth'].iloc[0]:.0f}%", int(length), int(p)))
    for cond in ("oracle", "closedbook"):
        g = df[df["condition"] == cond]
        if len(g):
            rows.append(_measure_row(g, cond, 1, None))
    return pd.DataFrame(rows)


def _measure_row(g, label, length, placement) -> dict:
    import pandas as pd

    def mean(x) -> float:  # nan without a value
        return float(x.mean()) if x.notna().any() else float("nan")

    ok = g[g["status"] == "ok"]
    acc, lo, hi = stats.proportion_interval(ok["correct"].astype(bool))  # scored prompts: never None
    sup = ok["supported"].dropna() if "supported" in ok else []
    # the margin (forced choice): each case's mean over its orders, then a t interval over cases, the unit the
    # verdict reads (a case's prompts share their documents, so they are not independent)
    margins = ok.assign(m=pd.to_numeric(ok["gold_margin"], errors="coerce")).groupby("case_id")["m"].mean().dropna() \
        if "gold_margin" in ok else []
    margin = stats.mean_interval(margins) if len(margins) else (float("nan"),) * 3
    return {"condition": label, "length": length, "placement": placement, "n": len(g), "scored": len(ok),
            "cases": int(g["case_id"].nunique()), "accuracy": acc, "ci_low": lo, "ci_high": hi,
            "margin": margin[0], "margin_low": margin[1], "margin_high": margin[2],
            "supported": float(np.mean(sup.astype(bool))) if len(sup) else float("nan"),
            "wrong_source": mean(ok["wrong_source"]), "abstained": mean(ok["abstained"]),
            "gold_in_prompt": float(g["gold_in_prompt"].mean()), "gold_token_start": mean(g["gold_token_start"]),
            "gold_region_depth": mean(g["gold_region_depth"]), "prompt_tokens": float(g["prompt_tokens"].mean()),
            "tokens_min": int(g["prompt_tokens"].min()), "tokens_max": int(g["prompt_tokens"].max())}


def adjacency_counts(df, length: int = 1):
    """How often each distractor sat right next to the gold, per placement (the Latin square's balance)."""
    import pandas as pd

    d = df[(df["condition"] == "documents") & (df["length"] == length)]
    rows = [{"case_id": r.case_id, "placement": r.placement, "document": n}
            for r in d.itertuples() for n in r.neighbours]
    return pd.DataFrame(rows).groupby(["case_id", "placement", "document"]).size().unstack("placement", fill_value=0)


def length_spread(df):
    """Per case and length: how far apart (tokens, and as a share of the mean) its prompts with documents are
    across placements and orders; only the order of the documents differs, so this stays small."""
    d = df[df["condition"] == "documents"]
    g = d.groupby(["case_id", "length"])["prompt_tokens"]
    out = (g.max() - g.min()).rename("tokens").to_frame()
    out["share"] = out["tokens"] / g.mean()
    return out.reset_index()


def case_table(df, length: int = 1, value: str = "correct") -> stats.PairedTable:
    """Cases x placements: each case's accuracy (or another record field, `value`) at each placement (mean
    over seeds and orders), cases with a prompt at every placement only."""
    d = df[(df["condition"] == "documents") & (df["length"] == length) & (df["status"] == "ok") & df["gold_in_prompt"]]
    wide = d.pivot_table(index="case_id", columns="placement", values=value, aggfunc="mean")
    placements = sorted(df.loc[df["condition"] == "documents", "placement"].dropna().astype(int).unique())
    wide = wide.reindex(columns=placements).astype(float)
    full = wide.dropna()
    return stats.PairedTable(tuple(full.index), tuple(int(p) for p in placements), full.to_numpy(),
                             dropped=len(wide) - len(full))


def trend_weights(depths) -> np.ndarray:
    """The trend over depth as weights over placements: the least-squares slope of the placements' values on
    their relative depth, times the distance from the first depth to the last, so it reads as the change from
    the first placement to the last along a straight line (> 0: rises with depth, recency; < 0: primacy)."""
    d = np.asarray(depths, dtype=float)
    c = d - d.mean()
    return c / (c @ c) * (d[-1] - d[0])


def case_effects(df, value: str = "correct", length: int = 1):
    """Each case's middle penalty and trend over depth on a record field, from its placements' means (not
    adjusted for a conflicting neighbour): one value per case, for a pilot's plan and a study's conclusion."""
    import pandas as pd

    table = case_table(df, length, value)
    docs = df[df["condition"] == "documents"]
    depths = docs.groupby("placement")["depth"].first().reindex(list(table.conditions)).to_numpy()
    return pd.DataFrame({"penalty": stats.question_penalties(table), "trend": table.values @ trend_weights(depths)},
                        index=pd.Index(table.ids, name="case_id"))


def placement_effects(rows, value: str = "correct") -> dict | None:
    """A measure by placement adjusted for a conflicting neighbour: a linear model of `value` (correctness by
    default: a linear probability model; or the gold's margin or log-likelihood) on one indicator per
    placement plus "a conflicting document is next to the gold", fitted to every scored prompt with the
    gold, with cluster-robust t intervals over cases (a case's prompts are one cluster; `stats.cluster_contrast`).

    Returns the adjusted value at each placement (`values`, at `depths`), the middle penalty (mean of the edge
    placements minus the middle's), each edge minus the middle (`first`, `last`), the trend over depth
    (`trend_weights`), the neighbour's effect (None when it never varies or cannot be told apart from
    placement) and the adjusted edge and middle values; None when fewer than 2 cases or 3 placements are
    there."""
    placements = sorted(int(p) for p in rows["placement"].dropna().unique())
    cases = sorted(rows["case_id"].unique())
    if len(placements) < 3 or len(cases) < 2:
        return None
    complete = [c for c in cases if set(rows.loc[rows["case_id"] == c, "placement"].astype(int)) == set(placements)]
    if len(complete) < 2:
        return None
    rows = rows[rows["case_id"].isin(complete)]
    adjacent = rows["conflict_adjacent"].astype(bool).to_numpy()
    X = np.stack([(rows["placement"].astype(int) == p).to_numpy() for p in placements], axis=1).astype(float)
    note, with_adj = "adjusted for a conflicting neighbour", adjacent.any() and not adjacent.all()
    if with_adj:
        Xa = np.column_stack([X, adjacent.astype(float)])
        if np.linalg.matrix_rank(Xa) < Xa.shape[1]:
            with_adj, note = False, "a conflicting neighbour goes with the placement itself, so it is not adjusted for"
        else:
            X = Xa
    else:
        note = "no conflicting documents to adjust for" if not adjacent.any() else "every prompt has a conflicting neighbour"
    y = rows[value].astype(float).to_numpy()
    clusters = rows["case_id"].to_numpy()
    depths = rows.groupby("placement")["depth"].first().reindex(placements).to_numpy(dtype=float)
    edges, middle = stats.edges_and_middle(placements)

    def estimate(w) -> stats.Estimate:  # weights on the placements (and the neighbour, when given)
        e = stats.cluster_contrast(X, y, clusters, np.concatenate([w, np.zeros(X.shape[1] - len(w))]))
        if max(abs(e.low), abs(e.high)) > 1e-9 * max(1.0, float(np.abs(y).max())):
            return e
        return stats.Estimate(0.0, 0.0, 0.0, 1.0, e.n, e.level, e.method)  # no difference: rounding is not one

    one = np.eye(len(placements))
    mid = -(np.isin(placements, middle) / len(middle))
    beta = np.linalg.lstsq(X, y, rcond=None)[0]
    return {"values": beta[:len(placements)], "depths": depths,
            "penalty": estimate(stats.penalty_weights(placements, placements)),
            "first": estimate(one[0] + mid), "last": estimate(one[-1] + mid), "trend": estimate(trend_weights(depths)),
            "adjacent": estimate(np.eye(X.shape[1])[-1]) if with_adj else None,
            "note": note, "edges": float(np.mean([beta[placements.index(p)] for p in edges])),
            "middle": float(np.mean([beta[placements.index(p)] for p in middle]))}
