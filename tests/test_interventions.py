"""Interventions inside the model, on tiny random Llama, Qwen2 and Gemma 3 models: neutral strength is the
plain model, one ratio on every head is the model run with positions divided by it (computed by another
route: the model's own rotary embedding fed fractional position ids), the KV cache carries the rescaling
into forced choice, calibration keeps each row's document mass and gives the documents the shares computed
here from the attention profile and the bias, and the run identity keeps the records apart."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from litm import SweepConfig, runner, sweep
from litm.data import generate_fictional_qa
from litm.errors import ConfigError
from litm.attention import profile
from litm.attention_study import position_awareness, position_bias
from litm.interventions import (PositionalRescaling, calibration, full_attention_layers, intervene,
                                ratios_from_awareness, spaced_ratios, tracing)
from litm.models import load_model, run_identity
from litm.ordering import gold_at
from litm.prompts import Variant, render

from conftest import build_tiny_model


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def arch(request, tmp_path_factory):
    d = build_tiny_model(tmp_path_factory.mktemp(f"iv-{request.param}"), arch=request.param)
    lm = load_model(str(d), device="cpu", dtype="float32", reuse=False)
    ex = gold_at(generate_fictional_qa(1, 5, seed=4, sentences_per_doc=2)[0], 2)
    prompt = render(ex, lm.tokenizer, Variant())
    assert len(prompt.input_ids) > 3 * 24  # past the sliding windows of Qwen2 and Gemma 3
    return lm, ex, prompt


def _logits(lm, ids, positions=None):
    with torch.inference_mode():
        return lm.model(input_ids=torch.tensor([ids]), position_ids=positions).logits[0]


def _kv(lm) -> int:
    return lm.model.config.num_key_value_heads


def test_ratios_of_one_are_the_plain_model(arch):
    lm, ex, prompt = arch
    plain = _logits(lm, prompt.input_ids)
    cands = [[d.answer for d in ex.documents]]
    before = runner.choice(lm, [prompt], cands, [ex.gold_index])[0]
    with intervene(lm, PositionalRescaling((1.0,) * _kv(lm))):
        neutral = _logits(lm, prompt.input_ids)
        after = runner.choice(lm, [prompt], cands, [ex.gold_index])[0]
    torch.testing.assert_close(neutral, plain, atol=1e-5, rtol=0)
    assert max(abs(a - b) for a, b in zip(after.candidate_logliks, before.candidate_logliks)) < 1e-5


@pytest.mark.parametrize("ratio", [1.5, 2.0])
def test_one_ratio_on_every_head_is_positions_divided_by_it(arch, ratio):
    lm, _, prompt = arch
    n = len(prompt.input_ids)
    reference = _logits(lm, prompt.input_ids, torch.arange(n, dtype=torch.float32)[None] / ratio)
    with intervene(lm, PositionalRescaling((ratio,) * _kv(lm))):
        got = _logits(lm, prompt.input_ids)
    assert (got - _logits(lm, prompt.input_ids)).abs().max() > 1e-3  # the ratio changes the model
    torch.testing.assert_close(got, reference, atol=1e-4, rtol=0)


def test_forced_choice_under_rescaling_reads_the_rescaled_cache(arch):
    """Forced choice prefills the prompt and scores the candidates from its cache (tree mask, or copies for
    sliding windows): the same scores as each prompt-plus-answer sequence run with positions / r."""
    lm, ex, prompt = arch
    ratio = 2.0
    cands = [d.answer for d in ex.documents]
    with intervene(lm, PositionalRescaling((ratio,) * _kv(lm))):
        got = runner.choice(lm, [prompt, prompt], [cands, cands[:3]], [ex.gold_index, 0], batch_size=2)
    for scored, answers in zip(got, (cands, cands[:3])):
        for answer, score in zip(answers, scored.candidate_logliks):
            cont = runner._cont_ids(lm, prompt, answer)
            ids = list(prompt.input_ids) + cont
            logp = torch.log_softmax(_logits(lm, ids, torch.arange(len(ids), dtype=torch.float32)[None] / ratio)
                                     .double(), -1)
            n = len(prompt.input_ids)
            assert math.isclose(score, sum(float(logp[n - 1 + j, t]) for j, t in enumerate(cont)), abs_tol=1e-4)


def test_layers_outside_the_range_are_untouched(tmp_path):
    lm = load_model(str(build_tiny_model(tmp_path / "m")), device="cpu", dtype="float32", reuse=False)
    ex = gold_at(generate_fictional_qa(1, 4, seed=4, sentences_per_doc=2)[0], 1)
    ids = render(ex, lm.tokenizer, Variant()).input_ids
    with intervene(lm, PositionalRescaling((2.0, 2.0), layers=(1,))):
        last_only = _logits(lm, ids)
    with intervene(lm, PositionalRescaling((2.0, 2.0))):
        both = _logits(lm, ids)
    with intervene(lm, PositionalRescaling((1.0, 2.0))):
        mixed = _logits(lm, ids)
    plain = _logits(lm, ids)
    for a, b in ((last_only, plain), (last_only, both), (mixed, plain), (mixed, both)):
        assert (a - b).abs().max() > 1e-3


def test_the_intervention_joins_the_run_identity(tmp_path):
    lm = load_model(str(build_tiny_model(tmp_path / "m")), device="cpu", dtype="float32", reuse=False)
    cfg = SweepConfig(task="qa", num_docs=4, positions=(0, 3), limit=2, sentences_per_doc=2, closedbook=False,
                      oracle=False, results_dir=str(tmp_path / "res"), progress=False)
    plain = sweep(cfg, lm)
    with intervene(lm, None):  # no intervention: the plain model, under the plain identity
        assert "intervention" not in run_identity(lm) and lm.model.config._attn_implementation == "sdpa"
    iv = PositionalRescaling((1.5, 1.5))
    with intervene(lm, iv):
        assert run_identity(lm)["intervention"] == iv.identity()
        rescaled = sweep(cfg, lm)
    assert "intervention" not in run_identity(lm) and "intervention" not in lm.identity
    assert lm.model.config._attn_implementation == "sdpa"
    assert set(plain["config_hash"]).isdisjoint(rescaled["config_hash"])
    assert len(list((tmp_path / "res").glob("*/records.jsonl"))) == 4


def test_bad_interventions_are_clear_errors(tmp_path, monkeypatch):
    lm = load_model(str(build_tiny_model(tmp_path / "m")), device="cpu", dtype="float32", reuse=False)
    for iv, match in ((PositionalRescaling((1.0, 0.0)), "above 0"), (PositionalRescaling((1.0, -2.0)), "above 0"),
                      (PositionalRescaling((1.0,)), "2 key-value heads"),
                      (PositionalRescaling((1.0, 1.0), layers=(2,)), "outside the model's 2 layers")):
        with pytest.raises(ConfigError, match=match), intervene(lm, iv):
            pass
    with intervene(lm, PositionalRescaling((1.0, 1.0))), pytest.raises(ConfigError, match="already active"), \
            intervene(lm, PositionalRescaling((1.0, 1.0))):
        pass
    monkeypatch.setattr(lm.model.config, "model_type", "gpt2")
    with pytest.raises(ConfigError, match="not supported for model type 'gpt2'"), \
            intervene(lm, PositionalRescaling((1.0, 1.0))):
        pass
    assert lm.model.config._attn_implementation == "sdpa"


def test_spaced_ratios_follow_the_order():
    assert spaced_ratios([2, 0, 1]) == pytest.approx((1.5, 1.8, 1.2))
    assert spaced_ratios([0], 1.2, 1.8) == (1.2,)
    with pytest.raises(ConfigError, match="each head"):
        spaced_ratios([0, 0, 1])
    with pytest.raises(ConfigError, match="0 < low <= high"):
        spaced_ratios([0, 1], 0.0, 1.0)


def _bias(lm, ex, **kw):
    cfg = SweepConfig(task="qa", num_docs=len(ex.documents), positions=(0,), limit=1, sentences_per_doc=2,
                      progress=False, **kw)
    return position_bias(lm, cfg, [ex], progress=False)


@pytest.fixture(scope="module")
def calibrated(arch):
    lm, ex, _ = arch
    return (*arch, _bias(lm, ex))


def test_calibration_at_strength_zero_is_the_plain_model(calibrated):
    lm, ex, prompt, bias = calibrated
    full = full_attention_layers(lm)
    cands = [d.answer for d in ex.documents]
    answer = ex.documents[ex.gold_index].answer
    plain = (runner.loglik(lm, [prompt, prompt], [answer, cands[0]], batch_size=2),
             runner.choice(lm, [prompt], [cands], [ex.gold_index])[0].candidate_logliks,
             runner.generate(lm, [prompt], max_new_tokens=4)[0].prediction)
    with intervene(lm, calibration(bias, full, temperature=1e-3, strength=0.0)):
        with tracing() as trace:
            neutral = (runner.loglik(lm, [prompt, prompt], [answer, cands[0]], batch_size=2),
                       runner.choice(lm, [prompt], [cands], [ex.gold_index])[0].candidate_logliks)
        assert {0, 1} <= {row for _, row, _, _ in trace} and {layer for layer, *_ in trace} == set(full)
        with tracing() as trace:
            neutral += (runner.generate(lm, [prompt], max_new_tokens=4)[0].prediction,)
        assert len(trace) >= len(full) and len(trace) % len(full) == 0  # the prompt's pass and each decoding step
        strong = runner.choice(lm, [prompt], [cands], [ex.gold_index])[0].candidate_logliks
    for a, b in zip(neutral[0], plain[0]):
        assert abs(a.gold_loglik - b.gold_loglik) < 1e-5
    assert max(abs(a - b) for a, b in zip(neutral[1], plain[1])) < 1e-5
    assert neutral[2] == plain[2]
    assert max(abs(a - b) for a, b in zip(strong, plain[1])) < 1e-5  # strength 0 again: nothing carried over


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_calibration_keeps_document_mass_and_gives_the_calibrated_shares(calibrated, strength):
    """In one layer (the last full-attention one: a sliding window of 24 sees no document from the last token),
    calibrated alone so its input is the plain model's, the last prompt token's document mass per head is what
    the attention profile measures; calibration keeps its total and moves it to softmax((mass per token,
    heads averaged, - bias) / temperature), computed here from the profile and the bias table."""
    lm, ex, prompt, bias = calibrated
    layer, temperature = full_attention_layers(lm)[-1], 2e-3
    n = len(prompt.input_ids)
    before = profile(lm, prompt, queries=[n - 1]).documents[layer]  # [head, doc], computed by another route
    tokens = np.array([e - s for s, e in prompt.manifest.doc_spans])
    b = bias[bias["layer"] == layer].groupby("doc_position")["per_token"].mean().to_numpy()
    rel = (before / tokens).mean(0) - b
    share = np.exp((rel - rel.max()) / temperature)
    share /= share.sum()
    expected = (1 - strength) * before + strength * before.sum(-1, keepdims=True) * share
    answer = ex.documents[ex.gold_index].answer
    plain = runner.loglik(lm, [prompt], [answer])[0].gold_loglik
    with intervene(lm, calibration(bias, [layer], temperature, strength)), tracing() as trace:
        got = runner.loglik(lm, [prompt], [answer])[0].gold_loglik
    (at, row, mass, after), = trace
    assert at == layer and row == 0
    np.testing.assert_allclose(mass[:, 0].numpy(), before, atol=1e-5, rtol=0)
    np.testing.assert_allclose(after.sum(-1).numpy(), mass.sum(-1).numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(after[:, 0].numpy(), expected, atol=1e-5, rtol=0)
    assert np.abs(after[:, 0].numpy() - before).max() > 1e-3  # the shares did move
    assert abs(got - plain) > 1e-4


def test_calibrated_choice_is_the_same_through_the_prefix_tree(calibrated):
    """The prefix tree prefills shared beginnings once and scores each prompt from its own cache; with the
    documents' spans given per segment, calibration gives the plain batched pass's scores."""
    lm, ex, _, bias = calibrated
    prompts = [render(gold_at(ex, k), lm.tokenizer, Variant()) for k in (0, 2, 4)]
    cands = [[d.answer for d in gold_at(ex, k).documents] for k in (0, 2, 4)]
    gold = [c.index(ex.gold.answer) for c in cands]
    with intervene(lm, calibration(bias, full_attention_layers(lm), 2e-3)):
        plain = runner.choice(lm, prompts, cands, gold, batch_size=3)
        tree, stats = runner.shared_choice(lm, prompts, cands, gold)
        assert stats.prefill_tokens < stats.total_tokens
        with pytest.raises(ConfigError, match="beginning of another"):
            runner.shared_choice(lm, [prompts[0], replace_ids(prompts[0])], [cands[0]] * 2, [gold[0]] * 2)
    for a, b in zip(plain, tree):
        assert max(abs(x - y) for x, y in zip(a.candidate_logliks, b.candidate_logliks)) < 1e-4


def replace_ids(prompt):
    """The prompt with one more token at its end: the original is the beginning of it."""
    from dataclasses import replace

    return replace(prompt, input_ids=prompt.input_ids + prompt.input_ids[-1:])


def test_calibration_runs_in_a_sweep_under_its_own_identity(tmp_path):
    lm = load_model(str(build_tiny_model(tmp_path / "m")), device="cpu", dtype="float32", reuse=False)
    cfg = SweepConfig(task="qa", num_docs=4, positions=(0, 3), limit=2, sentences_per_doc=2, closedbook=False,
                      oracle=False, results_dir=str(tmp_path / "res"), progress=False)
    bias = position_bias(lm, cfg, generate_fictional_qa(2, 4, seed=50, sentences_per_doc=2), progress=False)
    plain = sweep(cfg, lm)
    cal = calibration(bias, [1], temperature=1e-3)
    with intervene(lm, cal):
        assert run_identity(lm)["intervention"] == cal.identity()
        got = sweep(cfg, lm)
    assert set(plain["config_hash"]).isdisjoint(got["config_hash"])
    assert not np.allclose(plain["gold_loglik"], got["gold_loglik"])
    assert calibration(bias, [1], 2e-3).identity() != cal.identity()


def test_bad_calibrations_are_clear_errors(calibrated, tmp_path):
    lm, ex, prompt, bias = calibrated
    cands = [d.answer for d in ex.documents]
    for kw, match in ((dict(layers=[9]), r"layers \[9\] are not in the bias table"),
                      (dict(temperature=0.0), "temperature must be above 0"),
                      (dict(strength=1.5), r"strength must lie in \[0, 1\]")):
        with pytest.raises(ConfigError, match=match):
            calibration(bias, **{"layers": [0], "temperature": 1e-3, **kw})
    with pytest.raises(ConfigError, match="does not say which model"):
        calibration(pd.DataFrame(bias), [0], 1e-3)
    sliding = sorted(set(range(lm.text_config.num_hidden_layers)) - set(full_attention_layers(lm)))
    if sliding:  # Qwen2 and Gemma 3 here: a sliding-window cache keeps only its window of keys
        with pytest.raises(ConfigError, match="sliding window"), intervene(lm, calibration(bias, sliding, 1e-3)):
            pass
    other = load_model(str(build_tiny_model(tmp_path / "other", seed=1)), device="cpu", dtype="float32", reuse=False)
    with pytest.raises(ConfigError, match="measured on another model"), intervene(other, calibration(bias, [0], 1e-3)):
        pass
    with intervene(lm, calibration(bias, full_attention_layers(lm)[:1], 1e-3)):
        fewer = render(gold_at(generate_fictional_qa(1, 4, seed=4, sentences_per_doc=2)[0], 1), lm.tokenizer, Variant())
        with pytest.raises(ConfigError, match="layout"):
            runner.choice(lm, [fewer], [cands[:2]], [0])
        aware = render(ex, lm.tokenizer, Variant(query_aware=True))
        with pytest.raises(ConfigError, match="layout"):
            runner.loglik(lm, [aware], [cands[0]])
        with pytest.raises(ConfigError, match="through the runner"), torch.inference_mode():
            lm.model(input_ids=torch.tensor([prompt.input_ids]))
    assert lm.model.config._attn_implementation == "sdpa"


def test_per_layer_ratios_from_awareness(arch):
    """Ratios assigned per layer: the most position-aware head of a layer gets 1.2, the least 1.8; a row of ones
    leaves its layer as it is, so per-layer rows equal the `layers` form."""
    lm, _, prompt = arch
    n_layers, n_kv = lm.text_config.num_hidden_layers, _kv(lm)
    aware = np.arange(n_layers * n_kv, dtype=float).reshape(n_layers, n_kv)
    got = ratios_from_awareness(aware)
    assert got[0] == pytest.approx(tuple(np.linspace(1.8, 1.2, n_kv)))
    rows = tuple((2.0,) * n_kv if i == n_layers - 1 else (1.0,) * n_kv for i in range(n_layers))
    with intervene(lm, PositionalRescaling(rows)):
        per_layer = _logits(lm, prompt.input_ids)
    with intervene(lm, PositionalRescaling((2.0,) * n_kv, layers=(n_layers - 1,))):
        one_layer = _logits(lm, prompt.input_ids)
    torch.testing.assert_close(per_layer, one_layer, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="rows of ratios"), intervene(lm, PositionalRescaling(rows[:-1])):
        pass


def test_position_awareness_is_the_spread_of_the_bias_over_positions():
    rows = []
    for layer in range(2):
        for head in range(4):
            for k, v in enumerate([1.0, 2.0, 3.0] if head % 2 else [2.0, 2.0, 2.0]):
                rows.append({"layer": layer, "head": head, "doc_position": k, "per_token": v * (layer + 1)})
    got = position_awareness(pd.DataFrame(rows), kv_heads=2)
    cv = np.std([1.0, 2.0, 3.0]) / 2.0  # heads 1 and 3 vary; 0 and 2 are flat; kv head j reads heads 2j, 2j+1
    np.testing.assert_allclose(got, [[cv / 2, cv / 2], [cv / 2, cv / 2]])
    with pytest.raises(ConfigError, match="by_head=True"):
        position_awareness(pd.DataFrame(rows).drop(columns="head"), kv_heads=2)
