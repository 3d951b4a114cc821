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
key-value head (per head in a model without grouping, as in Ms-PoE).  The new keys of each call are rotated
where the KV cache holds them, so later calls (forced-choice candidates, decoding) read every key at its
rescaled position and only the new tokens' positions (the call's position ids) are ever needed.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from .errors import ConfigError
from .models import LoadedModel

IMPLEMENTATION = "litm_intervention"
# Architectures whose attention layers rotate queries and keys before calling the attention interface with
# the call's position ids, as transformers' Llama-family and Gemma 3 code does; checked in tests.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "gemma3_text")

_state: dict = {}


@dataclass(frozen=True)
class PositionalRescaling:
    """Positions divided by `ratios[j]` in every query head that reads key-value head j, in `layers` (all when
    None).  Ratios of 1 leave the model as it is."""

    ratios: tuple[float, ...]
    layers: tuple[int, ...] | None = None

    def identity(self) -> dict:
        return {"kind": "positional_rescaling", "ratios": [float(r) for r in self.ratios],
                "layers": None if self.layers is None else [int(i) for i in self.layers]}


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


def _text_config(lm: LoadedModel):
    cfg = lm.model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _rotary(lm: LoadedModel):
    """The model's rotary embedding module (the one that holds the inverse frequencies)."""
    for module in lm.model.modules():
        if hasattr(module, "inv_freq") or any(k.endswith("_inv_freq") for k in getattr(module, "_buffers", {})):
            return module
    raise ConfigError(f"model {lm.name!r} has no rotary embedding to rescale.")


def _check(lm: LoadedModel, iv: PositionalRescaling) -> None:
    cfg = _text_config(lm)
    if getattr(cfg, "model_type", None) not in SUPPORTED:
        raise ConfigError(f"interventions are not supported for model type {cfg.model_type!r}; supported: "
                          f"{', '.join(SUPPORTED)}.")
    n_layers, n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    bad = [i for i in (iv.layers or ()) if not 0 <= int(i) < n_layers]
    if bad:
        raise ConfigError(f"layers {bad} are outside the model's {n_layers} layers (0-based: 0..{n_layers - 1}).")
    if len(iv.ratios) != n_kv:
        raise ConfigError(f"{len(iv.ratios)} ratios given; {lm.name!r} has {n_kv} key-value heads per layer, one "
                          "ratio each.")
    if any(not r > 0 for r in iv.ratios):
        raise ConfigError(f"ratios must be above 0, not {list(iv.ratios)}.")


@contextlib.contextmanager
def intervene(lm: LoadedModel, intervention: PositionalRescaling):
    """Run `lm` with `intervention` inside the block; the model and its identity are restored after."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if _state:
        raise ConfigError("an intervention is already active; leave its block first.")
    _check(lm, intervention)
    rot = _rotary(lm)
    AttentionInterface.register(IMPLEMENTATION, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)
    configs = list({id(c): c for c in (lm.model.config, _text_config(lm))}.values())
    before = [c._attn_implementation for c in configs]
    _state.update(iv=intervention, rotary=rot,
                  ratios=torch.tensor(intervention.ratios, dtype=torch.float32, device=lm.device),
                  layers=None if intervention.layers is None else {int(i) for i in intervention.layers})
    for c in configs:
        c._attn_implementation = IMPLEMENTATION
    lm.identity["intervention"] = intervention.identity()
    try:
        yield lm
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = b
        lm.identity.pop("intervention", None)
        _state.clear()


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


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    st = _state
    if st and (st["layers"] is None or module.layer_idx in st["layers"]):
        n_new = query.shape[2]
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(key.shape[2] - n_new, key.shape[2], device=query.device)[None]
        inv = _inv_freq(module, st["rotary"]).to(device=query.device, dtype=torch.float32)
        shrink = (1.0 / st["ratios"] - 1.0).to(query.device)  # [kv head]
        # [batch, kv head, token, frequency]: the extra angle taking position p to p / r
        angles = pos.to(query.device, torch.float32)[:, None, :, None] * shrink[None, :, None, None] * inv
        key[:, :, -n_new:, :] = _rotate(key[:, :, -n_new:, :], angles)  # in place: where the cache holds them
        query = _rotate(query, angles.repeat_interleave(query.shape[1] // key.shape[1], dim=1))
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)
