"""Interventions inside the model, on tiny random Llama, Qwen2 and Gemma 3 models: neutral strength is the
plain model, one ratio on every head is the model run with positions divided by it (computed by another
route: the model's own rotary embedding fed fractional position ids), the KV cache carries the rescaling
into forced choice, and the run identity keeps the records apart."""
import math

import pytest
import torch

from litm import SweepConfig, runner, sweep
from litm.data import generate_fictional_qa
from litm.errors import ConfigError
from litm.interventions import PositionalRescaling, intervene, spaced_ratios
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
