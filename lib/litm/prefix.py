"""Prefix caching: how much of a stream of prompts a prefix cache can reuse under each layout of the
documents, and the prefill time with a reused transformers KV cache against a cold prefill."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from typing import Sequence

from .errors import ConfigError
from .models import LoadedModel
from .ordering import arrange, ranked_top_k
from .types import Document, Example

LAYOUTS = ("static", "per_query", "static_dynamic_top")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Reuse:
    total_tokens: int
    reused_tokens: int  # tokens a prefix cache holding every earlier prompt would not prefill again

    @property
    def fraction(self) -> float:
        return self.reused_tokens / self.total_tokens if self.total_tokens else 0.0


def reuse(prompts: Sequence[Sequence[int]]) -> Reuse:
    """Prompts in arrival order; each reuses its longest common prefix with any earlier prompt (what an
    unbounded prefix cache, e.g. vLLM's automatic prefix caching at token granularity, can skip)."""
    total = reused = 0
    for i, p in enumerate(prompts):
        total += len(p)
        best = max((common_prefix(p, q) for q in prompts[:i]), default=0)
        reused += min(best, len(p) - 1)  # the last token is always run: its logits are needed
    return Reuse(total, reused)


def layout(questions: Sequence[Example], layout_name: str, relevance: Sequence[Sequence[float]],
           strategy: str = "u_shape", top: int = 1) -> list[Example]:
    """Questions that share one document set, laid out for a prefix cache:

    - "static": the documents in one fixed order (as given) for every question, then the question;
    - "per_query": the documents reordered for each question by its relevance scores with `strategy`;
    - "static_dynamic_top": the fixed documents, then a dynamic block repeating each question's `top`
      most relevant documents next to the question.
    `relevance[i]` scores `questions[i].documents` for question i."""
    if layout_name not in LAYOUTS:
        raise ConfigError(f"unknown layout {layout_name!r}: use one of {LAYOUTS}.")
    if len(relevance) != len(questions):
        raise ConfigError(f"got relevance scores for {len(relevance)} questions, need {len(questions)}.")
    base = [d.id for d in questions[0].documents] if questions else []
    if any([d.id for d in q.documents] != base for q in questions):
        raise ConfigError("the questions do not share one document set in one order.")
    out = []
    for q, s in zip(questions, relevance):
        ranked = ranked_top_k(q.documents, s)
        if layout_name == "static":
            docs = q.documents
        elif layout_name == "per_query":
            docs = tuple(arrange(ranked, strategy))
        else:
            docs = q.documents + tuple(_copy(d) for d in ranked[:top])
        out.append(replace(q, documents=tuple(docs)))
    return out


def _copy(d: Document) -> Document:
    return replace(d, id=f"{d.id}#top")


@dataclass(frozen=True)
class PrefillTiming:
    prompts: int
    shared_tokens: int  # prefilled once for the warm run
    total_tokens: int
    cold_s: float  # every prompt prefilled in full
    warm_s: float  # the shared prefix once, then each prompt's remainder from a copy of its cache
    max_logit_diff: float  # between the cold and warm last-token logits (they must agree)

    @property
    def speedup(self) -> float:
        return self.cold_s / self.warm_s if self.warm_s else float("nan")


def timed_prefill(lm: LoadedModel, prompts: Sequence[Sequence[int]], repeats: int = 1) -> PrefillTiming:
    """Prefill `prompts` cold, and again reusing one KV cache of their common prefix (timed side by side,
    best of `repeats`), checking that both give the same last-token logits."""
    import torch

    from .runner import _cache_kwarg

    if not prompts:
        raise ConfigError("no prompts to time.")
    shared = min(min(common_prefix(prompts[0], p) for p in prompts), min(len(p) for p in prompts) - 1)
    kw = _cache_kwarg(lm.model)

    def cold():
        out = []
        for p in prompts:
            ids = torch.tensor([list(p)], device=lm.device)
            out.append(lm.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float())
        return out

    def warm():
        out = []
        head = lm.model(input_ids=torch.tensor([list(prompts[0][:shared])], device=lm.device), use_cache=True,
                        logits_to_keep=1) if shared else None
        for p in prompts:
            cache = copy.deepcopy(head["cache"] if "cache" in head else head["past_key_values"]) if head else None
            ids = torch.tensor([list(p[shared:])], device=lm.device)
            extra = {kw: cache} if cache is not None else {}
            out.append(lm.model(input_ids=ids, use_cache=True, logits_to_keep=1, **extra).logits[0, -1].float())
        return out

    best = {"cold": float("inf"), "warm": float("inf")}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, fn in (("cold", cold), ("warm", warm)):
                t0 = time.perf_counter()
                logits = fn()
                best[name] = min(best[name], time.perf_counter() - t0)
                if name == "cold":
                    ref = logits
                else:
                    diff = max(float((a - b).abs().max()) for a, b in zip(ref, logits))
    return PrefillTiming(len(prompts), shared, sum(len(p) for p in prompts), best["cold"], best["warm"], diff)


def layout_study(lm: LoadedModel, questions: Sequence[Example], relevance: Sequence[Sequence[float]],
                 layouts: Sequence[str] = LAYOUTS, strategy: str = "u_shape", top: int = 1, variant=None,
                 time_first: int | None = 5, batch_size: int = 4):
    """Questions sharing one document set under each layout: forced-choice accuracy (Wilson 95%), the
    fraction of prompt tokens a prefix cache reuses, and cold against warm prefill time for the first
    `time_first` questions.  Returns (summary table, one row per question and layout)."""
    import pandas as pd

    from .experiment import candidates
    from .prompts import Variant, render
    from .runner import choice
    from .stats import wilson_interval

    variant = variant or Variant()
    rows, summary = [], []
    for name in layouts:
        qs = layout(questions, name, relevance, strategy, top)
        prompts = [render(q, lm.tokenizer, variant) for q in qs]
        cands = [candidates(q) for q in qs]
        scored = choice(lm, prompts, [c[0] for c in cands], [c[1] for c in cands], batch_size)
        for q, p, s in zip(qs, prompts, scored):
            rows.append({"layout": name, "example_id": q.id, "correct": s.gold_rank == 1,
                         "gold_index": p.manifest.gold_index, "prompt_tokens": p.manifest.num_tokens})
        ids = [p.input_ids for p in prompts]
        r = reuse(ids)
        t = timed_prefill(lm, ids[:time_first] if time_first else ids)
        k = sum(s.gold_rank == 1 for s in scored)
        lo, hi = wilson_interval(k, len(scored))
        summary.append({"layout": name, "n": len(scored), "accuracy": k / len(scored), "ci_low": lo, "ci_high": hi,
                        "reuse_fraction": r.fraction, "timed_prompts": t.prompts, "shared_tokens": t.shared_tokens,
                        "cold_s": t.cold_s, "warm_s": t.warm_s, "speedup": t.speedup,
                        "max_logit_diff": t.max_logit_diff})
    return pd.DataFrame(summary), pd.DataFrame(rows)


@dataclass(frozen=True)
class TreeStats:
    prompts: int
    total_tokens: int  # what prefilling every prompt on its own costs
    prefill_tokens: int  # what the prefix tree prefills: each shared prefix once

    @property
    def saving(self) -> float:
        return self.total_tokens / self.prefill_tokens if self.prefill_tokens else float("nan")


def _tree(seqs: list[tuple[int, ...]], idx: list[int], depth: int):
    """Children of a trie node at `depth`: (segment end, prompt indices ending here, grandchildren)."""
    groups: dict[int, list[int]] = {}
    for i in idx:
        if len(seqs[i]) > depth:
            groups.setdefault(seqs[i][depth], []).append(i)
    out = []
    for members in groups.values():
        end = depth + 1
        while True:  # extend the segment while every member continues with the same token
            if any(len(seqs[i]) <= end for i in members) or len({seqs[i][end] for i in members}) > 1:
                break
            end += 1
        out.append((end, [i for i in members if len(seqs[i]) == end], _tree(seqs, members, end)))
    return out


def shared_choice(lm: LoadedModel, prompts, candidates, gold) -> tuple[list, TreeStats]:
    """Forced choice over `prompts` with a prefix tree: every shared prefix (the instruction, the documents
    before the gold in a position sweep) is prefilled once and branched by copying its KV cache; each
    prompt's candidates are then scored from its own cache.  Same scores as `runner.choice`."""
    import torch

    from .runner import _cache_kwarg, _cont_ids, candidate_scores, choice_result

    seqs = [tuple(p.input_ids) for p in prompts]
    kw = _cache_kwarg(lm.model)
    out: list = [None] * len(prompts)
    prefilled = 0

    def forward(ids, cache, start):
        pos = torch.arange(start, start + len(ids), device=lm.device)[None]
        extra = {kw: cache} if cache is not None else {}
        res = lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), position_ids=pos, use_cache=True,
                       logits_to_keep=1, **extra)
        return res["cache"] if "cache" in res else res["past_key_values"], res.logits[0, -1].float()

    def score(i, cache, last):
        cands = [_cont_ids(lm, prompts[i], a) for a in candidates[i]]
        out[i] = choice_result(candidate_scores(lm, cache, torch.ones((1, len(seqs[i])), dtype=torch.long),
                                                torch.log_softmax(last, -1)[None], [cands])[0], gold[i])

    def walk(children, cache, depth):
        nonlocal prefilled
        for k, (end, ending, grand) in enumerate(children):
            last_child = k == len(children) - 1
            base = cache if last_child or cache is None else copy.deepcopy(cache)
            seg = seqs[ending[0] if ending else _first(grand)][depth:end]
            prefilled += len(seg)
            new_cache, last = forward(seg, base, depth)
            for i in ending:
                score(i, new_cache, last)
            if grand:
                walk(grand, new_cache, end)

    def _first(children):
        end, ending, grand = children[0]
        return ending[0] if ending else _first(grand)

    with torch.inference_mode():
        walk(_tree(seqs, list(range(len(seqs))), 0), None, 0)
    return out, TreeStats(len(seqs), sum(len(s) for s in seqs), prefilled)
