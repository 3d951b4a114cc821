"""Inference-time interventions inside the model: registered attention functions (the `AttentionInterface`
mechanism the attention profile uses), switched on for a loaded model by `intervene(lm, ...)`.  Inside the
context every forward pass of that model (sweeps, forced choice, generation) runs with the intervention,
and its parameters join the model's run identity, so its records are stored apart from the plain model's.

Positional rescaling (after Ms-PoE, Zhang et al. 2024): attention heads see positions divided by a ratio of
their own, so the middle of a long prompt sits closer, in rotary terms, to what the head attends from.
Rotary embeddings compose: a query or key already rotated to position p, rotated again by (p / r - p)
times each frequency, is the one rotated to p / r.  So the function applies that one extra rotation to the
layer's post-rotary queries and keys and calls the stock SDPA kernel, without copying the model's code.
A key is stored once for the query heads that share it (grouped-query attention), so the ratio is one per
key-value head (per head in a model without grouping, as in Ms-PoE), the same in every layer or one set per
layer.  The new keys of each call are rotated where the KV cache holds them, so later calls (forced-choice
candidates, decoding) read every key at its rescaled position and only the new tokens' positions (the
call's position ids) are ever needed.

Attention calibration (after *Found in the Middle*, Hsieh et al. 2024): in the chosen layers, the scored
rows (the prompt's last token and every token after it: answer tokens under log-likelihood and forced
choice, generated tokens) have, in each head, the weights on document k's keys multiplied by
exp(-strength * bias[head, k]) and the row's document weights rescaled to keep its total document mass; the
other keys are untouched.  The bias is in nats, measured by rotating held-out documents through the positions
(`attention_study.position_bias`), so at strength 1 it removes an additive per-position logit term exactly.
There is no temperature: the paper's softmax((attention per token - bias) / T) shares one T across layers
whose attention per token differs several-fold, and its bias came from a content-free document whose
attention per token follows its length as much as its position; in log space each head's own logit scale is
its temperature.
Those rows' outputs are recomputed from the rescaled weights; every other row keeps the SDPA kernel's.  The
documents' token spans come from the prompts the runner scores (`scoring`), so calibration runs through
`litm.runner`.

Channel scaling (after Yu et al. 2024, "Mitigate Position Bias in Large Language Models via Scaling a Single
Dimension", arXiv 2406.02536, and their code, aka.ms/PositionalHidden): a few channels of the hidden state
change monotonically with position (the causal mask writes position into them), and multiplying one such
channel by a factor in [-1, 1] flattens the attention's preference for the prompt's beginning.  As in their
code, the channel is scaled in the attention's input (the normalised hidden state the projections read) of the
chosen layers, and only for the scored rows' attention: their queries and the keys they read (every token's)
come from the scaled input; values, the residual stream and every other row stay the plain model's.  A forward
pre-hook on each chosen attention module keeps its input; the attention function forms the scaled queries and
keys with the module's own projections, norms and rotary embedding, stores the scaled keys where the KV cache
holds them (later calls are scored rows and read them, as the paper's cache does) and recomputes the scored
rows.  `positional_channels` finds the channel; `channel_scaling` builds the intervention from its table.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .models import LoadedModel

IMPLEMENTATION = "litm_intervention"
# Architectures whose attention layers rotate queries and keys before calling the attention interface with
# the call's position ids, as transformers' Llama-family and Gemma 3 code does; checked in tests.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "gemma3_text")

_state: dict = {}
_LEAST = -3.0e38  # a masked score: float32's least, not -inf, so that a row with nothing to see stays finite


@dataclass(frozen=True)
class PositionalRescaling:
    """Positions divided by `ratios[j]` in every query head that reads key-value head j, in `layers` (all when
    None).  `ratios` is one tuple for every layer, or one tuple per model layer.  Ratios of 1 leave the model
    as it is."""

    ratios: tuple
    layers: tuple[int, ...] | None = None

    def identity(self) -> dict:
        ratios = [[float(r) for r in row] for row in self.ratios] if _per_layer(self.ratios) else \
            [float(r) for r in self.ratios]
        return {"kind": "positional_rescaling", "ratios": ratios,
                "layers": None if self.layers is None else [int(i) for i in self.layers]}


@dataclass(frozen=True)
class Calibration:
    """Attention calibration in `layers`, `bias[i][h][k]` the positional bias in nats of head h (or of every head,
    with one row) at document position k in layer `layers[i]`: the weights on document k's keys are multiplied
    by exp(-strength * bias), the row's document mass kept (0: the plain model; 1: an additive per-position
    logit term removed).  There is no temperature: the bias is on each head's own logit scale.  Build it with
    `calibration`, which records where the bias was measured (`model`: the weights' fingerprint; the prompt
    `layout`; `source`: the estimator, its queries, examples, rotations and documents' token lengths, as JSON)."""

    bias: tuple[tuple[tuple[float, ...], ...], ...]
    layers: tuple[int, ...]
    strength: float = 1.0
    by_head: bool = True
    model: str = ""
    layout: tuple[tuple[str, object], ...] = ()
    source: str = "{}"

    def identity(self) -> dict:
        digest = hashlib.sha256(json.dumps(self.bias).encode()).hexdigest()[:16]
        return {"kind": "calibration", "bias_sha256": digest, "layers": [int(i) for i in self.layers],
                "strength": float(self.strength), "by_head": bool(self.by_head), "bias_model": self.model,
                "layout": dict(self.layout), "bias_source": json.loads(self.source)}


@dataclass(frozen=True)
class ParallelDocuments:
    """Every document sees the shared prefix and itself only, from the same starting position, and what follows
    the documents sees them all (`litm.parallel`): no position effect by construction.  Score prompts rendered
    with `Variant(parallel=True)`."""

    def identity(self) -> dict:
        return {"kind": "parallel_documents", "window": "positions"}


# Channel scaling's factors.  Yu et al. searched 0.5, 0, -0.5 and -1 and chose -1 to 0.2 (Table 4); above 1 the
# channel's pull towards the beginning grows, below -1 it turns into a pull towards the end (their Figure 6).
SCALE_RANGE = (-1.0, 1.0)
CHANNEL_ROWS = ("scored", "all")


@dataclass(frozen=True)
class ChannelScaling:
    """Channel scaling in `layers` (every layer when None): channel `channels[i]` (or `channels`, one index for
    every chosen layer) of layer `layers[i]`'s attention input multiplied by `scale` in [-1, 1] (1: the plain
    model; 0, the paper's default, removes it) for the scored rows' queries and the keys they read; values, the
    residual stream and the other rows are untouched.  `rows="all"` scales it for every row's attention (the
    paper's "modify all tokens" ablation).  Build it with `channel_scaling` from `positional_channels`."""

    channels: int | tuple[int, ...]
    layers: tuple[int, ...] | None
    scale: float
    rows: str = "scored"

    def identity(self) -> dict:
        one = isinstance(self.channels, (int, np.integer))
        return {"kind": "channel_scaling", "channels": int(self.channels) if one else [int(c) for c in self.channels],
                "layers": None if self.layers is None else [int(i) for i in self.layers],
                "scale": float(self.scale), "rows": str(self.rows)}


def _per_layer(ratios) -> bool:
    return bool(ratios) and isinstance(ratios[0], (tuple, list))


def weights_fingerprint(lm: LoadedModel) -> str:
    """A short hash of the model's weights identity: a bias measured on one model is refused on another."""
    weights = lm.identity.get("weights")
    if not weights:
        raise ConfigError(f"model {lm.name!r} has no weights identity; load it with litm.load_model.")
    return hashlib.sha256(json.dumps(weights, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prompt_layout(prompt) -> dict:
    """What a positional bias depends on besides the model: the template, chat wrapping, the number of
    question occurrences (query-aware or repeated) and of documents, and how the documents are written."""
    m = prompt.manifest
    return {"template": m.template, "chat": bool(m.chat), "questions": len(m.question_spans),
            "documents": len(m.doc_spans), "doc_format": m.doc_format}


def calibration(bias_table, layers, strength: float = 1.0, by_head: bool = True) -> Calibration:
    """A `Calibration` from an `attention_study.position_bias` table measured from the last token
    (`queries="last"`, the row that predicts the answer), for `layers` (indices, or a slice of the table's
    layers): each head's own bias (`by_head`, which needs a `by_head=True` table), or the head-averaged bias
    for every head.  Per head is the default, on evidence from smollm2-135m (10 documents, two disjoint pairs of
    held-out questions, layers 15-29): a head's bias correlates across the halves at r = 0.97 (median of 135
    heads; layer medians 0.91-0.99, lowest head 0.71), the head-averaged bias at 0.94-0.99, and the heads
    differ reproducibly (each head's deviation from the layer's mean bias replicates at r = 0.94-0.99; it is
    37-94% of the head's variance over positions), so one bias for all heads would miscalibrate most."""
    from .attention_study import slot_bias

    info = getattr(bias_table, "attrs", {}).get("litm")
    if not info or info.get("estimator") != "rotation":
        raise ConfigError("this bias table does not say which model and prompt layout it was measured on; measure "
                          "it with litm.attention_study.position_bias.")
    if info["queries"] != "last":
        raise ConfigError(f"calibration acts on the rows that predict the answer, but this bias was measured from "
                          f"queries={info['queries']!r}; measure it with position_bias(..., queries='last').")
    have = sorted(int(x) for x in bias_table["layer"].unique())
    chosen = have[layers] if isinstance(layers, slice) else [int(x) for x in layers]
    missing = sorted(set(chosen) - set(have))
    if not chosen or missing:
        raise ConfigError(f"layers {missing or chosen} are not in the bias table (it has layers {have[0]}..{have[-1]}).")
    if not 0 <= strength <= 1:
        raise ConfigError(f"the strength must lie in [0, 1] (0: no calibration), not {strength}.")
    bias = slot_bias(bias_table, by_head)[chosen]  # [layer, head or 1, position]
    n_docs = int(info["layout"]["documents"])
    if bias.shape[-1] != n_docs or not np.isfinite(bias).all():
        raise ConfigError(f"the bias table lacks an estimate at some of the {n_docs} document positions in layers "
                          f"{chosen}: measure every position, and calibrate layers whose attention reaches every "
                          "document (a sliding window may not).")
    source = {k: v for k, v in info.items() if k not in ("model", "layout")}
    return Calibration(tuple(tuple(tuple(float(x) for x in head) for head in layer) for layer in bias), tuple(chosen),
                       float(strength), bool(by_head), info["model"], tuple(sorted(info["layout"].items())),
                       json.dumps(source, sort_keys=True))


def spaced_ratios(order, low: float = 1.2, high: float = 1.8) -> tuple[float, ...]:
    """Ratios evenly spaced from `low` to `high` (Ms-PoE's range is 1.2 to 1.8) and handed out in `order`: the
    first head listed gets `low`, the last `high`.  Ms-PoE orders heads by how position-aware they are;
    `order` lists every head index once."""
    order = [int(h) for h in order]
    if sorted(order) != list(range(len(order))):
        raise ConfigError(f"order must list each head 0..{len(order) - 1} once, not {order}.")
    if not 0 < low <= high:
        raise ConfigError(f"ratios must satisfy 0 < low <= high, not low={low}, high={high}.")
    step = (high - low) / max(len(order) - 1, 1)
    out = [0.0] * len(order)
    for rank, head in enumerate(order):
        out[head] = low + rank * step
    return tuple(out)


def ratios_from_awareness(awareness, low: float = 1.2, high: float = 1.8) -> tuple[tuple[float, ...], ...]:
    """Per-layer ratios for `PositionalRescaling` from `awareness[layer, kv head]` (higher: more
    position-aware, e.g. `attention_study.position_awareness`): in each layer the most position-aware head
    keeps its positions best (`low`), the least gets `high`, as Ms-PoE assigns them."""
    a = np.asarray(awareness, dtype=float)
    if a.ndim != 2 or not np.isfinite(a).all():
        raise ConfigError("awareness must be a finite [layer, key-value head] array.")
    return tuple(spaced_ratios(np.argsort(-row, kind="stable"), low, high) for row in a)


def positional_channels(lm: LoadedModel, prompts, layers=None, batch_size: int = 4):
    """For each of `layers` (all when None), the channel of the hidden state entering that layer (the residual
    stream, whose normalised copy the layer's attention reads and `ChannelScaling` scales) that follows token
    position most closely: each channel's mean over the prompts at each position (their common length, the
    shortest prompt's, so every position averages the same prompts; content averages out, position does not),
    then Spearman's rank correlation of that mean with position.  Spearman, not Pearson, because a positional
    channel is defined by monotonicity (Yu et al.'s Definition 2.1), not linearity: the running averages the
    causal mask writes rise fast and level off, and any monotone curve scores +-1; ranks also give the first
    tokens' outsized states (massive activations, which the paper leaves out) one rank each, not the fit.
    `prompts` are rendered Prompts or token-id lists.  One row per layer: the channel, its signed correlation,
    its sign, the runner-up channel and its correlation, and how many positions and prompts it rests on."""
    import pandas as pd
    import torch
    from scipy.stats import rankdata

    ids = [[int(t) for t in getattr(p, "input_ids", p)] for p in prompts]
    if not ids:
        raise ConfigError("positional_channels needs prompts to read the hidden states from.")
    n_layers = lm.text_config.num_hidden_layers
    chosen = list(range(n_layers)) if layers is None else [int(i) for i in layers]
    _check_layers(chosen, n_layers)
    if not chosen:
        raise ConfigError("choose at least one layer (None: every layer).")
    width = min(len(row) for row in ids)
    if width < 3:
        raise ConfigError(f"the shortest prompt has {width} tokens; a correlation with position needs at least 3.")
    _, blocks = _layer_modules(lm)
    sums: dict[int, torch.Tensor] = {}

    def keep(i):
        def hook(module, args, kwargs):
            h = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).float().sum(0).cpu()
            sums[i] = h if i not in sums else sums[i] + h
        return hook

    handles = [blocks[i].register_forward_pre_hook(keep(i), with_kwargs=True) for i in chosen]
    try:
        with torch.inference_mode():
            for start in range(0, len(ids), batch_size):  # the same width for every row: no padding
                batch = torch.tensor([row[:width] for row in ids[start:start + batch_size]], device=lm.device)
                lm.model(input_ids=batch, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    centred = np.arange(width) - (width - 1) / 2
    out = []
    for i in chosen:
        ranks = rankdata((sums[i] / len(ids)).numpy(), axis=0)  # [position, channel]; ties share a rank
        ranks -= ranks.mean(0)
        spread = np.sqrt((ranks ** 2).sum(0) * (centred ** 2).sum())
        rho = np.divide((ranks * centred[:, None]).sum(0), spread, out=np.zeros(ranks.shape[1]), where=spread > 0)
        first, second = np.argsort(-np.abs(rho), kind="stable")[:2]
        out.append({"layer": i, "channel": int(first), "correlation": float(rho[first]),
                    "sign": 1 if rho[first] >= 0 else -1, "runner_up": int(second),
                    "runner_up_correlation": float(rho[second]), "positions": width, "prompts": len(ids)})
    return pd.DataFrame(out)


def channel_scaling(table, scale: float = 0.0, layers=None, rows: str = "scored",
                    shared: bool = False) -> ChannelScaling:
    """A `ChannelScaling` from a `positional_channels` table: in `layers` (the table's when None) each layer's
    own channel, or with `shared` one channel for all of them (the one found in most of those layers, ties to the
    higher mean |correlation|), as Yu et al. scale one channel in every chosen layer (layers 10-25 of 32 in their
    7B models).  `scale` 0 is their default factor (their search tries 0.5, 0, -0.5 and -1)."""
    have = {int(r.layer): r for r in table.itertuples()}
    chosen = sorted(have) if layers is None else [int(i) for i in layers]
    missing = sorted(set(chosen) - set(have))
    if not chosen or missing:
        raise ConfigError(f"layers {missing or chosen} are not in the table (it has layers {sorted(have)}).")
    check_scale(scale)
    if rows not in CHANNEL_ROWS:
        raise ConfigError(f"rows must be one of {CHANNEL_ROWS}, not {rows!r}.")
    channels = [int(have[i].channel) for i in chosen]
    if shared:
        def support(c):
            return (channels.count(c), np.mean([abs(have[i].correlation) for i in chosen if have[i].channel == c]))
        return ChannelScaling(max(sorted(set(channels)), key=support), tuple(chosen), float(scale), rows)
    return ChannelScaling(tuple(channels), tuple(chosen), float(scale), rows)


def check_scale(scale) -> None:
    """A ConfigError unless `scale` is a number in SCALE_RANGE (channel scaling's factor)."""
    low, high = SCALE_RANGE
    ok = isinstance(scale, (int, float, np.integer, np.floating)) and not isinstance(scale, bool)
    if not (ok and low <= float(scale) <= high):  # NaN fails the comparison too
        raise ConfigError(f"the channel scale must lie in [{low:g}, {high:g}] (1: the plain model; 0 removes the "
                          f"channel; Yu et al. chose -1 to 0.2), not {scale!r}.")


def _channel_list(channels, n: int) -> list[int]:
    """One channel index per chosen layer, from one index for all or one per layer."""
    if isinstance(channels, (int, np.integer)) and not isinstance(channels, bool):
        return [int(channels)] * n
    try:
        out = [int(c) for c in channels]
    except (TypeError, ValueError):
        raise ConfigError(f"channels must be one index or one per chosen layer, not {channels!r}.") from None
    if len(out) != n:
        raise ConfigError(f"{len(out)} channels given for {n} layers; give one channel per chosen layer, or one "
                          "index for all.")
    return out


def _check_channels(iv: ChannelScaling, n_layers: int, hidden: int) -> None:
    if iv.rows not in CHANNEL_ROWS:
        raise ConfigError(f"rows must be one of {CHANNEL_ROWS} ('scored': the prompt's last token and after, as Yu "
                          f"et al. do), not {iv.rows!r}.")
    check_scale(iv.scale)
    if iv.layers is not None and (not iv.layers or len(set(iv.layers)) != len(iv.layers)):
        raise ConfigError(f"layers must list at least one layer, each once (None: every layer), not {iv.layers!r}.")
    channels = _channel_list(iv.channels, n_layers if iv.layers is None else len(iv.layers))
    bad = sorted({c for c in channels if not 0 <= c < hidden})
    if bad:
        raise ConfigError(f"channels {bad} are outside the hidden state's {hidden} channels "
                          f"(0-based: 0..{hidden - 1}).")


def _layer_modules(lm: LoadedModel) -> tuple[dict, dict]:
    """{layer index: attention module} and {layer index: the decoder layer holding it} of the language model."""
    named = dict(lm.model.named_modules())
    attention, blocks = {}, {}
    for name, module in named.items():
        projects = hasattr(module, "q_proj") and hasattr(module, "k_proj")
        if projects and isinstance(getattr(module, "layer_idx", None), int):
            attention[module.layer_idx] = module
            blocks[module.layer_idx] = named[name.rpartition(".")[0]]
    if len(attention) != lm.text_config.num_hidden_layers:
        raise ConfigError(f"model {lm.name!r}: found {len(attention)} attention layers with query and key "
                          f"projections, not its {lm.text_config.num_hidden_layers}.")
    return attention, blocks


def _rotary(lm: LoadedModel):
    """The model's rotary embedding module (the one that holds the inverse frequencies)."""
    for module in lm.model.modules():
        if hasattr(module, "inv_freq") or any(k.endswith("_inv_freq") for k in getattr(module, "_buffers", {})):
            return module
    raise ConfigError(f"model {lm.name!r} has no rotary embedding to rescale.")


def _check_layers(layers, n_layers: int) -> None:
    bad = [i for i in (layers or ()) if not 0 <= int(i) < n_layers]
    if bad:
        raise ConfigError(f"layers {bad} are outside the model's {n_layers} layers (0-based: 0..{n_layers - 1}).")


def full_attention_layers(lm: LoadedModel) -> tuple[int, ...]:
    """The layers that attend over the whole prompt: a sliding-window layer's cache keeps only its window, so
    its keys cannot be matched to the prompt's documents (and its scored rows see few of them)."""
    cfg = lm.text_config
    types = getattr(cfg, "layer_types", None)
    if types:
        return tuple(i for i, t in enumerate(types) if "sliding" not in t)
    return () if getattr(cfg, "sliding_window", None) else tuple(range(cfg.num_hidden_layers))


def default_layers(lm: LoadedModel) -> tuple[int, ...]:
    """The second half of the model's full-attention layers (Found in the Middle calibrated the last 16 of 32);
    all of them when none lies in the second half."""
    full = full_attention_layers(lm)
    return tuple(i for i in full if i >= lm.text_config.num_hidden_layers // 2) or full


def _check(lm: LoadedModel, iv) -> None:
    cfg = lm.text_config
    n_layers, n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    _check_layers(getattr(iv, "layers", None), n_layers)
    if isinstance(iv, Calibration):
        if iv.model != weights_fingerprint(lm):
            raise ConfigError(f"this calibration's bias was measured on another model (weights {iv.model!r}, not "
                              f"{weights_fingerprint(lm)!r}); measure position_bias on {lm.name!r}.")
        if len(iv.bias) != len(iv.layers) or not iv.layers:
            raise ConfigError("a calibration needs one bias row per chosen layer; build it with calibration().")
        sliding = sorted(set(iv.layers) - set(full_attention_layers(lm)))
        if sliding:
            raise ConfigError(f"layers {sliding} of {lm.name!r} attend through a sliding window; calibrate layers that "
                              f"attend over the whole prompt: {list(full_attention_layers(lm))}.")
        return
    if isinstance(iv, ChannelScaling):
        _check_channels(iv, n_layers, cfg.hidden_size)
        return
    if not isinstance(iv, PositionalRescaling):
        raise ConfigError(f"unknown intervention {type(iv).__name__}; use PositionalRescaling, Calibration, "
                          "ChannelScaling or ParallelDocuments.")
    rows = iv.ratios if _per_layer(iv.ratios) else [iv.ratios]
    if _per_layer(iv.ratios) and len(rows) != n_layers:
        raise ConfigError(f"{len(rows)} rows of ratios given; {lm.name!r} has {n_layers} layers (give one row per "
                          "layer, or one row for all).")
    if any(len(r) != n_kv for r in rows):
        raise ConfigError(f"{len(rows[0])} ratios given; {lm.name!r} has {n_kv} key-value heads per layer, one "
                          "ratio each.")
    if any(not r > 0 for row in rows for r in row):
        raise ConfigError(f"ratios must be above 0, not {[list(r) for r in rows]}.")


@contextlib.contextmanager
def intervene(lm: LoadedModel, intervention):
    """Run `lm` with `intervention` (a PositionalRescaling, Calibration, ChannelScaling or ParallelDocuments)
    inside the block; the model, its hooks and its identity are restored after, also after an error.  None runs
    the plain model, so a loop over levers needs no special case."""
    import torch

    from .attention import attention_function

    if intervention is None:
        yield lm
        return
    if _state:
        raise ConfigError("an intervention is already active; leave its block first.")
    if isinstance(intervention, ParallelDocuments):  # a mask and position ids (litm.parallel), no attention function
        from .parallel import check_model

        check_model(lm)
        _state.update(iv=intervention)
        lm.identity["intervention"] = intervention.identity()
        try:
            yield lm
        finally:
            lm.identity.pop("intervention", None)
            _state.clear()
        return
    _check(lm, intervention)
    with attention_function(lm, IMPLEMENTATION, _attention, SUPPORTED, "interventions are"):
        if isinstance(intervention, PositionalRescaling):
            n = lm.text_config.num_hidden_layers
            rows = intervention.ratios if _per_layer(intervention.ratios) else [intervention.ratios] * n
            _state.update(rotary=_rotary(lm), ratios=torch.tensor(rows, dtype=torch.float32, device=lm.device))
        elif isinstance(intervention, ChannelScaling):
            _state.update(_channel_state(lm, intervention))
        else:
            _state.update(tilt={layer: torch.exp(-intervention.strength * torch.tensor(b, dtype=torch.float32))
                                for layer, b in zip(intervention.layers, intervention.bias)}, rows=None, labels={})
        _state.update(iv=intervention, trace=None,
                      layers=None if intervention.layers is None else {int(i) for i in intervention.layers})
        lm.identity["intervention"] = intervention.identity()
        try:
            yield lm
        finally:
            for handle in _state.get("hooks", ()):
                handle.remove()
            lm.identity.pop("intervention", None)
            _state.clear()


def parallel_documents() -> bool:
    """Whether parallel documents are on (the runner then scores through `litm.parallel`)."""
    return bool(_state) and isinstance(_state["iv"], ParallelDocuments)


def calibrating() -> bool:
    """Whether a calibration is active (its scored rows depend on where each prompt ends)."""
    return bool(_state) and isinstance(_state["iv"], Calibration)


def scaling_channels() -> bool:
    """Whether a channel scaling of the scored rows is active (they depend on where each prompt ends)."""
    return bool(_state) and isinstance(_state["iv"], ChannelScaling) and _state["iv"].rows == "scored"


@contextlib.contextmanager
def scoring(prompts, offsets):
    """The runner's forward passes inside are over `prompts`, one per batch row, row b's prompt starting at key
    index `offsets[b]` (its left padding).  Calibration reads each row's documents from it, channel scaling
    where each prompt ends; a no-op otherwise."""
    if not (calibrating() or scaling_channels()):
        yield
        return
    layout = dict(_state["iv"].layout) if calibrating() else None
    for p in prompts:
        if layout is not None and prompt_layout(p) != layout:
            raise ConfigError(f"prompt {p.example_id} has layout {prompt_layout(p)}, but the calibration's bias was "
                              f"measured on {layout}; measure position_bias in this layout (template, chat, "
                              "question placement, number of documents, doc_format).")
    before = _state["rows"]
    _state.update(rows=(list(prompts), [int(o) for o in offsets]), labels={})
    try:
        yield
    finally:
        _state.update(rows=before, labels={})


@contextlib.contextmanager
def same_row(row: int, copies: int):
    """Inside, the batch is `copies` copies of row `row` of the enclosing `scoring` batch (forced choice on
    caches it cannot extend side by side)."""
    if not _state or _state.get("rows") is None:
        yield
        return
    before = _state["rows"]
    prompts, offsets = before
    _state.update(rows=([prompts[row]] * copies, [offsets[row]] * copies), labels={})
    try:
        yield
    finally:
        _state.update(rows=before, labels={})


@contextlib.contextmanager
def tracing():
    """Record, for every calibrated layer call, each scored row's document mass before and after calibration:
    a list of (layer, batch row, before [head, row, document], after [head, row, document]), in call order."""
    if not calibrating():
        raise ConfigError("tracing() records a calibration; enter intervene(lm, Calibration(...)) first.")
    _state["trace"] = out = []
    try:
        yield out
    finally:
        _state["trace"] = None


def _inv_freq(module, rot):
    layer_type = getattr(module, "layer_type", None)
    inv = getattr(rot, f"{layer_type}_inv_freq", None) if layer_type else None
    return rot.inv_freq if inv is None else inv


def _rotate(x, angles):
    """x [..., D] rotated by `angles` [..., D/2] in the rotate-half pairing rotary embeddings use."""
    import torch

    half = x.shape[-1] // 2
    cos, sin = torch.cos(angles), torch.sin(angles)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def _rescale(module, query, key, pos):
    import torch

    st = _state
    n_new = query.shape[2]
    inv = _inv_freq(module, st["rotary"]).to(device=query.device, dtype=torch.float32)
    shrink = (1.0 / st["ratios"][module.layer_idx] - 1.0).to(query.device)  # [kv head]
    # [batch, kv head, token, frequency]: the extra angle taking position p to p / r
    angles = pos.to(query.device, torch.float32)[:, None, :, None] * shrink[None, :, None, None] * inv
    key[:, :, -n_new:, :] = _rotate(key[:, :, -n_new:, :], angles)  # in place: where the cache holds them
    return _rotate(query, angles.repeat_interleave(query.shape[1] // key.shape[1], dim=1))


def _labels(n_keys: int, device):
    """[batch, key]: the document each key of each row belongs to (-1: none), from the scored prompts."""
    import torch

    st = _state
    if (n_keys, device) not in st["labels"]:
        prompts, offsets = st["rows"]
        lab = torch.full((len(prompts), n_keys), -1, dtype=torch.long)
        for b, (p, at) in enumerate(zip(prompts, offsets)):
            for k, (s, e) in enumerate(p.manifest.doc_spans):
                lab[b, at + s:at + e] = k
        st["labels"] = {(n_keys, device): (lab.to(device), [len(p.input_ids) for p in prompts])}
    return st["labels"][(n_keys, device)]


def _calibrate(module, query, key, value, attention_mask, scaling, softcap, pos, output) -> None:
    """Recompute the scored rows of `output` [batch, query, head, dim] from calibrated weights."""
    import torch

    from .attention import apply_mask

    st = _state
    if st["rows"] is None:
        raise ConfigError("calibration knows each prompt's documents through the runner: score with "
                          "litm.runner.score (or sweep) inside intervene(), not with a bare model call.")
    n_heads, n_kv, n_q, n_k = query.shape[1], key.shape[1], query.shape[2], key.shape[2]
    groups = n_heads // n_kv
    labels, lengths = _labels(n_k, key.device)
    if labels.shape[0] != query.shape[0]:
        raise ConfigError(f"the runner announced {labels.shape[0]} prompts for a batch of {query.shape[0]}.")
    tilt = st["tilt"][module.layer_idx].to(key.device)[:, None, :]  # [head or 1, 1, document]: exp(-strength * bias)
    n_docs = tilt.shape[-1]
    for b in range(query.shape[0]):
        rows = (pos[b] >= lengths[b] - 1).nonzero()[:, 0]
        if len(rows) == 0:
            continue
        q = query[b, :, rows, :].float().reshape(n_kv, groups * len(rows), -1)
        s = torch.matmul(q, key[b].float().transpose(1, 2)).reshape(n_heads, len(rows), n_k) * scaling
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        if attention_mask is None:  # plain causal: query i of this call is key n_k - n_q + i
            allowed = torch.arange(n_k, device=s.device)[None, :] <= (n_k - n_q + rows)[:, None]
            s = s.masked_fill(~allowed[None], _LEAST)
        else:  # [1 or head, row, key]
            s = apply_mask(s, attention_mask[b if attention_mask.shape[0] > 1 else 0][:, rows, :n_k], _LEAST)
            s = s.clamp(min=_LEAST)
        w = torch.softmax(s, dim=-1)  # [head, row, key]
        lab = labels[b]
        in_doc = lab >= 0
        doc_of = lab.clamp(min=0)
        mass = torch.zeros(n_heads, len(rows), n_docs, device=w.device).index_add_(2, doc_of[in_doc], w[..., in_doc])
        total, tilted = mass.sum(-1, keepdim=True), (mass * tilt).sum(-1, keepdim=True)
        factor = torch.where(tilted > 0, tilt * total / tilted, torch.ones_like(mass))  # [head, row, document]
        w = w * torch.where(in_doc[None, None], factor[..., doc_of], torch.ones_like(w))
        out = torch.matmul(w.reshape(n_kv, groups * len(rows), n_k), value[b].float()).reshape(n_heads, len(rows), -1)
        output[b, rows] = out.transpose(0, 1).to(output.dtype)
        if st["trace"] is not None:
            st["trace"].append((module.layer_idx, b, mass.cpu(), torch.zeros_like(mass).index_add_(
                2, doc_of[in_doc], w[..., in_doc]).cpu()))


def _channel_state(lm: LoadedModel, iv: ChannelScaling) -> dict:
    """Channel scaling's state: each chosen layer's channel, and forward pre-hooks that keep each chosen attention
    module's input (the normalised hidden state) and rotary cos/sin for the attention function."""
    attention, _ = _layer_modules(lm)
    layers = list(range(lm.text_config.num_hidden_layers)) if iv.layers is None else [int(i) for i in iv.layers]
    inputs: dict = {}

    def keep(module, args, kwargs):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        inputs[module.layer_idx] = (x, kwargs["position_embeddings"] if "position_embeddings" in kwargs else args[1])

    hooks = []
    try:
        for i in layers:
            hooks.append(attention[i].register_forward_pre_hook(keep, with_kwargs=True))
    except BaseException:
        for handle in hooks:
            handle.remove()
        raise
    return {"channel": dict(zip(layers, _channel_list(iv.channels, len(layers)))), "scale": float(iv.scale),
            "inputs": inputs, "hooks": hooks, "rows": None}


def _scaled_query_key(module, x, position_embeddings, channel: int, scale: float):
    """Queries and keys [batch, head, token, dim] formed, by the layer's own projections, norms and rotary
    embedding, from its attention input `x` with `channel` multiplied by `scale`."""
    import sys

    x = x.clone()
    x[..., channel] *= scale
    shape = (*x.shape[:-1], -1, module.head_dim)
    query, key = module.q_proj(x).view(shape), module.k_proj(x).view(shape)
    if hasattr(module, "q_norm"):  # Qwen3, Gemma 3: per-head norms before the rotation
        query, key = module.q_norm(query), module.k_norm(key)
    cos, sin = position_embeddings
    return sys.modules[type(module).__module__].apply_rotary_pos_emb(query.transpose(1, 2), key.transpose(1, 2),
                                                                      cos, sin)


def _scale_channel(module, query, key, value, attention_mask, dropout, scaling, pos, kwargs):
    """The layer's attention with its channel scaled for the scored rows (every row with rows="all"): their
    scaled queries read the scaled keys, which replace this call's keys where the cache holds them.  The scored
    rows come from a second SDPA call over the query columns that hold one (in a prefill, the last few), under
    the same mask: scale 1 is the plain model up to the kernel's rounding."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    st = _state
    x, position_embeddings = st["inputs"].pop(module.layer_idx)
    q_bar, k_bar = _scaled_query_key(module, x, position_embeddings, st["channel"][module.layer_idx], st["scale"])
    n_q = query.shape[2]
    if st["iv"].rows == "all":
        scored = torch.ones(pos.shape, dtype=torch.bool, device=pos.device)
    elif st["rows"] is None:
        raise ConfigError("channel scaling knows where each prompt ends through the runner: score with "
                          "litm.runner.score (or sweep) inside intervene(), not with a bare model call.")
    else:
        prompts = st["rows"][0]
        if len(prompts) != query.shape[0]:
            raise ConfigError(f"the runner announced {len(prompts)} prompts for a batch of {query.shape[0]}.")
        lengths = torch.tensor([len(p.input_ids) for p in prompts], device=pos.device)
        scored = pos >= (lengths - 1)[:, None]  # [batch, query]: the prompt's last token and every token after it
        if key.shape[2] > n_q and (~scored & (pos > 0)).any():  # pads (position 0) are never read
            raise ConfigError("channel scaling keeps the scaled keys in the KV cache (as Yu et al. do), so a prompt "
                              "cannot be prefilled in pieces (a prefix tree): score without shared_prefix.")
    plain = None
    if not scored.all():
        plain, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                          **kwargs)
    key[:, :, -n_q:, :] = k_bar  # in place: the cache keeps the scaled keys for the calls after this one
    if not scored.any():
        return plain, None
    if plain is None:
        return sdpa_attention_forward(module, q_bar, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # only the query columns that hold a scored row (a prefill's last few): the scaled pass costs those rows
    cols = scored.any(0).nonzero()[:, 0].to(query.device)
    n_k = key.shape[2]
    if attention_mask is None:  # plain causal: query i of this call is key n_k - n_q + i
        mask = (torch.arange(n_k, device=query.device)[None, :] <= (n_k - n_q + cols)[:, None])[None, None]
    else:
        mask = attention_mask[:, :, cols, :]
    sub, weights = sdpa_attention_forward(module, q_bar[:, :, cols], key, value, mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
    output = plain.clone()  # [batch, query, head, dim]
    output[:, cols] = torch.where(scored[:, cols].to(sub.device)[:, :, None, None], sub, plain[:, cols])
    return output, weights


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    st = _state
    active = st and (st["layers"] is None or module.layer_idx in st["layers"])
    pos = kwargs.get("position_ids")
    if active and pos is None:
        pos = torch.arange(key.shape[2] - query.shape[2], key.shape[2], device=query.device)[None]
    if active and "ratios" in st:
        query = _rescale(module, query, key, pos)
    if active and "channel" in st:
        return _scale_channel(module, query, key, value, attention_mask, dropout, scaling,
                              pos.expand(query.shape[0], -1), kwargs)
    output, weights = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                             scaling=scaling, **kwargs)
    if active and "tilt" in st:
        scaling = module.head_dim ** -0.5 if scaling is None else scaling
        _calibrate(module, query, key, value, attention_mask, scaling, kwargs.get("softcap"),
                   pos.expand(query.shape[0], -1), output)
    return output, weights
