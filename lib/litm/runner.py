"""Scoring: `score` is the one entry point every study and notebook scores prompts through, over batched
forward passes (greedy generation, gold log-likelihood, forced choice; a prefix tree for forced choice
over prompts that share beginnings).

Prompts are sorted by length and left-padded in batches (forced choice right-pads where the KV cache has
no sliding window); position ids are computed from the padding mask so a padded row sees exactly the
positions it would see alone.

The tie rule of forced choice: a tie counts against the gold.  The gold's rank is 1 + the number of
other candidates scoring at least as high, and a choice is right only when the gold scores strictly
highest.  So accuracy stays a right/wrong outcome (Wilson intervals, McNemar and Cochran's Q stay exact)
and a tie is never credited as knowledge; the price is a downward bias bounded by the share of ties.

A candidate's score is its log-likelihood summed over its tokens, not normalised by length.  A paired
effect over positions (the middle penalty, a difference from a baseline) is unaffected, since a question
has the same candidates at every position; accuracy levels favour short candidates, which lose less
log-likelihood to their extra tokens.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import math
import time
from dataclasses import dataclass, replace
from typing import Sequence

from . import interventions
from .errors import ConfigError
from .metrics import best_subspan_em, kv_match
from .models import LoadedModel, synchronize
from .prompts import Prompt
from .types import Example

SCORINGS = ("generate", "loglik", "choice")

# How far a score (a log-likelihood or a margin, in nats) may move with the batch size or the sharding of a run,
# by dtype.  A prompt is padded to its batch's longest, and the padded matrix products round differently; nothing
# else changes.  Measured on SmolLM2-135M (`benchmarks/batch_bound.py`: QA, 10 documents, about 750 tokens, batch 1
# against 4): at most 3.2e-5 in float32 (8e-5 in other runs) and 0.21 in bfloat16, where each layer's output keeps
# 8 bits of mantissa.  The bounds leave room above those; a decision whose margin exceeds the bound cannot flip.
BATCH_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.5}

UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -9, "float16": 2.0 ** -11}


def dtype_bound(prompt_tokens: int, size: float = 0.0, dtype: str = "bfloat16") -> float:
    """How far a record's score may move between float32 and `dtype`: 16 u sqrt(L) + 8 u |S| nats, for a prompt
    of L tokens and scores of size S (the larger magnitude of the two log-likelihoods a margin compares, or of the
    one log-likelihood), u the dtype's unit roundoff.  bfloat16, 750 tokens, S = 7 nats: 0.85 + 0.11 nats.

    Where it comes from.  The scores are float32 log-softmaxes of logits taken from `dtype` hidden states, so
    they move with the hidden states' error, which has two parts.  (1) Each token's state is a softmax-weighted
    sum over the L positions it attends to; rounding errors of size u in L terms add like a random walk, to
    about u sqrt(L).  A margin is a difference of two log-likelihoods (x2), each a logit minus a log-sum-exp that
    move independently (x2), summed over an answer's tokens (up to four here: x4): 16 u sqrt(L).  (2) The last
    hidden state's relative error, a few roundings of u (the residual stream and the final norm: x2), scales
    every logit, so a log-likelihood moves in proportion to its own size; two scores (x2), a logit and a
    log-sum-exp (x2): 8 u |S|.  Measured (`benchmarks/cpu_roofline.py --only conclusions`): on tiny models
    bfloat16 stays within 8% of it; on SmolLM2-135M 107 of 108 records stayed within it and one moved 1.23 times
    it, so it is an estimate of the rounding's size, not a guarantee (the layers' roundings, folded in above,
    are the first suspect: SmolLM2 has 30)."""
    u = UNIT_ROUNDOFF[dtype]
    return 16 * u * math.sqrt(prompt_tokens) + 8 * u * abs(size)


@dataclass(frozen=True)
class Scored:
    """What a scoring pass returns for one prompt."""

    prediction: str | None = None
    gold_loglik: float | None = None
    gold_rank: int | None = None  # 1 = the gold scored best among the candidates (ties count against it)
    gold_margin: float | None = None  # the gold's log-likelihood minus the best other candidate's (> 0: right)
    candidate_logliks: tuple[float, ...] | None = None
    latency_s: float = 0.0
    correct: bool | None = None  # None under log-likelihood scoring
    chosen: int | None = None  # forced choice: the candidate picked (a tie is never resolved for the gold)


@dataclass(frozen=True)
class Target:
    """What one prompt is scored against: the accepted answers (log-likelihood scores the first; a
    generation is right when it contains one, exactly for KV), and for forced choice the candidates and
    the index of the right one."""

    answers: tuple[str, ...]
    task: str = "qa"
    candidates: tuple[str, ...] | None = None
    gold: int | None = None


def candidates(example: Example) -> tuple[list[str], int]:
    """Forced-choice candidates: the answers the documents support (each once, in order of first
    appearance); returns them and the index of the gold's."""
    answers = [d.answer for d in example.documents]
    if any(a is None for a in answers):
        raise ConfigError(f"example {example.id}: forced choice needs an answer per document (generated QA, "
                          "or KV); use scoring='loglik' or 'generate' for this data.")
    unique = list(dict.fromkeys(answers))
    return unique, unique.index(example.gold.answer)


def target(example: Example, scoring: str, choices: tuple[Sequence[str], int] | None = None) -> Target:
    """The Target of an example under a scoring; forced choice takes `choices` (candidates, gold index) or
    the answers of the example's documents, and refuses a single candidate (chance would be 100%)."""
    if scoring != "choice":
        return Target(tuple(example.answers), example.task)
    cands, gold = choices or candidates(example)
    if len(cands) < 2:
        raise ConfigError(f"example {example.id}: forced choice among {len(cands)} candidate is always right "
                          "(chance is 100%); give at least two documents with different answers, or use "
                          "scoring='loglik' or 'generate'.")
    return Target(tuple(example.answers), example.task, tuple(cands), gold)


def score(lm, prompts: Sequence[Prompt], targets: Sequence[Target], scoring: str, batch_size: int = 4,
          max_new_tokens: int = 100, shared_prefix: bool = False) -> list[Scored]:
    """Score each prompt against its target: `generate` (greedy, right when an accepted answer is in the
    first line), `loglik` (the first answer's log-likelihood) or `choice` (the candidates ranked by
    log-likelihood; `shared_prefix` prefills the prompts' common beginnings once: the same scores up to the
    dtype's rounding, `shared_choice`).  A vLLM
    model (`--backend vllm`) generates only."""
    if scoring not in SCORINGS:
        raise ConfigError(f"unknown scoring {scoring!r}: use one of {SCORINGS}.")
    if not prompts:
        return []
    if getattr(lm, "backend", "transformers") != "transformers":
        if scoring != "generate":
            raise ConfigError(f"a {lm.backend} model only generates; use scoring='generate'.")
        out = lm.generate(prompts, max_new_tokens)
    elif interventions.parallel_documents():  # a prefix tree changes no score here: each prompt is prefilled whole
        from . import parallel

        if scoring == "loglik":
            return parallel.loglik(lm, prompts, [t.answers[0] for t in targets], batch_size)
        if scoring == "choice":
            return parallel.choice(lm, prompts, [t.candidates for t in targets], [t.gold for t in targets], batch_size)
        out = parallel.generate(lm, prompts, max_new_tokens, batch_size)
    elif scoring == "loglik":
        return loglik(lm, prompts, [t.answers[0] for t in targets], batch_size)
    elif scoring == "choice":
        cands, gold = [t.candidates for t in targets], [t.gold for t in targets]
        return shared_choice(lm, prompts, cands, gold)[0] if shared_prefix else choice(lm, prompts, cands, gold,
                                                                                         batch_size)
    else:
        out = generate(lm, prompts, max_new_tokens, batch_size)
    return [replace(s, correct=kv_match(s.prediction, t.answers[0]) if t.task == "kv"
                    else best_subspan_em(s.prediction, t.answers)) for s, t in zip(out, targets)]


def needed_tokens(lm, prompt: Prompt, target: Target | None, scoring: str, max_new_tokens: int = 100) -> int:
    """Tokens the scoring needs in the model's window: the prompt plus the longest candidate, the answer or
    `max_new_tokens` (the prompt alone without a target)."""
    if target is None:
        return len(prompt.input_ids)
    if scoring == "generate":
        return len(prompt.input_ids) + max_new_tokens
    answers = target.candidates if scoring == "choice" else target.answers[:1]
    return len(prompt.input_ids) + max(len(_cont_ids(lm, prompt, a)) for a in answers)


_HEAD_BLOCK = 8192  # vocabulary rows of the output head upcast at a time by float32_logits


@contextlib.contextmanager
def float32_logits(lm: LoadedModel):
    """Within it, the model's output head computes its logits in float32 whatever the model's dtype (the
    hidden state upcast, the head's weight upcast a block of the vocabulary at a time, so no float32 copy of
    the whole head is held).  bfloat16 logits keep 8 bits of mantissa: candidates a few thousandths of a
    logit apart would tie, and ties count against the gold.  A no-op for float32 heads."""
    import torch
    import torch.nn.functional as F

    head = lm.model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.weight.dtype == torch.float32:
        yield
        return

    def forward(hidden):
        w, b = head.weight, head.bias
        x = hidden.to(w.device).float()
        return torch.cat([F.linear(x, w[i:i + _HEAD_BLOCK].float(), None if b is None else b[i:i + _HEAD_BLOCK].float())
                          for i in range(0, w.shape[0], _HEAD_BLOCK)], dim=-1)

    # under a device_map, accelerate's hook wraps the head's own forward (kept as `_old_forward`): replace that
    # one, so the hook still moves the input to the head's device and loads offloaded weights before the call
    attr = "_old_forward" if "_hf_hook" in head.__dict__ and "_old_forward" in head.__dict__ else "forward"
    before = head.__dict__.get(attr)
    setattr(head, attr, forward)
    try:
        yield
    finally:
        if before is None:
            delattr(head, attr)
        else:
            setattr(head, attr, before)


def _batches(lengths: Sequence[int], batch_size: int):
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def _left_pad(rows: list[list[int]], pad_id: int, device, right: bool = False):
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        at = slice(0, len(r)) if right else slice(width - len(r), width)
        ids[i, at], mask[i, at] = torch.tensor(r, dtype=torch.long), 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def _cache_kwarg(model) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.x; use whichever this version takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(out):
    """The KV cache a forward pass returned, under whichever name this transformers version gives it."""
    return out["cache"] if "cache" in out else out["past_key_values"]


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
        with torch.inference_mode(), float32_logits(lm), \
                interventions.scoring([prompts[i] for i in batch], [ids.shape[1] - len(rows[i]) for i in batch]):
            logits = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        synchronize(logp.device)
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
    from transformers import DynamicCache

    # A plain cache (no sliding window): prompts right-padded, so the prefill is plain causal attention (no mask;
    # no prompt token sees the pads after it, and the candidates are masked off them).  Else left-padded.
    try:
        right = _plain_layers(DynamicCache(config=lm.model.config))
    except (AttributeError, KeyError, TypeError, ValueError):  # a cache transformers cannot build from the config
        right = False
    out: list[Scored | None] = [None] * len(prompts)
    conts = [[_cont_ids(lm, p, a) for a in c] for p, c in zip(prompts, candidates)]
    # batched by prompt plus candidate tokens: the candidates' pass is padded to its batch's most
    for batch in _batches([len(p.input_ids) + sum(map(len, c)) for p, c in zip(prompts, conts)], batch_size):
        t0 = time.perf_counter()
        ids, mask, pos = _left_pad([list(prompts[i].input_ids) for i in batch], lm.tokenizer.pad_token_id, lm.device,
                                   right)
        last = [len(prompts[i].input_ids) - 1 if right else ids.shape[1] - 1 for i in batch]
        keep, col = torch.tensor(last).unique(return_inverse=True)
        offsets = [0 if right else ids.shape[1] - len(prompts[i].input_ids) for i in batch]
        with torch.inference_mode(), float32_logits(lm), \
                interventions.scoring([prompts[i] for i in batch], offsets):  # logits at each row's last token
            pre = lm.model(input_ids=ids, use_cache=True, logits_to_keep=keep.to(lm.device),
                           **({} if right else {"attention_mask": mask, "position_ids": pos}))
            first_logp = torch.log_softmax(pre.logits[torch.arange(len(batch)), col.to(pre.logits.device)].float(),
                                           dim=-1)
            scored = candidate_scores(lm, returned_cache(pre), mask, first_logp, [conts[i] for i in batch])
        dt = (time.perf_counter() - t0) / len(batch)
        for i, s in zip(batch, scored):
            out[i] = choice_result(s, gold[i], dt)
    return out  # type: ignore[return-value]


def choice_result(scores: Sequence[float], gold: int, latency_s: float = 0.0) -> Scored:
    """A forced choice's outcome under the tie rule (module docstring): the gold's rank, whether it is
    right, its margin over the best other candidate, and the candidate picked (the first best one that is not
    the gold, when the gold only ties)."""
    best = max(scores)
    rank = 1 + sum(1 for j, v in enumerate(scores) if j != gold and v >= scores[gold])
    chosen = next((j for j, v in enumerate(scores) if v == best and j != gold), gold)
    margin = scores[gold] - max(v for j, v in enumerate(scores) if j != gold)
    return Scored(gold_loglik=scores[gold], gold_rank=rank, gold_margin=margin, candidate_logliks=tuple(scores),
                  latency_s=latency_s, correct=rank == 1, chosen=chosen)


def _plain_layers(cache) -> bool:
    """Whether every layer of a KV cache is a plain growing one (no sliding window): then candidates can
    extend it side by side under a custom mask and the cache can be put back as it was."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def candidate_scores(lm: LoadedModel, cache, prefix_mask, first_logp, cands: list[list[list[int]]]) -> list[list[float]]:
    """Log-likelihood of each candidate's tokens after a prefilled batch of prompts.

    `cache` holds the batch's prompts (padded; `prefix_mask` [batch, length]), `first_logp` [batch,
    vocab] their next-token log-probabilities and `cands[b]` row b's candidates as token lists.  Every
    candidate's first token is read off `first_logp`; the rest come from one extra forward in which each
    row's candidates sit side by side, each seeing the prompt and its own earlier tokens only (a tree
    mask).  The cache is left as it was, so it can serve other branches."""
    import torch

    # every candidate's first token read in one gather, so one device sync, not one per candidate
    rows = [b for b, row in enumerate(cands) for _ in row]
    firsts = [c[0] for row in cands for c in row]
    read = iter(first_logp[torch.tensor(rows, device=first_logp.device),
                           torch.tensor(firsts, device=first_logp.device)].tolist())
    scores = [[next(read) for _ in row] for row in cands]
    if all(len(c) == 1 for row in cands for c in row):
        return scores
    if not _plain_layers(cache):  # sliding-window caches: one copy of the row per candidate
        return [_scores_from_copies(lm, cache, b, prefix_mask[b:b + 1], first_logp[b], row)
                for b, row in enumerate(cands)]
    dev, batch = lm.device, prefix_mask.shape[0]
    width = max(sum(len(c) - 1 for c in row) for row in cands)
    ids = torch.full((batch, width), lm.tokenizer.pad_token_id, dtype=torch.long)
    nxt, pos, grp = torch.zeros_like(ids), torch.zeros_like(ids), torch.full_like(ids, -1)
    slots = []  # (row, candidate, first slot) of each candidate with more than one token
    starts = prefix_mask.sum(-1).tolist()  # one sync for the batch
    for b, row in enumerate(cands):
        start, at = int(starts[b]), 0
        for j, c in enumerate(row):
            if n := len(c) - 1:  # slots feed every token but the last and are scored on the next one
                ids[b, at:at + n], nxt[b, at:at + n], grp[b, at:at + n] = torch.tensor(c[:-1]), torch.tensor(c[1:]), j
                pos[b, at:at + n] = start + torch.arange(n)
                slots.append((b, j, at))
                at += n
    ids, nxt, pos, grp = (t.to(dev) for t in (ids, nxt, pos, grp))
    # a slot sees the prompt and its candidate's slots up to itself (the pads, group -1, only pads: never read)
    tree = (grp[:, :, None] == grp[:, None, :]) & torch.ones((width, width), dtype=torch.bool, device=dev).tril()
    see = torch.cat([prefix_mask.to(dev).bool()[:, None, :].expand(-1, width, -1), tree], dim=-1)
    mask = torch.zeros(see.shape, dtype=lm.model.dtype, device=dev).masked_fill_(~see, torch.finfo(lm.model.dtype).min)
    saved = [(layer.keys, layer.values) for layer in cache.layers]
    try:
        with torch.inference_mode(), float32_logits(lm):
            logits = lm.model(input_ids=ids, attention_mask=mask[:, None], position_ids=pos, use_cache=True,
                              **{_cache_kwarg(lm.model): cache}).logits
    finally:  # the forward appended the candidates' keys and values; put the prompt's back
        for layer, (k, v) in zip(cache.layers, saved):
            layer.keys, layer.values = k, v
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, nxt.to(logits.device)[..., None])[..., 0].tolist()
    for b, j, at in slots:
        scores[b][j] += sum(logp[b][at:at + len(cands[b][j]) - 1])
    return scores


def _scores_from_copies(lm: LoadedModel, cache, row: int, prefix_mask, first_logp,
                        cands: list[list[int]]) -> list[float]:
    """`candidate_scores` for one row by copying the cache once per candidate (any cache type)."""
    import torch

    n, width = len(cands), max(len(c) for c in cands)
    ids = torch.full((n, width), lm.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for j, c in enumerate(cands):
        ids[j, :len(c)] = torch.tensor(c)
        mask[j, :len(c)] = 1
    ids, mask = ids.to(lm.device), mask.to(lm.device)
    scores = first_logp[ids[:, 0].to(first_logp.device)]
    cache = copy.deepcopy(cache)
    cache.batch_select_indices(torch.tensor([row] * n, device=lm.device))
    full_mask = torch.cat([prefix_mask.to(lm.device).expand(n, -1), mask], dim=1)
    start = int(prefix_mask.sum())
    pos = (start + torch.arange(width, device=lm.device)).expand(n, -1)
    with torch.inference_mode(), float32_logits(lm), interventions.same_row(row, n):
        logits = lm.model(input_ids=ids[:, :-1], attention_mask=full_mask[:, :-1], position_ids=pos[:, :-1],
                          use_cache=True, **{_cache_kwarg(lm.model): cache}).logits
    ids, mask = ids.to(logits.device), mask.to(logits.device)
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return (scores + (lp * mask[:, 1:]).sum(-1)).tolist()


def _not_parallel(name: str) -> None:
    if interventions.parallel_documents():
        raise ConfigError(f"{name} prefills prompts in a row; with parallel documents on, score through "
                          "litm.runner.score.")


def choice_after(lm: LoadedModel, prompt: Prompt, cache, last_logits, candidates: Sequence[str], gold: int) -> Scored:
    """Forced choice for one prompt already prefilled, unpadded, into `cache`, with `last_logits` [vocab] its
    last token's logits: the candidates scored from the cache (left as it was) under the tie rule."""
    import torch

    _not_parallel("choice_after")
    conts = [_cont_ids(lm, prompt, a) for a in candidates]
    with interventions.scoring([prompt], [0]):
        scores = candidate_scores(lm, cache, torch.ones((1, len(prompt.input_ids)), dtype=torch.long),
                                  torch.log_softmax(last_logits.float(), -1).reshape(1, -1), [conts])[0]
    return choice_result(scores, gold)


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
    prompt's candidates are then scored from its own cache.  The scores of `runner.choice` up to the dtype's
    rounding: the prefix is prefilled in pieces, which rounds differently (float32: about 1e-5 nats; bfloat16 on
    SmolLM2 at 20 short documents: up to 0.79 nats, `benchmarks/shared_prefix.py`); each prompt's latency is its share
    of the whole tree's time."""
    import torch

    _not_parallel("shared_choice")
    t0, seqs = time.perf_counter(), [tuple(p.input_ids) for p in prompts]
    kw = _cache_kwarg(lm.model)
    out: list = [None] * len(prompts)
    prefilled = 0

    def forward(ids, cache, start):
        pos = torch.arange(start, start + len(ids), device=lm.device)[None]
        extra = {kw: cache} if cache is not None else {}
        res = lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), position_ids=pos, use_cache=True,
                       logits_to_keep=1, **extra)
        return returned_cache(res), res.logits[0, -1].float()

    def score(i, cache, last):
        out[i] = choice_after(lm, prompts[i], cache, last, candidates[i], gold[i])

    def walk(children, cache, depth):
        nonlocal prefilled
        for k, (end, ending, grand) in enumerate(children):
            last_child = k == len(children) - 1
            base = cache if last_child or cache is None else copy.deepcopy(cache)
            if ending and grand and interventions.calibrating():
                raise ConfigError("under calibration a prompt's last token is calibrated, so a prompt that is the "
                                  "beginning of another cannot share its cache; score these without shared_prefix.")
            owner = ending[0] if ending else _first(grand)  # a prompt this segment is the beginning of
            seg = seqs[owner][depth:end]
            prefilled += len(seg)
            with interventions.scoring([prompts[owner]], [0]):
                new_cache, last = forward(seg, base, depth)
            for i in ending:
                score(i, new_cache, last)
            if grand:
                walk(grand, new_cache, end)

    def _first(children):
        end, ending, grand = children[0]
        return ending[0] if ending else _first(grand)

    with torch.inference_mode(), float32_logits(lm):
        walk(_tree(seqs, list(range(len(seqs))), 0), None, 0)
    dt = (time.perf_counter() - t0) / max(len(seqs), 1)
    return [replace(s, latency_s=dt) for s in out], TreeStats(len(seqs), sum(len(s) for s in seqs), prefilled)


def generate(lm: LoadedModel, prompts: Sequence[Prompt], max_new_tokens: int = 100,
             batch_size: int = 4) -> list[Scored]:
    """Greedy decoding that stops at a newline, end of turn or `max_new_tokens` (the paper used 100)."""
    import torch

    out: list[Scored | None] = [None] * len(prompts)
    tok = lm.tokenizer
    for batch in _batches([len(p.input_ids) for p in prompts], batch_size):
        t0 = time.perf_counter()
        ids, mask, _ = _left_pad([list(prompts[i].input_ids) for i in batch], tok.pad_token_id, lm.device)
        with torch.inference_mode(), interventions.scoring([prompts[i] for i in batch],
                                                           [ids.shape[1] - len(prompts[i].input_ids) for i in batch]):
            gen = lm.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                    do_sample=False, temperature=None, top_p=None, top_k=None,
                                    stop_strings=["\n"], tokenizer=tok, pad_token_id=tok.pad_token_id)
        synchronize(gen.device)
        dt = (time.perf_counter() - t0) / len(batch)
        for row, i in enumerate(batch):
            text = tok.decode(gen[row, ids.shape[1]:], skip_special_tokens=True)
            out[i] = Scored(prediction=text, latency_s=dt)  # metrics cut at the first newline
    return out  # type: ignore[return-value]
