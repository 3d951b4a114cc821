"""Prefix caching: how much of a stream of prompts a prefix cache can reuse under each layout of the
documents, and the prefill time with a reused transformers KV cache against a cold prefill.  (Forced
choice over a prefix tree of prompts is `runner.shared_choice`.)"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from typing import Sequence

from .errors import ConfigError
from .models import LoadedModel, synchronize
from .ordering import arrange, ranked_top_k
from .types import Example

LAYOUTS = ("static", "per_query", "static_dynamic_top")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


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
            docs = arrange(ranked, strategy)
        else:
            docs = q.documents + tuple(replace(d, id=f"{d.id}#top") for d in ranked[:top])
        out.append(replace(q, documents=tuple(docs)))
    return out


# How far apart cold and warm last-token logits may be and still agree, per dtype, as a share of the largest
# |logit| (at least 1).  The two paths run the same arithmetic in kernels of other shapes, so they differ by
# rounding only, which scales with the numbers rounded.  float32: 1e-4 (it keeps 24 bits; measured: 3e-5 on
# SmolLM2's logits of 33).  bfloat16 and float16 keep 8 and 11 bits, unit roundoff u = 2**-9 and 2**-12;
# each layer's rounding is carried on, and SmolLM2's 30 layers in bfloat16 measured 0.53 on logits of 33
# (8u); 16u leaves room for deeper models.  A real mismatch (a wrong position, a token missing from the
# cache) moves the logits by a large share of their size.
AGREEMENT = {"float32": 1e-4, "bfloat16": 16 * 2.0 ** -9, "float16": 16 * 2.0 ** -12}


@dataclass(frozen=True)
class PrefillTiming:
    prompts: int
    shared_tokens: int  # prefilled once for the warm run
    total_tokens: int
    cold_s: float  # every prompt prefilled in full (median of the timed rounds)
    warm_s: float  # the shared prefix once, then each prompt's remainder from a copy of its cache (median)
    max_logit_diff: float  # between the cold and warm last-token logits
    tolerance: float = AGREEMENT["float32"]  # the most max_logit_diff may be to agree: AGREEMENT x the logits' size
    repeats: int = 1

    @property
    def speedup(self) -> float:
        return self.cold_s / self.warm_s if self.warm_s else float("nan")

    @property
    def agrees(self) -> bool:
        return self.max_logit_diff <= self.tolerance


def timed_prefill(lm: LoadedModel, prompts: Sequence[Sequence[int]], repeats: int = 3) -> PrefillTiming:
    """Prefill `prompts` cold, and again reusing one KV cache of their common prefix, and check that both give
    the same last-token logits (to the dtype's `AGREEMENT` of the logits' size).  One untimed prefill warms up
    (allocator, kernel choice, lazy CUDA set-up); then `repeats` rounds of cold and warm, side by side, each
    timed between device synchronisations; the medians are reported."""
    import statistics

    import torch

    from .runner import _cache_kwarg, returned_cache

    if not prompts:
        raise ConfigError("no prompts to time.")
    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, not {repeats}.")
    shared = min(min(common_prefix(prompts[0], p) for p in prompts), min(len(p) for p in prompts) - 1)
    kw = _cache_kwarg(lm.model)

    def run(ids, **extra):
        return lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), logits_to_keep=1, **extra)

    def cold():
        return [run(p, use_cache=False).logits[0, -1].float() for p in prompts]

    def warm():
        out = []
        head = run(prompts[0][:shared], use_cache=True) if shared else None
        for p in prompts:
            cache = copy.deepcopy(returned_cache(head)) if head else None
            extra = {kw: cache} if cache is not None else {}
            out.append(run(p[shared:], use_cache=True, **extra).logits[0, -1].float())
        return out

    seconds: dict[str, list[float]] = {"cold": [], "warm": []}
    diff = 0.0
    with torch.inference_mode():
        run(prompts[0], use_cache=True)  # the warm-up, untimed
        for _ in range(repeats):
            logits = {}
            for name, fn in (("cold", cold), ("warm", warm)):
                synchronize(lm.device)
                t0 = time.perf_counter()
                logits[name] = fn()
                synchronize(lm.device)
                seconds[name].append(time.perf_counter() - t0)
            diff = max(diff, max(float((a - b).abs().max()) for a, b in zip(logits["cold"], logits["warm"])))
    dtype = str(lm.model.dtype).removeprefix("torch.")
    size = max(1.0, max(float(x.abs().max()) for x in logits["cold"]))
    return PrefillTiming(len(prompts), shared, sum(len(p) for p in prompts), statistics.median(seconds["cold"]),
                         statistics.median(seconds["warm"]), diff,
                         AGREEMENT.get(dtype, AGREEMENT["bfloat16"]) * size, repeats)


def layout_study(lm: LoadedModel, questions: Sequence[Example], relevance: Sequence[Sequence[float]],
                 layouts: Sequence[str] = LAYOUTS, strategy: str = "u_shape", top: int = 1, variant=None,
                 time_first: int | None = 5, batch_size: int = 4):
    """Questions sharing one document set under each layout: forced-choice accuracy (Wilson 95%), the
    fraction of prompt tokens a prefix cache reuses, and cold against warm prefill time for the first
    `time_first` questions.  Returns (summary table, one row per question and layout)."""
    import pandas as pd

    from .prompts import Variant, render
    from .runner import score, target
    from .stats import proportion_interval

    variant = variant or Variant()
    rows, summary = [], []
    for name in layouts:
        qs = layout(questions, name, relevance, strategy, top)
        prompts = [render(q, lm.tokenizer, variant) for q in qs]
        scored = score(lm, prompts, [target(q, "choice") for q in qs], "choice", batch_size)
        for q, p, s in zip(qs, prompts, scored):
            rows.append({"layout": name, "example_id": q.id, "correct": s.correct,
                         "gold_index": p.manifest.gold_index, "prompt_tokens": p.manifest.num_tokens})
        ids = [p.input_ids for p in prompts]
        t = timed_prefill(lm, ids[:time_first] if time_first else ids)
        acc, lo, hi = proportion_interval([s.correct for s in scored])
        summary.append({"layout": name, "n": len(scored), "accuracy": acc, "ci_low": lo, "ci_high": hi,
                        "reuse_fraction": reuse(ids).fraction, "timed_prompts": t.prompts,
                        "shared_tokens": t.shared_tokens, "cold_s": t.cold_s, "warm_s": t.warm_s, "speedup": t.speedup,
                        "max_logit_diff": t.max_logit_diff})
    return pd.DataFrame(summary), pd.DataFrame(rows)
