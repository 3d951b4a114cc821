"""Batched forward passes over rendered prompts: greedy generation, gold log-likelihood, forced choice.

Prompts are sorted by length and left-padded in batches; position ids are computed from the padding
mask so a padded row sees exactly the positions it would see alone.
"""
from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass
from typing import Sequence

from .models import LoadedModel
from .prompts import Prompt


@dataclass(frozen=True)
class Scored:
    """What a scoring pass returns for one prompt."""

    prediction: str | None = None
    gold_loglik: float | None = None
    gold_rank: int | None = None  # 1 = the gold scored best among the candidates
    candidate_logliks: tuple[float, ...] | None = None
    latency_s: float = 0.0


def _batches(lengths: Sequence[int], batch_size: int):
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def _left_pad(rows: list[list[int]], pad_id: int, device):
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def _cache_kwarg(model) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.x; use whichever this version takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cont_ids(lm: LoadedModel, prompt: Prompt, answer: str) -> list[int]:
    ids = lm.tokenizer(prompt.continuation(answer), add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"answer {answer!r} tokenizes to nothing")
    return ids


def loglik(lm: LoadedModel, prompts: Sequence[Prompt], answers: Sequence[str], batch_size: int = 4) -> list[Scored]:
    """Teacher-forced log-likelihood (natural log, summed over tokens) of each answer after its prompt."""
    import torch

    conts = [_cont_ids(lm, p, a) for p, a in zip(prompts, answers)]
    rows = [list(p.input_ids) + c for p, c in zip(prompts, conts)]
    out: list[Scored | None] = [None] * len(prompts)
    for batch in _batches([len(r) for r in rows], batch_size):
        t0 = time.perf_counter()
        ids, mask, pos = _left_pad([rows[i] for i in batch], lm.tokenizer.pad_token_id, lm.device)
        keep = max(len(conts[i]) for i in batch) + 1
        with torch.inference_mode():
            logits = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        dt = (time.perf_counter() - t0) / len(batch)
        for row, i in enumerate(batch):
            c = torch.tensor(conts[i], device=logp.device)
            n = len(conts[i])
            # logits at position t predict token t+1: the answer's tokens are the last n of the row
            pred = logp[row, keep - 1 - n: keep - 1]
            out[i] = Scored(gold_loglik=float(pred.gather(-1, c[:, None]).sum()), latency_s=dt)
    return out  # type: ignore[return-value]


def choice(lm: LoadedModel, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]],
           gold: Sequence[int], batch_size: int = 4) -> list[Scored]:
    """Forced choice: score every candidate answer after its prompt; the prompt is prefilled once.

    `gold[i]` is the index of the right answer in `candidates[i]`; ties count against the gold.
    """
    import torch

    out: list[Scored | None] = [None] * len(prompts)
    for batch in _batches([len(p.input_ids) for p in prompts], batch_size):
        t0 = time.perf_counter()
        ids, mask, pos = _left_pad([list(prompts[i].input_ids) for i in batch], lm.tokenizer.pad_token_id, lm.device)
        with torch.inference_mode():
            pre = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        first_logp = torch.log_softmax(pre.logits[:, -1].float(), dim=-1)
        scored = candidate_scores(lm, pre["cache"] if "cache" in pre else pre["past_key_values"], mask, first_logp,
                                  [[_cont_ids(lm, prompts[i], a) for a in candidates[i]] for i in batch])
        dt = (time.perf_counter() - t0) / len(batch)
        for i, s in zip(batch, scored):
            out[i] = choice_result(s, gold[i], dt)
    return out  # type: ignore[return-value]


def choice_result(scores: Sequence[float], gold: int, latency_s: float = 0.0) -> Scored:
    """A forced choice's outcome: the gold's rank among the candidates (ties count against the gold)."""
    rank = 1 + sum(1 for j, v in enumerate(scores) if j != gold and v >= scores[gold])
    return Scored(gold_loglik=scores[gold], gold_rank=rank, candidate_logliks=tuple(scores), latency_s=latency_s)


def _plain_layers(cache) -> bool:
    """Whether every layer of a KV cache is a plain growing one (no sliding window): then candidates can
    extend it side by side under a custom mask and the cache can be put back as it was."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def candidate_scores(lm: LoadedModel, cache, prefix_mask, first_logp, cands: list[list[list[int]]]) -> list[list[float]]:
    """Log-likelihood of each candidate's tokens after a prefilled batch of prompts.

    `cache` holds the batch's prompts (left-padded; `prefix_mask` [batch, length]), `first_logp` [batch,
    vocab] their next-token log-probabilities and `cands[b]` row b's candidates as token lists.  Every
    candidate's first token is read off `first_logp`; the rest come from one extra forward in which each
    row's candidates sit side by side, each seeing the prompt and its own earlier tokens only (a tree
    mask).  The cache is left as it was, so it can serve other branches."""
    import torch

    scores = [[float(first_logp[b, c[0]]) for c in row] for b, row in enumerate(cands)]
    if all(len(c) == 1 for row in cands for c in row):
        return scores
    if not _plain_layers(cache):  # sliding-window caches: one copy of the row per candidate
        return [_scores_from_copies(lm, cache, b, prefix_mask[b:b + 1], first_logp[b], row)
                for b, row in enumerate(cands)]
    dev = lm.device
    batch, length = prefix_mask.shape
    width = max(sum(len(c) - 1 for c in row) for row in cands)
    neg = torch.finfo(lm.model.dtype).min
    ids = torch.full((batch, width), lm.tokenizer.pad_token_id, dtype=torch.long)
    pos = torch.zeros((batch, width), dtype=torch.long)
    mask = torch.full((batch, 1, width, length + width), neg, dtype=lm.model.dtype)
    mask[:, 0, :, :length] = torch.where(prefix_mask.cpu()[:, None, :].bool(), 0.0, neg)
    mask[:, 0, torch.arange(width), length + torch.arange(width)] = 0  # every slot sees itself (no empty rows)
    slots = []  # (row, candidate, first slot) of each candidate with more than one token
    for b, row in enumerate(cands):
        start, at = int(prefix_mask[b].sum()), 0
        for j, c in enumerate(row):
            n = len(c) - 1
            if n == 0:
                continue
            ids[b, at:at + n] = torch.tensor(c[:-1])
            pos[b, at:at + n] = start + torch.arange(n)
            mask[b, 0, at:at + n, length + at:length + at + n] = torch.triu(torch.full((n, n), neg), 1)
            slots.append((b, j, at))
            at += n
    saved = [(layer.keys, layer.values) for layer in cache.layers]
    try:
        with torch.inference_mode():
            logits = lm.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                              use_cache=True, **{_cache_kwarg(lm.model): cache}).logits
    finally:  # the forward appended the candidates' keys and values; put the prompt's back
        for layer, (k, v) in zip(cache.layers, saved):
            layer.keys, layer.values = k, v
    logp = torch.log_softmax(logits.float(), dim=-1)
    for b, j, at in slots:
        c = cands[b][j]
        nxt = torch.tensor(c[1:], device=logp.device)
        scores[b][j] += float(logp[b, at:at + len(c) - 1].gather(-1, nxt[:, None]).sum())
    return scores


def _scores_from_copies(lm: LoadedModel, cache, row: int, prefix_mask, first_logp, cands: list[list[int]]) -> list[float]:
    """`candidate_scores` for one row by copying the cache once per candidate (any cache type)."""
    import torch

    n, width = len(cands), max(len(c) for c in cands)
    ids = torch.full((n, width), lm.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for j, c in enumerate(cands):
        ids[j, :len(c)] = torch.tensor(c)
        mask[j, :len(c)] = 1
    ids, mask = ids.to(lm.device), mask.to(lm.device)
    scores = first_logp[ids[:, 0]]
    cache = copy.deepcopy(cache)
    cache.batch_select_indices(torch.tensor([row] * n, device=lm.device))
    full_mask = torch.cat([prefix_mask.to(lm.device).expand(n, -1), mask], dim=1)
    start = int(prefix_mask.sum())
    pos = (start + torch.arange(width, device=lm.device)).expand(n, -1)
    with torch.inference_mode():
        logits = lm.model(input_ids=ids[:, :-1], attention_mask=full_mask[:, :-1], position_ids=pos[:, :-1],
                          use_cache=True, **{_cache_kwarg(lm.model): cache}).logits
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return (scores + (lp * mask[:, 1:]).sum(-1)).tolist()


def generate(lm: LoadedModel, prompts: Sequence[Prompt], max_new_tokens: int = 100,
             batch_size: int = 4) -> list[Scored]:
    """Greedy decoding that stops at a newline, end of turn or `max_new_tokens` (the paper used 100)."""
    import torch

    out: list[Scored | None] = [None] * len(prompts)
    tok = lm.tokenizer
    for batch in _batches([len(p.input_ids) for p in prompts], batch_size):
        t0 = time.perf_counter()
        ids, mask, _ = _left_pad([list(prompts[i].input_ids) for i in batch], tok.pad_token_id, lm.device)
        with torch.inference_mode():
            gen = lm.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                    do_sample=False, temperature=None, top_p=None, top_k=None,
                                    stop_strings=["\n"], tokenizer=tok, pad_token_id=tok.pad_token_id)
        dt = (time.perf_counter() - t0) / len(batch)
        for row, i in enumerate(batch):
            text = tok.decode(gen[row, ids.shape[1]:], skip_special_tokens=True)
            out[i] = Scored(prediction=text, latency_s=dt)  # metrics cut at the first newline
    return out  # type: ignore[return-value]
