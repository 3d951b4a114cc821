"""Runner on a tiny random Llama: batching must not change scores; forced choice ranks correctly."""
import math
import time

import pytest
import torch

from litm import runner
from litm.data import generate_fictional_qa, generate_kv
from litm.ordering import gold_at
from litm.prompts import Variant, render


def _reference_loglik(lm, prompt, answer):
    """Independent computation: one unpadded sequence, full logits, plain log_softmax."""
    cont = lm.tokenizer(prompt.continuation(answer), add_special_tokens=False)["input_ids"]
    ids = torch.tensor([list(prompt.input_ids) + cont])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    n = len(prompt.input_ids)
    return sum(float(logp[n - 1 + j, t]) for j, t in enumerate(cont))


@pytest.fixture(scope="module")
def qa_prompts(tiny_lm):
    exs = generate_fictional_qa(6, 5, seed=3, sentences_per_doc=2)
    # different gold positions give different lengths, so batches need real padding
    prompts = [render(gold_at(e, i % 5), tiny_lm.tokenizer, Variant()) for i, e in enumerate(exs)]
    prompts[1] = render(exs[1], tiny_lm.tokenizer, Variant(condition="oracle"))
    assert len({len(p.input_ids) for p in prompts}) > 2
    return exs, prompts


def test_batched_and_unbatched_logliks_agree(tiny_lm, qa_prompts):
    exs, prompts = qa_prompts
    answers = [e.answers[0] for e in exs]
    batched = runner.loglik(tiny_lm, prompts, answers, batch_size=4)
    single = [runner.loglik(tiny_lm, [p], [a], batch_size=1)[0] for p, a in zip(prompts, answers)]
    for b, s, p, a in zip(batched, single, prompts, answers):
        ref = _reference_loglik(tiny_lm, p, a)
        assert abs(b.gold_loglik - s.gold_loglik) < 1e-4
        assert abs(s.gold_loglik - ref) < 1e-4


def test_choice_scores_equal_logliks_and_rank(tiny_lm, qa_prompts):
    exs, prompts = qa_prompts
    cands = [[d.answer for d in e.documents] for e in exs]
    gold = [e.gold_index for e in exs]
    got = runner.choice(tiny_lm, prompts, cands, gold, batch_size=3)
    for g, p, c, gi in zip(got, prompts, cands, gold):
        refs = [_reference_loglik(tiny_lm, p, a) for a in c]
        assert max(abs(x - y) for x, y in zip(g.candidate_logliks, refs)) < 1e-4
        expected_rank = 1 + sum(1 for j, r in enumerate(refs) if j != gi and r >= refs[gi])
        assert g.gold_rank == expected_rank
        assert math.isclose(g.gold_loglik, refs[gi], abs_tol=1e-4)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_choice_with_sliding_window_caches_equals_logliks(arch, tmp_path):
    """Sliding-window layers take the copy-per-candidate path; the plain Llama cache above the tree mask."""
    from conftest import build_tiny_model
    from litm.models import load_model

    lm = load_model(str(build_tiny_model(tmp_path / arch, arch=arch)), device="cpu", reuse=False)
    exs = generate_fictional_qa(3, 5, seed=5, sentences_per_doc=2)
    prompts = [render(gold_at(e, i), lm.tokenizer, Variant()) for i, e in enumerate(exs)]
    assert min(len(p.input_ids) for p in prompts) > 24  # past the sliding window
    cands = [[d.answer for d in e.documents] for e in exs]
    got = runner.choice(lm, prompts, cands, [e.gold_index for e in exs], batch_size=2)
    assert not runner._plain_layers(_prefilled_cache(lm, prompts[0]))
    for g, p, c in zip(got, prompts, cands):
        refs = [_reference_loglik(lm, p, a) for a in c]
        assert max(abs(x - y) for x, y in zip(g.candidate_logliks, refs)) < 1e-4


def _prefilled_cache(lm, prompt):
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([prompt.input_ids]), use_cache=True)
    return out["cache"] if "cache" in out else out["past_key_values"]


def test_candidate_scoring_leaves_the_cache_as_it_was(tiny_lm, qa_prompts):
    exs, prompts = qa_prompts
    cache = _prefilled_cache(tiny_lm, prompts[0])
    assert runner._plain_layers(cache)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    cands = [tiny_lm.tokenizer(" " + d.answer, add_special_tokens=False)["input_ids"] for d in exs[0].documents]
    assert max(map(len, cands)) > 1
    n = len(prompts[0].input_ids)
    first = torch.zeros((1, tiny_lm.model.config.vocab_size))
    runner.candidate_scores(tiny_lm, cache, torch.ones((1, n), dtype=torch.long), first, [cands])
    for layer, (k, v) in zip(cache.layers, before):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)


def test_choice_on_kv_uses_every_value(tiny_lm):
    ex = gold_at(generate_kv(1, 4, seed=1)[0], 2)
    p = render(ex, tiny_lm.tokenizer, Variant())
    cands = [d.text for d in ex.documents]
    (s,) = runner.choice(tiny_lm, [p], [cands], [2])
    assert len(s.candidate_logliks) == 4
    assert 1 <= s.gold_rank <= 4


def test_generate_is_greedy_and_batch_invariant(tiny_lm, qa_prompts):
    _, prompts = qa_prompts
    batched = runner.generate(tiny_lm, prompts[:4], max_new_tokens=6, batch_size=4)
    single = [runner.generate(tiny_lm, [p], max_new_tokens=6, batch_size=1)[0] for p in prompts[:4]]
    assert [b.prediction for b in batched] == [s.prediction for s in single]
    for p, s in zip(prompts[:4], single):  # the reference: argmax step by step, no cache
        ids = list(p.input_ids)
        new = []
        for _ in range(6):
            with torch.no_grad():
                nxt = int(tiny_lm.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            if nxt == tiny_lm.tokenizer.eos_token_id:
                break
            ids.append(nxt)
            new.append(nxt)
            if "\n" in tiny_lm.tokenizer.decode(new):
                break
        text = tiny_lm.tokenizer.decode(new, skip_special_tokens=True)
        assert s.prediction == text


def test_choice_right_pads_plain_caches_and_scores_rows_without_slots(tiny_lm, qa_prompts, monkeypatch):
    """A plain cache: the batch is right-padded and prefilled without a mask (plain causal attention); a row
    whose candidates are one token each has no slot in the candidates' pass, beside rows that have some."""
    exs, prompts = qa_prompts
    one = [a for a in "abcdefgh" if len(runner._cont_ids(tiny_lm, prompts[0], a)) == 1][:2]
    assert len(one) == 2
    cands = [one, [d.answer for d in exs[1].documents], [d.answer for d in exs[2].documents]]
    calls = []
    forward = tiny_lm.model.forward
    monkeypatch.setattr(tiny_lm.model, "forward", lambda *a, **k: calls.append(k) or forward(*a, **k))
    got = runner.choice(tiny_lm, prompts[:3], cands, [0, 0, 0], batch_size=3)
    prefill = calls[0]
    assert prefill.get("attention_mask") is None and len({len(p.input_ids) for p in prompts[:3]}) == 3
    for g, p, c in zip(got, prompts, cands):
        refs = [_reference_loglik(tiny_lm, p, a) for a in c]
        assert max(abs(x - y) for x, y in zip(g.candidate_logliks, refs)) < 1e-4


def test_shared_choice_gives_each_prompt_its_share_of_the_time(tiny_lm, qa_prompts):
    exs, prompts = qa_prompts
    cands = [[d.answer for d in e.documents] for e in exs]
    gold = [e.gold_index for e in exs]
    t0 = time.perf_counter()
    shared, _ = runner.shared_choice(tiny_lm, prompts, cands, gold)
    elapsed = time.perf_counter() - t0
    assert len({s.latency_s for s in shared}) == 1 and 0 < sum(s.latency_s for s in shared) <= elapsed
    for a, b in zip(runner.choice(tiny_lm, prompts, cands, gold, batch_size=4), shared):
        assert max(abs(x - y) for x, y in zip(a.candidate_logliks, b.candidate_logliks)) < 1e-4


def test_bfloat16_choices_are_scored_from_float32_logits(tiny_model_dir, qa_prompts):
    """A bfloat16 model's forced choice reads float32 logits: every one-token candidate of the vocabulary gets
    the score of the float32 head applied to the bfloat16 model's last hidden state (computed here by hand),
    and scores that bfloat16 logits would tie stay apart."""
    from litm.models import load_model

    lm = load_model(str(tiny_model_dir), device="cpu", dtype="bfloat16", reuse=False)
    _, prompts = qa_prompts
    prompt = prompts[0]
    one = {}
    for t in range(lm.model.config.vocab_size):
        text = lm.tokenizer.decode([t]).removeprefix(" ")  # scored after a space
        if text.strip() and runner._cont_ids(lm, prompt, text) == [t]:
            one[t] = text
    assert len(one) > 100
    (got,) = runner.choice(lm, [prompt], [list(one.values())], [0])
    ids = torch.tensor([prompt.input_ids])
    with torch.no_grad():
        hidden = lm.model.model(input_ids=ids).last_hidden_state[0, -1]  # bfloat16, after the final norm
        by_hand = torch.log_softmax(hidden.float() @ lm.model.lm_head.weight.float().T, -1)[list(one)]
        rounded = torch.log_softmax(lm.model(input_ids=ids).logits[0, -1].float(), -1)[list(one)]  # bf16 logits
    assert lm.model.lm_head.weight.dtype == torch.bfloat16 and "forward" not in lm.model.lm_head.__dict__
    torch.testing.assert_close(torch.tensor(got.candidate_logliks), by_hand, atol=1e-5, rtol=0)
    assert len(set(got.candidate_logliks)) == len(one) > len(set(rounded.tolist()))
