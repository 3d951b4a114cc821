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
    _check_layers(iv.layers, n_layers)
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
    if not isinstance(iv, PositionalRescaling):
        raise ConfigError(f"unknown intervention {type(iv).__name__}; use PositionalRescaling or Calibration.")
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
    """Run `lm` with `intervention` (a PositionalRescaling or a Calibration) inside the block; the model and its
    identity are restored after.  None runs the plain model, so a loop over levers needs no special case."""
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
        else:
            _state.update(tilt={layer: torch.exp(-intervention.strength * torch.tensor(b, dtype=torch.float32))
                                for layer, b in zip(intervention.layers, intervention.bias)}, rows=None, labels={})
        _state.update(iv=intervention, trace=None,
                      layers=None if intervention.layers is None else {int(i) for i in intervention.layers})
        lm.identity["intervention"] = intervention.identity()
        try:
            yield lm
        finally:
            lm.identity.pop("intervention", None)
            _state.clear()


def parallel_documents() -> bool:
    """Whether parallel documents are on (the runner then scores through `litm.parallel`)."""
    return bool(_state) and isinstance(_state["iv"], ParallelDocuments)


def calibrating() -> bool:
    """Whether a calibration is active (its scored rows depend on where each prompt ends)."""
    return bool(_state) and isinstance(_state["iv"], Calibration)


@contextlib.contextmanager
def scoring(prompts, offsets):
    """The runner's forward passes inside are over `prompts`, one per batch row, row b's prompt starting at key
    index `offsets[b]` (its left padding).  Calibration reads each row's documents from it; a no-op
    otherwise."""
    if not calibrating():
        yield
        return
    layout = dict(_state["iv"].layout)
    for p in prompts:
        if prompt_layout(p) != layout:
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
    output, weights = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                             scaling=scaling, **kwargs)
    if active and "tilt" in st:
        scaling = module.head_dim ** -0.5 if scaling is None else scaling
        _calibrate(module, query, key, value, attention_mask, scaling, kwargs.get("softcap"),
                   pos.expand(query.shape[0], -1), output)
    return output, weights
