"""Attention mass per prompt span, from the model's own attention, without n x n matrices.

A registered attention function runs the stock SDPA kernel for the layer's output and, for the chosen
query rows only, forms the softmax rows from the same queries and keys (after rotary embedding, with the
layer's scaling, causal and sliding-window masking, soft-capping where the architecture has it, and
grouped-query heads sharing their key head).  Rows are formed a chunk of rows and a chunk of keys at a time,
so the float32 it holds is bounded by the chunk size, whatever the prompt's length.
Shapes are `[layer, head, ...]`, layers and heads 0-based.  The studies built on it (troughs, bias,
calibrated relevance, attention beside outcomes) are in `attention_study`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .models import LoadedModel
from .prompts import Prompt

IMPLEMENTATION = "litm_profile"
# Architectures whose attention layers call the attention interface with (query, key, value, mask,
# scaling, sliding_window/softcap) as transformers' Llama-family and Gemma code does; checked in tests.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gemma3_text")

_state: dict = {"active": False}


def _repeat_kv(x, groups: int):
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def apply_mask(scores, mask, masked: float):
    """Attention scores under a layer's own mask, as SDPA applies it: a boolean mask keeps (the rest get
    `masked`), a float mask adds to the logits.  `mask` broadcasts against `scores`."""
    import torch

    return scores.masked_fill(~mask, masked) if mask.dtype == torch.bool else scores + mask.float()


def _record(module, query, key, scaling, softcap, sliding_window, mask) -> None:
    """The chosen rows' attention mass per span (and per key), formed from `chunk` rows and `chunk` keys at a
    time, in float32: a first pass over the key blocks gives each row's log-sum-exp, a second the weights.
    Grouped-query heads read their shared key head without copying it; keys after a block's last row are
    masked for all its rows and skipped.  The layer's own `mask` applies as SDPA applies it (a boolean mask
    keeps, a float mask adds to the logits)."""
    import torch

    st = _state
    n_heads, n_kv = query.shape[1], key.shape[1]
    groups, dev, chunk = n_heads // n_kv, key.device, st["chunk"]
    rows = st["rows"].to(dev)
    span_of = st["span_of"].to(dev)
    mass = torch.zeros(n_heads, st["n_spans"], device=dev)
    per_key = torch.zeros(n_heads, key.shape[2], device=dev) if st["per_key"] else None

    def scores(r, at):  # [head, row, key] for rows r and keys at..at+chunk, masked
        q = query[0, :, r, :].float().reshape(n_kv, groups * len(r), -1)  # head h reads key head h // groups
        s = torch.matmul(q, key[0, :, at:at + chunk, :].float().transpose(1, 2)).reshape(n_heads, len(r), -1)
        s = s * scaling
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        kpos = torch.arange(at, at + s.shape[-1], device=dev)
        allowed = kpos[None, :] <= r[:, None]
        if sliding_window:
            allowed &= kpos[None, :] > r[:, None] - sliding_window
        s = s.masked_fill(~allowed[None], float("-inf"))
        if mask is None:
            return s
        return apply_mask(s, mask[0][:, r, at:at + s.shape[-1]], float("-inf"))  # [1 or head, row, key]

    for start in range(0, len(rows), chunk):
        r = rows[start:start + chunk]
        blocks = range(0, int(r.max()) + 1, chunk)
        lse = torch.full((n_heads, len(r)), float("-inf"), device=dev)
        for at in blocks:
            lse = torch.logaddexp(lse, torch.logsumexp(scores(r, at), dim=-1))
        for at in blocks:
            weights = torch.exp(scores(r, at) - lse[..., None]).sum(dim=1)  # [head, key]
            mass.index_add_(1, span_of[at:at + weights.shape[-1]], weights)
            if per_key is not None:
                per_key[:, at:at + weights.shape[-1]] += weights
    st["mass"][module.layer_idx] = (mass / len(rows)).cpu().numpy()
    if per_key is not None:
        st["per_key_out"][module.layer_idx] = (per_key / len(rows)).cpu().numpy()


def _profile_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    softcap = kwargs.get("softcap")
    scaling = module.head_dim ** -0.5 if scaling is None else scaling
    if _state["active"]:
        window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
        _record(module, query, key, scaling, softcap, window, attention_mask)
    if softcap is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # soft-capped logits (Gemma 2) are not expressible in SDPA: compute this layer's output directly
    import torch

    groups = query.shape[1] // key.shape[1]
    k, v = _repeat_kv(key, groups), _repeat_kv(value, groups)
    w = torch.tanh(torch.matmul(query, k.transpose(2, 3)) * scaling / softcap) * softcap
    n_q, n_k = w.shape[-2:]
    if attention_mask is None:  # SDPA's mask function leaves a plain causal mask to the kernel: build it
        allowed = torch.ones((n_q, n_k), dtype=torch.bool, device=w.device).tril(n_k - n_q)
    else:
        allowed = attention_mask[:, :, :, :n_k]
    if allowed.dtype == torch.bool:  # True where a query may attend; the dtype's least, not -inf, so that a
        w = w.masked_fill(~allowed, torch.finfo(w.dtype).min)  # padding row with no key stays finite
    else:  # an additive float mask
        w = w + allowed
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(w, v).transpose(1, 2).contiguous(), None


@dataclass(frozen=True)
class Profile:
    """Mean attention mass from the chosen query tokens to each span: `mass[layer, head, span]`."""

    span_names: tuple[str, ...]
    labels: np.ndarray  # each token's index into span_names
    queries: tuple[int, ...]
    mass: np.ndarray
    per_key: np.ndarray | None = None  # [layer, head, key] when asked for

    def span(self, name: str) -> np.ndarray:
        """`[layer, head]` mass of one span."""
        return self.mass[:, :, self.span_names.index(name)]

    @property
    def documents(self) -> np.ndarray:
        """`[layer, head, document]` mass of the documents, in prompt order."""
        idx = [i for i, n in enumerate(self.span_names) if n.startswith("doc ")]
        return self.mass[:, :, idx]


def token_spans(prompt: Prompt) -> tuple[tuple[str, ...], np.ndarray]:
    """Partition the prompt's tokens into named spans: the first token, the instruction (before the first
    document), each document, the question (every occurrence), and the rest (separators, template
    tokens).  Returns the names and each token's index into them."""
    m = prompt.manifest
    n = m.num_tokens
    named = sorted([(s, e, f"doc {i + 1}") for i, (s, e) in enumerate(m.doc_spans)] +
                   [(s, e, "question") for s, e in m.question_spans])
    for (s1, e1, _), (s2, e2, _) in zip(named, named[1:]):
        if s2 < e1:
            raise ConfigError(f"manifest spans overlap ({s1}-{e1} and {s2}-{e2}); re-render the prompt.")
    if named and (named[0][0] < 0 or named[-1][1] > n):
        raise ConfigError(f"manifest spans fall outside the prompt's {n} tokens; re-render the prompt.")
    names = ["first token", "instruction"] + [f"doc {i + 1}" for i in range(len(m.doc_spans))] + ["question", "rest"]
    labels = np.full(n, names.index("rest"))
    first_doc = m.doc_spans[0][0] if m.doc_spans else (m.question_spans[0][0] if m.question_spans else n)
    labels[1:first_doc] = names.index("instruction")
    for s, e, name in named:
        labels[s:e] = names.index(name)
    labels[0] = 0
    return tuple(names), labels


def _queries(prompt: Prompt, queries) -> list[int]:
    n = prompt.manifest.num_tokens
    if isinstance(queries, str):
        if queries == "last":
            return [n - 1]
        if queries == "question":
            if not prompt.manifest.question_spans:
                raise ConfigError("this prompt has no question span; choose queries='last' or give indices.")
            s, e = prompt.manifest.question_spans[-1]
            return list(range(s, e))
        if queries == "all":
            return list(range(n))
        raise ConfigError(f"unknown query selection {queries!r}: use 'last', 'question', 'all', a slice or indices.")
    rows = list(range(n))[queries] if isinstance(queries, slice) else [int(q) for q in queries]
    if not rows:
        raise ConfigError("the query selection is empty; choose at least one query token.")
    if min(rows) < -n or max(rows) >= n:
        raise ConfigError(f"query indices must lie in 0..{n - 1}.")
    return sorted({q % n for q in rows})


@contextlib.contextmanager
def attention_function(lm: LoadedModel, name: str, function, supported: tuple[str, ...], what: str):
    """Within it, every attention layer of `lm` calls `function` (registered under `name` with transformers'
    `AttentionInterface`, SDPA's mask function beside it); the model's own implementation is restored after.
    `what` names the feature in the error for a model type outside `supported`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    model_type = getattr(lm.text_config, "model_type", None)
    if model_type not in supported:
        raise ConfigError(f"{what} not supported for model type {model_type!r}; supported: {', '.join(supported)}.")
    AttentionInterface.register(name, function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    configs = list({id(c): c for c in (lm.model.config, lm.text_config)}.values())
    before = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = name
    try:
        yield
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = b


@contextlib.contextmanager
def _profiling(lm: LoadedModel):
    try:
        with attention_function(lm, IMPLEMENTATION, _profile_attention, SUPPORTED, "attention profiles are"):
            yield
    finally:
        _state.clear()
        _state["active"] = False


def profile(lm: LoadedModel, prompt: Prompt, queries="last", per_key: bool = False, chunk: int = 256,
            keep_cache: bool = False):
    """Attention mass from the `queries` tokens ("last", "question", "all", a slice, or indices) to every
    span of the prompt, per layer and head, from one forward pass that keeps its SDPA kernel.  With
    `keep_cache`, also that pass's output (the last token's logits and the KV cache), to score answers after
    the prompt without a second pass over it: returns (Profile, output)."""
    import torch

    if prompt is None or getattr(prompt, "manifest", None) is None:
        raise ConfigError("profile() needs a rendered Prompt with a manifest (litm.prompts.render).")
    names, labels = token_spans(prompt)
    rows = _queries(prompt, queries)
    with _profiling(lm):
        _state.update(active=True, rows=torch.tensor(rows), span_of=torch.as_tensor(labels, dtype=torch.long),
                      n_spans=len(names), per_key=per_key, chunk=chunk, mass={}, per_key_out={})
        with torch.inference_mode():
            out = lm.model(input_ids=torch.tensor([prompt.input_ids], device=lm.device), use_cache=keep_cache,
                           logits_to_keep=1)
        layers = range(lm.text_config.num_hidden_layers)
        mass = np.stack([_state["mass"][i] for i in layers])
        keys = np.stack([_state["per_key_out"][i] for i in layers]) if per_key else None
    prof = Profile(names, labels, tuple(rows), mass, keys)
    return (prof, out) if keep_cache else prof


@dataclass(frozen=True)
class Sinks:
    """How much attention every query gives the first tokens, per layer and head (StreamingLLM's sinks)."""

    first: np.ndarray  # [layer, head] mean attention to token 0 over all query positions
    first_four: np.ndarray  # [layer, head] mean attention to tokens 0-3
    num_tokens: int

    @property
    def sink_heads(self) -> list[tuple[int, int]]:
        """(layer, head) pairs that put more than half their attention on token 0."""
        return [tuple(map(int, x)) for x in np.argwhere(self.first > 0.5)]


def sinks(lm: LoadedModel, prompt: Prompt, chunk: int = 256) -> Sinks:
    """Mean attention to token 0 and to the first four tokens, over every query position of the prompt
    (query rows formed in chunks, so memory stays linear in the prompt's length)."""
    prof = profile(lm, prompt, queries="all", per_key=True, chunk=chunk)
    return Sinks(prof.per_key[:, :, 0], prof.per_key[:, :, :4].sum(-1), prompt.manifest.num_tokens)
