"""Interventions inside the model, on tiny random Llama, Qwen2 and Gemma 3 models: neutral strength is the
plain model, one ratio on every head is the model run with positions divided by it (computed by another
route: the model's own rotary embedding fed fractional position ids), the KV cache carries the rescaling
into forced choice, calibration keeps each row's document mass and gives the documents the shares computed
here from the attention profile and the bias (mass times exp(-bias)), and the run identity keeps the records
apart."""
import dataclasses
import json
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

from conftest import build_tiny_model, family_case, sharpened


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def arch(request, tmp_path_factory):
    return family_case(tmp_path_factory, request.param)


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
    with intervene(lm, calibration(bias, full, strength=0.0)):
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
    the attention profile measures; calibration keeps each head's total and moves it to shares proportional to
    mass x exp(-strength x bias), the bias computed here from the table's masses (log, averaged over rotations,
    centred over positions)."""
    lm, ex, prompt, bias = calibrated
    bias = sharpened(bias)
    layer = full_attention_layers(lm)[-1]
    n = len(prompt.input_ids)
    before = profile(lm, prompt, queries=[n - 1]).documents[layer]  # [head, doc], computed by another route
    t = bias[bias["layer"] == layer]
    logs = t.assign(log=np.log(t["mass"])).groupby(["head", "doc_position"])["log"].mean().unstack().to_numpy()
    b = logs - logs.mean(1, keepdims=True)
    tilted = before * np.exp(-strength * b)
    expected = before.sum(-1, keepdims=True) * tilted / tilted.sum(-1, keepdims=True)
    answer = ex.documents[ex.gold_index].answer
    plain = runner.loglik(lm, [prompt], [answer])[0].gold_loglik
    with intervene(lm, calibration(bias, [layer], strength)), tracing() as trace:
        got = runner.loglik(lm, [prompt], [answer])[0].gold_loglik
    (at, row, mass, after), = trace
    assert at == layer and row == 0
    np.testing.assert_allclose(mass[:, 0].numpy(), before, atol=1e-5, rtol=0)
    np.testing.assert_allclose(after.sum(-1).numpy(), mass.sum(-1).numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(after[:, 0].numpy(), expected, atol=1e-5, rtol=0)
    assert np.abs(after[:, 0].numpy() - before).max() > 1e-3  # the shares did move
    assert abs(got - plain) > 1e-4
    with intervene(lm, calibration(bias, [layer], strength, by_head=False)), tracing() as trace:  # one bias for all
        runner.loglik(lm, [prompt], [answer])
    avg = np.log(t.groupby(["rotation", "doc_position"])["mass"].mean()).groupby("doc_position").mean().to_numpy()
    tilted = before * np.exp(-strength * (avg - avg.mean()))
    np.testing.assert_allclose(trace[0][3][:, 0].numpy(), before.sum(-1, keepdims=True) * tilted /
                               tilted.sum(-1, keepdims=True), atol=1e-5, rtol=0)


def test_calibrated_choice_is_the_same_through_the_prefix_tree(calibrated):
    """The prefix tree prefills shared beginnings once and scores each prompt from its own cache; with the
    documents' spans given per segment, calibration gives the plain batched pass's scores."""
    lm, ex, _, bias = calibrated
    prompts = [render(gold_at(ex, k), lm.tokenizer, Variant()) for k in (0, 2, 4)]
    cands = [[d.answer for d in gold_at(ex, k).documents] for k in (0, 2, 4)]
    gold = [c.index(ex.gold.answer) for c in cands]
    with intervene(lm, calibration(bias, full_attention_layers(lm))):
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
    held = generate_fictional_qa(2, 4, seed=50, sentences_per_doc=2)
    bias = sharpened(position_bias(lm, cfg, held, progress=False))
    plain = sweep(cfg, lm)
    cal = calibration(bias, [1])
    with intervene(lm, cal):
        assert run_identity(lm)["intervention"] == cal.identity()
        got = sweep(cfg, lm)
    assert set(plain["config_hash"]).isdisjoint(got["config_hash"])
    assert not np.allclose(plain["gold_loglik"], got["gold_loglik"])
    source = cal.identity()["bias_source"]
    assert source["estimator"] == "rotation" and source["examples"] == [e.id for e in held]
    assert source["rotations"] == 4 and set(source["doc_tokens"]) == {"mean", "min", "max"}
    others = [calibration(bias, [1], 0.5), calibration(bias, [1], by_head=False),
              calibration(position_bias(lm, cfg, held[:1], progress=False), [1])]
    assert len({json.dumps(c.identity(), sort_keys=True) for c in [cal, *others]}) == 4


def test_bad_calibrations_are_clear_errors(calibrated, tmp_path):
    lm, ex, prompt, bias = calibrated
    cands = [d.answer for d in ex.documents]
    for kw, match in ((dict(layers=[9]), r"layers \[9\] are not in the bias table"),
                      (dict(strength=1.5), r"strength must lie in \[0, 1\]"),
                      (dict(bias_table=bias.drop(columns="head")), "by_head=True")):
        with pytest.raises(ConfigError, match=match):
            calibration(**{"bias_table": bias, "layers": [0], **kw})
    with pytest.raises(ConfigError, match="does not say which model"):
        calibration(pd.DataFrame(bias), [0])
    question = _bias(lm, ex)
    question.attrs["litm"] = {**question.attrs["litm"], "queries": "question"}
    with pytest.raises(ConfigError, match="queries='last'"):
        calibration(question, [0])
    sliding = sorted(set(range(lm.text_config.num_hidden_layers)) - set(full_attention_layers(lm)))
    if sliding:  # Qwen2 and Gemma 3 here: the window reaches no document, and its cache keeps only the window
        with pytest.raises(ConfigError, match="sliding window"):
            calibration(bias, sliding)
        with pytest.raises(ConfigError, match="sliding window"), intervene(lm, dataclasses.replace(
                calibration(bias, full_attention_layers(lm)), layers=tuple(sliding[:1]))):
            pass
    arch = lm.text_config.model_type.removesuffix("_text")
    other = load_model(str(build_tiny_model(tmp_path / "other", seed=1, arch=arch)), device="cpu", dtype="float32",
                       reuse=False)
    with pytest.raises(ConfigError, match="measured on another model"), \
            intervene(other, calibration(bias, full_attention_layers(lm))):
        pass
    with intervene(lm, calibration(bias, full_attention_layers(lm)[:1])):
        fewer = render(gold_at(generate_fictional_qa(1, 4, seed=4, sentences_per_doc=2)[0], 1), lm.tokenizer, Variant())
        with pytest.raises(ConfigError, match="layout"):
            runner.choice(lm, [fewer], [cands[:2]], [0])
        for variant in (Variant(query_aware=True), Variant(doc_format="xml")):
            with pytest.raises(ConfigError, match="layout"):
                runner.loglik(lm, [render(ex, lm.tokenizer, variant)], [cands[0]])
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


def test_position_awareness_is_the_spread_of_the_log_bias_over_positions():
    rows = []
    for layer in range(2):
        for head in range(4):
            for k, v in enumerate([0.0, 1.0, 2.0] if head % 2 else [0.5, 0.5, 0.5]):
                rows.append({"example_id": "e", "rotation": 0, "layer": layer, "head": head, "doc_position": k,
                             "mass": np.exp(v) * 10.0 ** -(layer + 1)})  # the scale of a layer does not count
    got = position_awareness(pd.DataFrame(rows), kv_heads=2)
    sd = np.sqrt(2 / 3)  # log mass 0, 1, 2: centred -1, 0, 1; heads 1 and 3 vary, 0 and 2 are flat
    np.testing.assert_allclose(got, [[sd / 2, sd / 2], [sd / 2, sd / 2]])  # kv head j reads heads 2j, 2j + 1
    with pytest.raises(ConfigError, match="by_head=True"):
        position_awareness(pd.DataFrame(rows).drop(columns="head"), kv_heads=2)
