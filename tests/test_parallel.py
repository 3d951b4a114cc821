"""Parallel documents (litm.parallel): the order of the documents changes nothing, and the mask means what it says.

The invariance test runs on the three tiny families (Llama; Qwen2 and Gemma 3 with sliding-window layers of 24
tokens, shorter than every prompt here, so the window matters), batched (left-padded) and alone, in float32 and
bfloat16, under forced choice, log-likelihood and greedy generation; the same test on the plain model fails.  The
mask is checked against independent computations: with one document the parallel prompt is an ordinary prompt, so
its scores equal the plain model's (sliding windows included); a document's tokens, run alone after the prefix on
the plain model, give the logits they give inside the parallel prompt; and every document reaches the answer.
"""
import random
from dataclasses import replace

import pytest
import torch

from litm import parallel, runner
from litm.data import generate_fictional_qa, generate_kv
from litm.errors import ConfigError
from litm.interventions import ParallelDocuments, intervene
from litm.models import load_model
from litm.prompts import Variant, render

from conftest import build_tiny_model
from test_bfloat16 import TOLERANCE

FAMILIES = ("llama", "qwen2", "gemma3")
PARALLEL = Variant(parallel=True)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    return {arch: str(build_tiny_model(tmp_path_factory.mktemp(f"par-{arch}"), arch=arch, chat=arch == "qwen2"))
            for arch in FAMILIES}


def _lm(family_dirs, arch, dtype="float32", impl="sdpa"):
    return load_model(family_dirs[arch], device="cpu", dtype=dtype, reuse=False, attn_implementation=impl)


def _examples(n=3, docs=4, seed=5):
    exs = generate_fictional_qa(n, docs, seed, sentences_per_doc=2)
    return exs, [replace(e, documents=tuple(random.Random(i).sample(e.documents, docs))) for i, e in enumerate(exs)]


def _scores(lm, exs, scoring, batch_size, on: bool):
    """Each example's scores, keyed so that a permuted example's compare: candidate -> score under forced choice."""
    prompts = [render(e, lm.tokenizer, PARALLEL) for e in exs]
    targets = [runner.target(e, scoring) for e in exs]
    with intervene(lm, ParallelDocuments() if on else None):
        out = runner.score(lm, prompts, targets, scoring, batch_size=batch_size, max_new_tokens=6)
    if scoring == "choice":
        return [dict(zip(t.candidates, s.candidate_logliks)) for t, s in zip(targets, out)], prompts
    if scoring == "loglik":
        return [{"gold": s.gold_loglik} for s in out], prompts
    return [s.prediction for s in out], prompts


def _gap(a, b) -> float:
    return max(abs(x[k] - y[k]) for x, y in zip(a, b) for k in x)


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_permuting_the_documents_changes_no_score_and_no_generation(family_dirs, arch, dtype, batch_size):
    lm = _lm(family_dirs, arch, dtype)
    exs, shuffled = _examples()
    tol = {"float32": 1e-5, "bfloat16": TOLERANCE["bfloat16"]}[dtype]
    for scoring in ("choice", "loglik"):
        a, prompts = _scores(lm, exs, scoring, batch_size, True)
        b, moved = _scores(lm, shuffled, scoring, batch_size, True)
        assert [p.manifest.doc_ids for p in prompts] != [p.manifest.doc_ids for p in moved]  # the order did change
        assert _gap(a, b) <= tol, (scoring, _gap(a, b))
    assert _scores(lm, exs, "generate", batch_size, True)[0] == _scores(lm, shuffled, "generate", batch_size, True)[0]


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_same_permutation_moves_the_plain_models_scores(family_dirs, arch):
    lm = _lm(family_dirs, arch)
    exs, shuffled = _examples()
    for scoring in ("choice", "loglik"):
        gap = _gap(_scores(lm, exs, scoring, 3, False)[0], _scores(lm, shuffled, scoring, 3, False)[0])
        assert gap > 1e-3, (scoring, gap)  # a hundred times the invariance test's tolerance


def test_kv_prompts_are_invariant_too(family_dirs):
    lm = _lm(family_dirs, "gemma3")
    exs = generate_kv(2, 6, seed=1)
    shuffled = [replace(e, documents=tuple(random.Random(i).sample(e.documents, 6))) for i, e in enumerate(exs)]
    a, _ = _scores(lm, exs, "loglik", 2, True)
    b, _ = _scores(lm, shuffled, "loglik", 2, True)
    assert _gap(a, b) <= 1e-5


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_with_one_document_it_is_the_plain_model(family_dirs, arch, impl):
    """One document after the prefix sits where it would anyway: the mask and positions are the plain causal ones,
    sliding windows included (the prompts are longer than the window)."""
    lm = _lm(family_dirs, arch, impl=impl)
    exs = [replace(e, documents=(e.gold,)) for e in generate_fictional_qa(3, 4, seed=2, sentences_per_doc=2)]
    prompts = [render(e, lm.tokenizer, PARALLEL) for e in exs]
    assert min(len(p.input_ids) for p in prompts) > 24
    for scoring in ("loglik", "generate"):
        targets = [runner.target(e, scoring) for e in exs]
        plain = runner.score(lm, prompts, targets, scoring, batch_size=3, max_new_tokens=6)
        with intervene(lm, ParallelDocuments()):
            par = runner.score(lm, prompts, targets, scoring, batch_size=3, max_new_tokens=6)
        if scoring == "loglik":
            assert max(abs(a.gold_loglik - b.gold_loglik) for a, b in zip(plain, par)) < 1e-4
        else:
            assert [a.prediction for a in plain] == [b.prediction for b in par]
    # forced choice: candidates from the example's four documents, scored after the one-document prompt
    cands = [runner.target(e, "choice", ([d.answer for d in full.documents], full.documents.index(full.gold)))
             for e, full in zip(exs, generate_fictional_qa(3, 4, seed=2, sentences_per_doc=2))]
    plain = runner.score(lm, prompts, cands, "choice", batch_size=3)
    with intervene(lm, ParallelDocuments()):
        par = runner.score(lm, prompts, cands, "choice", batch_size=3)
    gap = max(abs(x - y) for a, b in zip(plain, par) for x, y in zip(a.candidate_logliks, b.candidate_logliks))
    assert gap < 1e-4


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_document_sees_the_prefix_and_itself_only(family_dirs, arch):
    """Inside the parallel prompt, each document's logits are those of the prefix and that document alone, run
    on the plain model (its own contiguous positions from where the prefix ends)."""
    lm = _lm(family_dirs, arch)
    (e,), _ = _examples(1, 4)
    p = render(e, lm.tokenizer, PARALLEL)
    ids, meta = parallel._rows(lm, [p.input_ids], [parallel.layout(p)])
    with torch.inference_mode():
        logits = parallel._Pass(lm).forward(ids, meta)[0]
        start = p.manifest.doc_spans[0][0]
        for s, t in p.manifest.doc_spans:
            alone = list(p.input_ids[:start]) + list(p.input_ids[s:t])
            ref = lm.model(input_ids=torch.tensor([alone])).logits[0]
            assert torch.allclose(logits[s:t], ref[start:], atol=1e-4), (arch, s)
            assert torch.allclose(logits[:start], ref[:start], atol=1e-4)


def test_every_document_reaches_the_answer(family_dirs):
    """Changing any one document's text changes the gold's score: the tokens after the documents see them all."""
    lm = _lm(family_dirs, "llama")
    (e,), _ = _examples(1, 4)
    base = _scores(lm, [e], "loglik", 1, True)[0][0]["gold"]
    for k, d in enumerate(e.documents):
        changed = replace(e, documents=tuple(replace(x, text=x.text + " It rained.") if j == k else x
                                             for j, x in enumerate(e.documents)))
        assert abs(_scores(lm, [changed], "loglik", 1, True)[0][0]["gold"] - base) > 1e-4, k


def test_layout_gives_every_document_the_same_positions(family_dirs):
    lm = _lm(family_dirs, "llama")
    (e,), _ = _examples(1, 3)
    p = render(e, lm.tokenizer, PARALLEL)
    (s0, e0), (s1, e1), (s2, e2) = p.manifest.doc_spans
    assert e0 == s1 and e1 == s2  # the blocks tile the documents
    pos, label = parallel.layout(p, after=2)
    n, longest = len(p.input_ids), max(e0 - s0, e1 - s1, e2 - s2)
    assert pos[:s0] == list(range(s0)) and label[:s0] == [parallel.SHARED] * s0
    for k, (s, t) in enumerate(p.manifest.doc_spans):
        assert pos[s:t] == list(range(s0, s0 + t - s)) and label[s:t] == [k] * (t - s)
    assert pos[e2:] == list(range(s0 + longest, s0 + longest + n - e2 + 2))
    assert label[e2:] == [parallel.AFTER] * (n - e2 + 2)


def test_a_parallel_prompt_renders_unnumbered_blocks_that_do_not_depend_on_their_neighbours(family_dirs):
    lm = _lm(family_dirs, "llama")
    (e,), (moved,) = _examples(1, 4)
    a, b = render(e, lm.tokenizer, PARALLEL), render(moved, lm.tokenizer, PARALLEL)
    blocks = lambda p: {d: p.input_ids[s:t] for d, (s, t) in zip(p.manifest.doc_ids, p.manifest.doc_spans)}
    assert blocks(a) == blocks(b)
    assert "[1]" not in a.text and a.manifest.parallel and a.manifest.to_dict()["parallel"] is True
    for d, (s, t) in zip(e.documents, a.manifest.doc_spans):
        assert lm.tokenizer.decode(a.input_ids[s:t]) == f"Document (Title: {d.title}) {d.text}\n"


def test_bad_input_gets_one_clear_error(family_dirs, tmp_path):
    lm = _lm(family_dirs, "llama")
    (e,), _ = _examples(1, 4)
    in_a_row = render(e, lm.tokenizer, Variant())
    with intervene(lm, ParallelDocuments()):
        assert lm.identity["intervention"] == {"kind": "parallel_documents", "window": "positions"}
        with pytest.raises(ConfigError, match="Variant\\(parallel=True\\)"):
            runner.score(lm, [in_a_row], [runner.target(e, "choice")], "choice")
        with pytest.raises(ConfigError, match="runner.score"):
            runner.shared_choice(lm, [render(e, lm.tokenizer, PARALLEL)], [["a", "b"]], [0])
    assert "intervention" not in lm.identity
    gemma2 = load_model(str(build_tiny_model(tmp_path / "g2", arch="gemma2")), device="cpu", dtype="float32",
                        reuse=False)
    with pytest.raises(ConfigError, match="not supported for model type 'gemma2'"):
        with intervene(gemma2, ParallelDocuments()):
            pass
    before = lm.model.config._attn_implementation
    lm.model.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ConfigError, match="attn_implementation='sdpa'"):
            with intervene(lm, ParallelDocuments()):
                pass
    finally:
        lm.model.config._attn_implementation = before
