"""Attention studies over a sweep's own prompts (notebook 03): attention on every document per layer,
troughs by position, the positional bias (documents rotated through the positions; after Hsieh et al.,
*Found in the Middle*), calibrated relevance and the gold's recall, attention joined to the sweep's
outcomes, sinks by prompt length, attention as a retriever's scores, and each document's mass for attention
sorting.  Tables have one row per example, gold position, document and layer; layers and heads are 0-based."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .attention import profile, sinks
from .errors import ConfigError, StatsError
from .experiment import docs_for_length, load_examples, prompt_for
from .models import LoadedModel
from .prompts import Prompt, Variant, render
from .stats import mean_interval, proportion_interval, wilson_interval


def _check_window(lm: LoadedModel, prompt: Prompt) -> None:
    if prompt.manifest.num_tokens > lm.window:
        raise ConfigError(f"prompt {prompt.example_id} has {prompt.manifest.num_tokens} tokens, over the model's "
                          f"window of {lm.window}; use fewer documents.")


def _doc_rows(lm: LoadedModel, prompt: Prompt, queries, extra: dict, gold_index: int | None,
              by_head: bool = False) -> dict:
    """Attention mass on each document of one prompt, per layer (head-averaged) or per layer and head, as
    columns."""
    _check_window(lm, prompt)
    docs = profile(lm, prompt, queries=queries).documents  # [layer, head, doc]
    if not by_head:
        docs = docs.mean(axis=1, keepdims=True)
    n_layers, n_heads, n_docs = docs.shape
    m = prompt.manifest
    tokens = np.array([e - s for s, e in m.doc_spans])
    n = n_layers * n_heads * n_docs
    same = {**extra, "prompt_sha256": m.sha256, "prompt_tokens": m.num_tokens}  # one value for every row
    heads = {"head": np.tile(np.repeat(np.arange(n_heads), n_docs), n_layers)} if by_head else {}
    return {**{k: [v] * n for k, v in same.items()},
            "doc_position": np.tile(np.arange(n_docs), n_layers * n_heads),
            "layer": np.repeat(np.arange(n_layers), n_heads * n_docs), **heads,
            "doc_id": list(m.doc_ids) * n_layers * n_heads,
            "is_gold": np.tile(np.arange(n_docs) == (-1 if gold_index is None else gold_index), n_layers * n_heads),
            "doc_tokens": np.tile(tokens, n_layers * n_heads), "mass": docs.ravel(),
            "per_token": (docs / tokens).ravel()}


def _frame(parts: list[dict]):
    import pandas as pd

    return pd.concat([pd.DataFrame(p) for p in parts], ignore_index=True)


def document_attention(lm: LoadedModel, config, queries="last", examples=None, progress: bool = True):
    """Attention on every document of every prompt of a position sweep (`config`: a SweepConfig; its
    examples, gold positions and template), one row per example, gold position, document and layer:
    `mass` (head-averaged, from the `queries` tokens) and `per_token` (mass / the document's tokens).
    The prompts are the sweep's own, so rows join its records on (example_id, position, prompt_sha256)."""
    from tqdm.auto import tqdm

    examples = load_examples(config) if examples is None else list(examples)
    if not examples or not config.positions:
        raise ConfigError("document_attention needs at least one example and one gold position.")
    jobs = [(e, p) for e in examples for p in config.positions]
    parts = []
    for e, p in tqdm(jobs, desc="attention", disable=not progress):
        prompt = prompt_for(e, "documents", p, config, lm.tokenizer)
        parts.append(_doc_rows(lm, prompt, queries, {"example_id": e.id, "position": p},
                               prompt.manifest.gold_index))
    return _frame(parts)


def position_bias(lm: LoadedModel, config, examples=None, queries="last", progress: bool = True,
                  by_head: bool = True, variant: Variant | None = None):
    """Positional attention bias, measured by rotation (a Latin square): each example's documents are shown in
    each cyclic rotation, so every document visits every position once, in the study's layout (`variant`,
    default the `config`'s template, question placement and chat).  One row per example, rotation, position
    and layer (and head, unless `by_head=False` averages them) with the `mass` the `queries` tokens give the
    document there; `slot_bias` turns it into the bias.

    Why rotation: if a head's attention logit on a document's keys is its content plus b_k for position k, the
    document's log mass at k is b_k + content(document) - log Z, so averaging log mass at k over a full rotation
    cancels every document's content, its length with it (each document visits k once), and each prompt's
    normaliser, leaving b_k + a constant.  No content-free stand-in is needed (Found in the Middle's dummy
    document: a short one gets several times a real document's attention per token, whatever its position),
    and the bias is in the logit units of the very head it was measured in.  `attrs["litm"]` records the
    model's weights, the prompt layout (which `interventions.calibration` checks), the estimator, queries,
    examples, rotations and the documents' token lengths (recorded, not checked: the estimator cancels length)."""
    from tqdm.auto import tqdm

    from .interventions import prompt_layout, weights_fingerprint

    examples = load_examples(config) if examples is None else list(examples)
    if not examples:
        raise ConfigError("position_bias needs at least one example.")
    variant = variant or Variant(query_aware=config.query_aware, template=config.template,
                                 template_dir=config.data_dir, chat=config.chat)
    parts, layouts, tokens = [], set(), []
    jobs = [(e, r) for e in examples for r in range(len(e.documents))]
    for e, r in tqdm(jobs, desc="bias", disable=not progress):
        prompt = render(replace(e, documents=e.documents[r:] + e.documents[:r]), lm.tokenizer, variant)
        layouts.add(tuple(sorted(prompt_layout(prompt).items())))
        tokens += [end - start for start, end in prompt.manifest.doc_spans]
        parts.append(_doc_rows(lm, prompt, queries, {"example_id": e.id, "rotation": r}, None, by_head))
    if len(layouts) > 1:
        raise ConfigError("the examples give prompts of different layouts (numbers of documents); estimate the bias "
                          "for one layout at a time.")
    layout = dict(layouts.pop())
    out = _frame(parts).drop(columns=["is_gold"])
    out.attrs["litm"] = {"model": weights_fingerprint(lm) if lm.identity.get("weights") else None, "layout": layout,
                         "estimator": "rotation", "queries": queries if isinstance(queries, str) else str(queries),
                         "examples": [e.id for e in examples], "rotations": layout["documents"],
                         "doc_tokens": {"mean": float(np.mean(tokens)), "min": int(min(tokens)),
                                        "max": int(max(tokens))}}
    return out


def slot_bias(bias, by_head: bool = True) -> np.ndarray:
    """The positional bias `[layer, head, position]` in nats from a `position_bias` table: the log mass at each
    position averaged over examples and rotations, centred to mean 0 over positions; per head, or with
    `by_head=False` from the head-averaged mass (one head).  NaN where a position got no attention (a
    sliding window that does not reach it); the centring is over the positions that did."""
    if by_head and "head" not in bias:
        raise ConfigError("a per-head bias needs a table measured with position_bias(..., by_head=True).")
    heads = ["head"] if by_head else []
    mass = bias.groupby(["example_id", "rotation", "layer"] + heads + ["doc_position"])["mass"].mean()
    with np.errstate(divide="ignore"):
        logs = np.log(mass).groupby(["layer"] + heads + ["doc_position"]).mean()
    index = [logs.index.get_level_values(k).to_numpy() for k in logs.index.names]
    out = np.full([int(i.max()) + 1 for i in index], np.nan)
    out[tuple(index)] = logs.to_numpy()
    out = np.ma.masked_invalid(out if by_head else out[:, None, :])
    return (out - out.mean(axis=-1, keepdims=True)).filled(np.nan)


def position_awareness(bias, kv_heads: int) -> np.ndarray:
    """How position-aware each key-value head is, `[layer, kv head]`: the standard deviation over positions of
    the head's bias in nats (`slot_bias` of a `position_bias(..., by_head=True)` table), averaged over the
    query heads that share the key head; 0 where no document is in reach.  Scale-free, as the coefficient of
    variation of attention was: a head whose logits move with position is position-aware; Ms-PoE gives such
    heads the smallest ratios (`interventions.ratios_from_awareness`)."""
    spread = np.ma.masked_invalid(slot_bias(bias)).std(axis=-1).filled(0.0)  # [layer, head]
    n_heads = spread.shape[1]
    if n_heads % kv_heads:
        raise ConfigError(f"{n_heads} heads do not split into {kv_heads} key-value heads.")
    return spread.reshape(len(spread), kv_heads, n_heads // kv_heads).mean(axis=2)


def _layers(df, layers):
    have = sorted(df["layer"].unique())
    if layers is None:
        return have
    chosen = list(range(len(have)))[layers] if isinstance(layers, slice) else [int(x) for x in layers]
    missing = sorted(set(chosen) - set(have))
    if not chosen or missing:
        raise ConfigError(f"layers {missing or chosen} are not in the table (it has layers 0..{max(have)}).")
    return chosen


def troughs(doc_att, value: str = "mass", layers=None, by_layer: bool = True, include_gold: bool = False):
    """Mean attention on a document by its position (1-based `doc_position` + 1 is the document number),
    with a t 95% interval over examples (each example's prompts averaged first, so examples count once).
    Per layer when `by_layer`, else averaged over `layers`.  Distractors only unless `include_gold`:
    the gold attracts attention for its content, which would mix relevance into the position curve."""
    import pandas as pd

    d = doc_att[doc_att["layer"].isin(_layers(doc_att, layers))]
    if not include_gold:
        d = d[~d["is_gold"]]
    keys = ["layer", "doc_position"] if by_layer else ["doc_position"]
    per_example = d.groupby(keys + ["example_id"])[value].mean().reset_index()
    rows = []
    for key, g in per_example.groupby(keys):
        m, lo, hi = mean_interval(g[value].to_numpy())
        rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "mean": m, "ci_low": lo,
                     "ci_high": hi, "n": len(g)})
    return pd.DataFrame(rows)


def relevance_scores(doc_att, bias=None, layers=None, value: str = "per_token"):
    """Each document's attention score in each prompt (mean of `value` over `layers`), and, with a
    `position_bias` table, the calibrated score: log `value` minus the head-averaged bias at its position
    (`slot_bias`, nats), averaged over `layers`."""
    chosen = _layers(doc_att, layers)
    keys = ["example_id", "position", "doc_position", "doc_id", "is_gold"]
    d = doc_att[doc_att["layer"].isin(chosen)].rename(columns={value: "vanilla"})
    columns = ["vanilla"]
    if bias is not None:
        b = slot_bias(bias, by_head=False)[:, 0, :]  # [layer, position]
        layer, pos = d["layer"].to_numpy(), d["doc_position"].to_numpy()
        known = (layer < b.shape[0]) & (pos < b.shape[1])
        at = np.full(len(d), np.nan)
        at[known] = b[layer[known], pos[known]]
        missing = sorted(set(pos[~np.isfinite(at)].tolist()))
        if missing:
            raise ConfigError(f"the bias table has no estimate for document positions {missing} in layers {chosen}; "
                              "estimate it with the same number of documents, in layers that reach every document.")
        with np.errstate(divide="ignore"):
            d = d.assign(bias=at, calibrated=np.log(d["vanilla"].to_numpy()) - at)
        columns += ["bias", "calibrated"]
    return d.groupby(keys)[columns].mean().reset_index()


def recall_by_position(scores, ks=(1, 3)):
    """Recall@k of the gold document when each prompt's documents are ranked by attention (vanilla and,
    when present, calibrated), by gold position, with Wilson 95% intervals."""
    import pandas as pd

    rows = []
    for method in [m for m in ("vanilla", "calibrated") if m in scores]:
        rank = scores.groupby(["example_id", "position"])[method].rank(ascending=False, method="first")
        gold = scores.assign(rank=rank)[scores["is_gold"]]
        if gold.empty:
            raise ConfigError("no gold document in the scores: recall needs the sweep's prompts.")
        for pos, g in gold.groupby("position"):
            for k in ks:
                hit = int((g["rank"] <= k).sum())
                lo, hi = wilson_interval(hit, len(g))
                rows.append({"method": method, "position": int(pos), "k": k, "recall": hit / len(g),
                             "ci_low": lo, "ci_high": hi, "n": len(g)})
    return pd.DataFrame(rows)


def join_outcomes(scores, records, score: str = "vanilla"):
    """Each prompt's attention on its gold document (from `relevance_scores`) beside its sweep record
    (correct, gold log-likelihood); the prompts must be the same ones (checked by prompt hash)."""
    gold = scores[scores["is_gold"]][["example_id", "position", score]].rename(columns={score: "gold_attention"})
    rec = records[(records["condition"] == "documents") & (records["status"] == "ok")]
    rec = rec[["example_id", "position", "correct", "gold_loglik", "prompt_sha256"]].astype({"position": int})
    joined = gold.merge(rec, on=["example_id", "position"], how="left", validate="one_to_one")
    missing = joined["correct"].isna().sum()
    if missing:
        raise ConfigError(f"{missing} attention rows have no sweep record; run the sweep with the same config "
                          "(examples and positions) first.")
    return joined


def check_same_prompts(doc_att, records) -> None:
    """Raise unless every attention prompt is the prompt the sweep scored (same token hash)."""
    a = doc_att.drop_duplicates(["example_id", "position"])[["example_id", "position", "prompt_sha256"]]
    r = records[records["condition"] == "documents"][["example_id", "position", "prompt_sha256"]]
    m = a.merge(r.astype({"position": int}), on=["example_id", "position"], how="inner", suffixes=("", "_sweep"))
    bad = m[m["prompt_sha256"] != m["prompt_sha256_sweep"]]
    if len(bad):
        raise ConfigError(f"{len(bad)} prompts differ between the attention table and the sweep records "
                          "(template, chat or data changed); use the sweep's own config for both.")


def attention_and_accuracy(joined):
    """By gold position: accuracy (Wilson 95%), mean attention on the gold (t 95%), and that attention
    when the answer was right and when it was wrong, with their difference."""
    import pandas as pd

    rows = []
    for pos, g in joined.groupby("position"):
        ok = g["correct"].astype(bool)
        acc, lo, hi = proportion_interval(ok)
        m, alo, ahi = mean_interval(g["gold_attention"].to_numpy())
        rows.append({"position": int(pos), "n": len(g), "accuracy": acc, "ci_low": lo, "ci_high": hi,
                     "attention": m, "attention_ci_low": alo, "attention_ci_high": ahi,
                     "attention_if_right": g.loc[ok, "gold_attention"].mean(),  # nan when none was right
                     "attention_if_wrong": g.loc[~ok, "gold_attention"].mean()})
    return pd.DataFrame(rows)


def attention_outcome_model(joined):
    """Logistic GEE of correctness on the gold's attention (standardised) and the gold position (as a
    category), clustered by question: does attention predict a right answer beyond position?  Returns
    the odds ratio per standard deviation of attention with its 95% interval and p-value."""
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    d = joined.dropna(subset=["correct", "gold_attention"])
    sd = d["gold_attention"].std()
    if d["example_id"].nunique() < 2 or d["correct"].nunique() < 2 or not sd > 0:
        raise StatsError("the model needs at least two questions, right and wrong answers, and attention that "
                         "varies.")
    d = d.assign(y=d["correct"].astype(float), z=(d["gold_attention"] - d["gold_attention"].mean()) / sd,
                 g=d["example_id"].astype(str), pos=d["position"].astype(int))
    formula = "y ~ z + C(pos)" if d["pos"].nunique() > 1 else "y ~ z"
    try:
        fit = smf.gee(formula, "g", d, family=sm.families.Binomial(), cov_struct=sm.cov_struct.Exchangeable()).fit()
    except (np.linalg.LinAlgError, ValueError) as err:
        raise StatsError(f"the model could not be fitted on {len(d)} rows ({err}); use more questions.") from err
    lo, hi = fit.conf_int().loc["z"]
    return {"odds_ratio_per_sd": float(np.exp(fit.params["z"])), "ci_low": float(np.exp(lo)),
            "ci_high": float(np.exp(hi)), "p_value": float(fit.pvalues["z"]), "n": len(d),
            "questions": int(d["g"].nunique())}


def sinks_by_length(lm: LoadedModel, config, lengths, progress: bool = True):
    """Sinks (`sinks`) of one example's prompt at each target length in tokens (documents added from one
    generated pool or the data file, the gold first): one row per length, layer and head."""
    import pandas as pd
    from tqdm.auto import tqdm

    sizes = {L: docs_for_length(config, lm.tokenizer, L) for L in lengths}
    pool = max(sizes.values())
    rows = []
    for L in tqdm(list(lengths), desc="sinks", disable=not progress):
        cfg = replace(config, num_docs=sizes[L], limit=1, positions=(0,),
                      generate_docs=pool if config.data == "generated" else None)
        prompt = prompt_for(load_examples(cfg)[0], "documents", 0, cfg, lm.tokenizer)
        _check_window(lm, prompt)
        s = sinks(lm, prompt)
        layers, heads = s.first.shape
        rows.append(pd.DataFrame({"target_length": L, "num_tokens": s.num_tokens,
                                  "layer": np.repeat(np.arange(layers), heads), "head": np.tile(np.arange(heads), layers),
                                  "first": s.first.ravel(), "first_four": s.first_four.ravel()}))
    return pd.concat(rows, ignore_index=True)


def attention_scores(lm: LoadedModel, example, bias=None, layers=None, queries="question", variant=None,
                     value: str = "per_token") -> np.ndarray:
    """A retriever's scores from the model's own attention: each document of `example`, in its given order,
    scored by its head-averaged attention (`value`: per token or total mass, averaged over `layers`) from
    the `queries` tokens, or, when a `position_bias` table is given, by the calibrated relevance of Hsieh et
    al. (`relevance_scores`: log attention minus the bias at its position).  Aligned with `example.documents`."""
    prompt = render(example, lm.tokenizer, variant or Variant())
    rows = _frame([_doc_rows(lm, prompt, queries, {"example_id": example.id, "position": -1}, None)])
    s = relevance_scores(rows, bias, layers, value).sort_values("doc_position")
    return s["calibrated" if bias is not None else "vanilla"].to_numpy()


def document_masses(lm: LoadedModel, variant: Variant | None = None, layers=None):
    """An `attend` for `ordering.attention_sort`: a function of an example that renders it (`variant`, default
    `Variant()`), profiles one pass from the prompt's last token, and returns each document's attention mass
    (summed over its tokens) averaged over `layers` (default: every full-attention layer) and all heads, in
    the example's order.  Sliding-window layers are left out by default since their last row cannot see
    every document."""
    from .interventions import full_attention_layers

    variant = variant or Variant()
    if variant.parallel:
        raise ConfigError("attention sorting profiles one ordinary pass over the prompt; render it without "
                          "parallel=True.")
    n_layers, full = lm.text_config.num_hidden_layers, full_attention_layers(lm)
    if layers is None:
        chosen = list(full)
        if not chosen:
            raise ConfigError(f"{lm.name!r} has no layer that attends over the whole prompt; name the layers to "
                              "read with layers=[...].")
    else:
        chosen = list(range(n_layers))[layers] if isinstance(layers, slice) else [int(x) for x in layers]
        if not chosen or any(not 0 <= x < n_layers for x in chosen):
            raise ConfigError(f"layers {chosen} must be a non-empty choice of 0..{n_layers - 1}.")

    def attend(example) -> list[float]:
        prompt = render(example, lm.tokenizer, variant)
        ids = tuple(d.id for d in example.documents)
        if tuple(prompt.manifest.doc_ids) != ids:
            raise ConfigError(f"the prompt of {example.id} shows documents {list(prompt.manifest.doc_ids)}, not the "
                              f"example's {list(ids)}; use a variant with condition='documents'.")
        _check_window(lm, prompt)
        docs = profile(lm, prompt, queries="last").documents  # [layer, head, doc]
        return [float(x) for x in docs[chosen].mean(axis=(0, 1))]

    return attend


def describe(sink_table, curve, joined, recall, middle: int) -> str:
    """Notebook 03's result in words, from its tables: the sink at the longest prompt (`sinks_by_length`), the
    distractors' attention by position over the relevance layers (`troughs(..., by_layer=False)`), whether
    attention on the gold predicts a right answer beyond its position (`attention_outcome_model` on `joined`),
    and Recall@1 of plain and calibrated attention with the gold at `middle` (0-based, `recall_by_position`)."""
    longest = sink_table[sink_table["num_tokens"] == sink_table["num_tokens"].max()]
    tokens, heads = int(longest["num_tokens"].iloc[0]), len(longest)
    lines = [f"Sinks: at {tokens} tokens the first token gets {longest['first'].mean():.0%} of each token's attention "
             f"(mean over {heads} layer-heads; an even share would be {1 / tokens:.2%}), and "
             f"{int((longest['first'] > 0.5).sum())} of the {heads} put over half of theirs there."]
    c = curve.sort_values("doc_position")
    edges, inner = c.iloc[[0, -1]], c.iloc[1:-1]
    low = inner.loc[inner["mean"].idxmin()]
    ratio = inner["mean"].mean() / edges["mean"].mean()
    lines.append(f"Troughs: a distractor in the middle (documents 2-{len(c) - 1}) gets {ratio:.2f} times the attention "
                 f"of one first or last, least at document {int(low['doc_position']) + 1} ({low['mean']:.4f}, t 95% "
                 f"[{low['ci_low']:.4f}, {low['ci_high']:.4f}], n = {int(low['n'])} questions)"
                 + (": a trough." if ratio < 1 else ": no trough."))
    try:
        o = attention_outcome_model(joined)
        reading = ("more attention on the gold goes with a right answer, beyond where the gold sits" if o["ci_low"] > 1
                   else "more attention on the gold goes with a wrong answer" if o["ci_high"] < 1
                   else "the interval includes 1, so these prompts cannot tell whether it predicts the answer")
        lines.append(f"Attention and the answer: odds ratio {o['odds_ratio_per_sd']:.2f} per standard deviation of the "
                     f"gold's attention, 95% [{o['ci_low']:.2f}, {o['ci_high']:.2f}], p = {o['p_value']:.2g} "
                     f"({o['n']} prompts of {o['questions']} questions, clustered by question): {reading}. An "
                     "association, not a cause: notebook 08 changes the attention and watches the answer.")
    except StatsError as err:
        lines.append(f"Attention and the answer: not fitted ({err})")
    at = recall[(recall["k"] == 1) & (recall["position"] == middle)].set_index("method")
    if "calibrated" in at.index:
        v, cal = at.loc["vanilla"], at.loc["calibrated"]
        apart = cal["ci_low"] > v["ci_high"] or v["ci_low"] > cal["ci_high"]
        lines.append(f"Calibration: with the gold at document {middle + 1}, calibrated attention ranks it first in "
                     f"{round(cal['recall'] * cal['n'])} of {int(cal['n'])} prompts ({cal['recall']:.0%}, Wilson 95% "
                     f"[{cal['ci_low']:.0%}, {cal['ci_high']:.0%}]), plain attention in {round(v['recall'] * v['n'])} "
                     f"({v['recall']:.0%}, [{v['ci_low']:.0%}, {v['ci_high']:.0%}]): "
                     + ("the intervals do not overlap, so removing the positional bias finds the middle gold more often."
                        if apart else "the intervals overlap; more questions would tell them apart."))
    return "\n".join(lines)
