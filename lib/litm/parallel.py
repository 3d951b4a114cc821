"""Parallel documents (after Set-Based Prompting, McIlroy-Young et al. 2024, and PINE, Wang et al. 2025): in a
prompt rendered with `Variant(parallel=True)`, every document sees the shared prefix and itself only, from the
same starting position; the tokens after the documents (the question, the answer, anything generated) see
everything, at positions continuing after the longest document.  Whatever the documents' order, each one's keys
and values are the same, and what reads them sums over the same set: the model sees the same thing.

How: explicit position ids and a [batch, 1, query, key] mask built here (boolean for SDPA, additive for eager),
over a plain KV cache that keeps every key.  A sliding-window layer (Gemma 3, Qwen2 with `use_sliding_window`)
keeps its meaning in positions: a key is in a query's window when their position ids are less than the window
apart, as when the model was trained.  So the question's window reaches the same tail of every document in any
order; a window counted in token indices would reach only the documents laid out last.

Switched on by `interventions.intervene(lm, ParallelDocuments())`, which puts it in the run identity; inside,
`runner.score` scores through `loglik`, `choice` and `generate` here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from .errors import ConfigError
from .models import LoadedModel, synchronize
from .prompts import Prompt

SHARED, AFTER = -1, 1 << 30  # labels: the prefix; the tokens after the documents (documents are 0, 1, ...)
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "gemma3_text")  # take a 4D mask and position ids
IMPLEMENTATIONS = ("sdpa", "eager")


def check_model(lm: LoadedModel) -> None:
    """A clear error for a model this mask cannot drive: another family, or a kernel that builds its own mask."""
    family = getattr(lm.text_config, "model_type", None)
    if getattr(lm, "backend", "transformers") != "transformers":
        raise ConfigError(f"parallel documents need a transformers model; a {lm.backend} model only generates "
                          "through its own kernel.")
    if family not in FAMILIES:
        raise ConfigError(f"parallel documents are not supported for model type {family!r}; supported: "
                          f"{', '.join(FAMILIES)}.")
    impl = lm.model.config._attn_implementation
    if impl not in IMPLEMENTATIONS:
        raise ConfigError(f"parallel documents need a custom mask, which the {impl!r} attention implementation does "
                          "not take; load the model with attn_implementation='sdpa' (or 'eager').")


@dataclass
class _Tokens:
    """Per token of a batch row: position id, label (SHARED, a document index, AFTER), forced-choice branch (-1:
    none) and whether it is a real token (not padding); lists of [batch][token] ints."""

    pos: list
    label: list
    branch: list
    valid: list

    def tensors(self, device):
        import torch

        return [torch.tensor(x, dtype=torch.long if i < 3 else torch.bool, device=device)
                for i, x in enumerate((self.pos, self.label, self.branch, self.valid))]


def layout(prompt: Prompt, after: int = 0) -> tuple[list[int], list[int]]:
    """Position ids and labels of a prompt's tokens and of `after` tokens that follow it (an answer)."""
    m = prompt.manifest
    n = len(prompt.input_ids)
    if not m.doc_spans:  # closed book: nothing to put side by side
        return list(range(n + after)), [SHARED] * n + [AFTER] * after
    if not m.parallel:
        raise ConfigError(f"prompt {prompt.example_id} was rendered with its documents in a row; render it with "
                          "Variant(parallel=True) to score it with parallel documents.")
    start, end = m.doc_spans[0][0], m.doc_spans[-1][1]
    pos, label = list(range(start)), [SHARED] * start
    for k, (s, e) in enumerate(m.doc_spans):
        pos += range(start, start + e - s)
        label += [k] * (e - s)
    top = start + max(e - s for s, e in m.doc_spans)
    pos += range(top, top + n - end + after)
    label += [AFTER] * (n - end + after)
    return pos, label


def _rows(lm: LoadedModel, rows: Sequence[Sequence[int]], lays: Sequence[tuple[list, list]]):
    """Left-padded token ids [batch, width] and their _Tokens."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), lm.tokenizer.pad_token_id, dtype=torch.long)
    meta = _Tokens([], [], [], [])
    for b, (r, (pos, label)) in enumerate(zip(rows, lays)):
        pad = width - len(r)
        ids[b, pad:] = torch.tensor(list(r), dtype=torch.long)
        meta.pos.append([0] * pad + pos)
        meta.label.append([AFTER] * pad + label)
        meta.branch.append([-1] * width)
        meta.valid.append([False] * pad + [True] * len(r))
    return ids.to(lm.device), meta


def _mask(keys, queries, window: int | None):
    """[batch, query, key] booleans: what each new token (`queries`, the last of `keys`) may attend to."""
    import torch

    kp, kl, kb, kv = keys
    qp, ql, qb, qv = (t[:, -queries:] for t in keys)
    n_k = kp.shape[1]
    qi = torch.arange(n_k - queries, n_k, device=kp.device)
    see = kv[:, None, :] & (torch.arange(n_k, device=kp.device)[None, None, :] <= qi[None, :, None])
    see &= (kl[:, None, :] == SHARED) | (kl[:, None, :] == ql[:, :, None]) | (ql[:, :, None] == AFTER)
    see &= (kb[:, None, :] == -1) | (kb[:, None, :] == qb[:, :, None])
    if window is not None:
        see &= (qp[:, :, None] - kp[:, None, :]) < window
    diagonal = torch.zeros_like(see)
    diagonal[:, torch.arange(queries), qi] = True
    return torch.where(qv[:, :, None], see, diagonal)  # padding sees itself, so its row stays finite


def _windows(lm: LoadedModel) -> dict | None:
    """{layer type: window or None} for a model that takes one mask per layer type; None for one mask for all."""
    cfg = lm.text_config
    types = getattr(cfg, "layer_types", None)
    if types and set(types) != {"full_attention"}:
        return {t: (cfg.sliding_window if "sliding" in t else None) for t in set(types)}
    return None


def _attention_mask(lm: LoadedModel, keys, queries: int):
    """The mask argument for a forward over the last `queries` of `keys`: per layer type where the model has
    sliding-window layers, else one; boolean for SDPA, additive in the model's dtype for eager."""
    import torch

    def build(window):
        see = _mask(keys, queries, window)[:, None]
        if lm.model.config._attn_implementation == "sdpa":
            return see
        return torch.zeros(see.shape, dtype=lm.model.dtype, device=see.device).masked_fill_(
            ~see, torch.finfo(lm.model.dtype).min)

    windows = _windows(lm)
    if windows is None:
        return build(getattr(lm.text_config, "sliding_window", None)
                     if getattr(lm.text_config, "use_sliding_window", True) else None)
    return {t: build(w) for t, w in windows.items()}


class _Pass:
    """A batch's KV cache (every layer plain, every key kept) and the _Tokens of the keys it holds."""

    def __init__(self, lm: LoadedModel):
        from transformers import DynamicCache

        from .runner import _cache_kwarg

        self.lm, self.cache, self.keys = lm, DynamicCache(), None
        self.kw = _cache_kwarg(lm.model)

    def forward(self, ids, meta: _Tokens, logits_to_keep: int = 0):
        import torch

        new = meta.tensors(self.lm.device)
        keys = new if self.keys is None else [torch.cat([a, b], dim=1) for a, b in zip(self.keys, new)]
        out = self.lm.model(input_ids=ids, attention_mask=_attention_mask(self.lm, keys, ids.shape[1]),
                            position_ids=new[0], use_cache=True, logits_to_keep=logits_to_keep,
                            **{self.kw: self.cache})
        self.keys = keys
        return out.logits


def loglik(lm: LoadedModel, prompts: Sequence[Prompt], answers: Sequence[str], batch_size: int = 4):
    """`runner.loglik` with parallel documents."""
    import torch

    from .runner import Scored, _batches, _cont_ids, float32_logits

    conts = [_cont_ids(lm, p, a) for p, a in zip(prompts, answers)]
    rows = [list(p.input_ids) + c for p, c in zip(prompts, conts)]
    out: list = [None] * len(prompts)
    for batch in _batches([len(r) for r in rows], batch_size):
        t0 = time.perf_counter()
        ids, meta = _rows(lm, [rows[i] for i in batch], [layout(prompts[i], len(conts[i])) for i in batch])
        keep = max(len(conts[i]) for i in batch) + 1
        with torch.inference_mode(), float32_logits(lm):
            logp = torch.log_softmax(_Pass(lm).forward(ids, meta, keep).float(), dim=-1)
        synchronize(logp.device)
        dt = (time.perf_counter() - t0) / len(batch)
        for row, i in enumerate(batch):
            n = len(conts[i])
            pred = logp[row, keep - 1 - n: keep - 1]
            out[i] = Scored(gold_loglik=float(pred.gather(-1, torch.tensor(conts[i], device=logp.device)[:, None]).sum()),
                            latency_s=dt)
    return out


def _prefill(lm: LoadedModel, prompts: Sequence[Prompt]):
    """A _Pass with the prompts prefilled (left-padded) and each one's last-token log-probabilities."""
    import torch

    run = _Pass(lm)
    ids, meta = _rows(lm, [p.input_ids for p in prompts], [layout(p) for p in prompts])
    last = [pos[-1] for pos in meta.pos]
    return run, torch.log_softmax(run.forward(ids, meta, 1)[:, -1].float(), dim=-1), last


def choice(lm: LoadedModel, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]], gold: Sequence[int],
           batch_size: int = 4):
    """`runner.choice` with parallel documents: the prompts prefilled once, then every candidate's later tokens in
    one pass side by side, each seeing its prompt and its own earlier tokens (a tree mask)."""
    import torch

    from .runner import _batches, _cont_ids, choice_result, float32_logits

    out: list = [None] * len(prompts)
    conts = [[_cont_ids(lm, p, a) for a in c] for p, c in zip(prompts, candidates)]
    for batch in _batches([len(p.input_ids) + sum(map(len, c)) for p, c in zip(prompts, conts)], batch_size):
        t0 = time.perf_counter()
        with torch.inference_mode(), float32_logits(lm):
            run, first_logp, last = _prefill(lm, [prompts[i] for i in batch])
            cands = [conts[i] for i in batch]
            scores = [[float(first_logp[b, c[0]]) for c in row] for b, row in enumerate(cands)]
            width = max(sum(len(c) - 1 for c in row) for row in cands)
            if width:
                ids = torch.full((len(batch), width), lm.tokenizer.pad_token_id, dtype=torch.long)
                meta = _Tokens([[0] * width for _ in batch], [[AFTER] * width for _ in batch],
                               [[-1] * width for _ in batch], [[False] * width for _ in batch])
                slots = []
                for b, row in enumerate(cands):
                    at = 0
                    for j, c in enumerate(row):
                        for t, token in enumerate(c[:-1]):  # every token but the last, scored on the next one
                            ids[b, at + t] = token
                            meta.pos[b][at + t], meta.branch[b][at + t], meta.valid[b][at + t] = last[b] + 1 + t, j, True
                        slots.append((b, j, at))
                        at += len(c) - 1
                logp = torch.log_softmax(run.forward(ids.to(lm.device), meta).float(), dim=-1)
                for b, j, at in slots:
                    c = cands[b][j]
                    nxt = torch.tensor(c[1:], device=logp.device)
                    scores[b][j] += float(logp[b, at:at + len(c) - 1].gather(-1, nxt[:, None]).sum())
        dt = (time.perf_counter() - t0) / len(batch)
        for i, s in zip(batch, scores):
            out[i] = choice_result(s, gold[i], dt)
    return out


def generate(lm: LoadedModel, prompts: Sequence[Prompt], max_new_tokens: int = 100, batch_size: int = 4):
    """`runner.generate` with parallel documents: greedy, one token at a time, each new token seeing everything,
    until every row has ended a line, ended its turn or made `max_new_tokens`."""
    import torch

    from .runner import Scored, _batches, float32_logits

    tok = lm.tokenizer
    eos = getattr(lm.model.generation_config, "eos_token_id", None)
    stops = {tok.eos_token_id, *(eos if isinstance(eos, (list, tuple)) else [eos])} - {None}
    out: list = [None] * len(prompts)
    for batch in _batches([len(p.input_ids) for p in prompts], batch_size):
        t0 = time.perf_counter()
        made: list[list[int]] = [[] for _ in batch]
        done = [False] * len(batch)
        with torch.inference_mode(), float32_logits(lm):
            run, logp, last = _prefill(lm, [prompts[i] for i in batch])
            for step in range(max_new_tokens):
                nxt = logp.argmax(-1).tolist()
                for b, t in enumerate(nxt):
                    if not done[b]:
                        made[b].append(t)
                        done[b] = t in stops or "\n" in tok.decode(made[b], skip_special_tokens=True)
                if all(done) or step == max_new_tokens - 1:
                    break
                meta = _Tokens([[p + 1 + step] for p in last], [[AFTER]] * len(batch), [[-1]] * len(batch),
                               [[True]] * len(batch))
                logp = torch.log_softmax(run.forward(torch.tensor(nxt, device=lm.device)[:, None], meta, 1)[:, -1]
                                         .float(), dim=-1)
        synchronize(lm.device)
        dt = (time.perf_counter() - t0) / len(batch)
        for b, i in enumerate(batch):
            out[i] = Scored(prediction=tok.decode(made[b], skip_special_tokens=True), latency_s=dt)
    return out
