"""The scoring paths that agree in float32 agree in bfloat16 too, within tolerances set by its precision; on
this CPU (torch runs bfloat16 here) and, marked `gpu`, on CUDA (`make gpu-check`).

Why these tolerances.  bfloat16 keeps 8 significant bits, so one rounding moves a number by up to
u = 2**-9 (0.2%) of itself.  Two paths that compute the same thing in kernels of another shape (a padded
batch or one row; a tree mask or copies of the cache; a shared prefix or the whole prompt) round
differently, and every layer's output carries that difference on.  The scores are taken from float32
logits of bfloat16 hidden states (`runner.float32_logits`), and a token's log-probability (a logit minus a
log-sum-exp) moves by about the logits' own error: a few u times their size, which is below 1 for these
tiny random models.  A score sums an answer's tokens (up to about 15 here), whose errors mostly cancel; we
allow 4u (7.8e-3) per score, one token's worst case at four roundings of a unit logit.  Measured on this
CPU: at most 5e-4.  A real fault (a wrong position, a token seen across the mask, a cache put back wrong)
moves scores by far more, in float32 (checked to 1e-4) and bfloat16 alike.  Attention weights are at most
1 and rounded once more by eager attention, so the profile (formed in float32) may differ from eager's by
8u of the largest weight; the cold and warm prefill agree within `prefix.AGREEMENT`.
"""
import numpy as np
import pytest
import torch

from litm import prefix, runner
from litm.data import generate_fictional_qa
from litm.models import load_model
from litm.ordering import gold_at
from litm.prompts import Variant, render

from conftest import build_tiny_model

U = 2.0 ** -9  # bfloat16's unit roundoff
TOLERANCE = {"float32": 1e-4, "bfloat16": 4 * U}  # per score (nats)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-bf16")))


def _lm(model_dir, device, dtype):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.fail("a gpu-marked test needs a CUDA GPU (`pytest -m gpu` runs them; the default run leaves them out)")
    return load_model(model_dir, device=device, dtype=dtype, reuse=False)


def _prompts(lm, n=6):
    exs = generate_fictional_qa(n, 5, seed=3, sentences_per_doc=2)
    prompts = [render(gold_at(e, i % 5), lm.tokenizer, Variant()) for i, e in enumerate(exs)]
    assert n < 3 or len({len(p.input_ids) for p in prompts}) > 2  # batches really pad
    return exs, prompts


def _gap(a, b) -> float:
    return float(np.max(np.abs(np.subtract(a, b))))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_and_alone_logliks_agree(model_dir, device, dtype):
    lm = _lm(model_dir, device, dtype)
    exs, prompts = _prompts(lm)
    answers = [e.answers[0] for e in exs]
    batched = runner.loglik(lm, prompts, answers, batch_size=4)
    alone = [runner.loglik(lm, [p], [a], batch_size=1)[0] for p, a in zip(prompts, answers)]
    assert _gap([s.gold_loglik for s in batched], [s.gold_loglik for s in alone]) < TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tree_mask_and_copied_caches_agree(model_dir, device, dtype):
    """The candidates side by side under a tree mask against one copy of the prompt's cache per candidate."""
    lm = _lm(model_dir, device, dtype)
    exs, prompts = _prompts(lm, 3)
    for e, p in zip(exs, prompts):
        cands = [runner._cont_ids(lm, p, d.answer) for d in e.documents]
        assert max(map(len, cands)) > 2
        with torch.inference_mode(), runner.float32_logits(lm):
            out = lm.model(input_ids=torch.tensor([p.input_ids], device=lm.device), use_cache=True)
            first = torch.log_softmax(out.logits[:, -1].float(), -1)
        cache = out["cache"] if "cache" in out else out["past_key_values"]
        mask = torch.ones((1, len(p.input_ids)), dtype=torch.long)
        tree = runner.candidate_scores(lm, cache, mask, first, [cands])[0]
        copies = runner._scores_from_copies(lm, cache, 0, mask, first[0], cands)
        assert _gap(tree, copies) < TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefix_tree_and_plain_choice_agree(model_dir, device, dtype):
    lm = _lm(model_dir, device, dtype)
    exs, prompts = _prompts(lm)
    cands = [[d.answer for d in e.documents] for e in exs]
    gold = [e.gold_index for e in exs]
    plain = runner.choice(lm, prompts, cands, gold, batch_size=4)
    shared, _ = runner.shared_choice(lm, prompts, cands, gold)
    for a, b in zip(plain, shared):
        assert _gap(a.candidate_logliks, b.candidate_logliks) < TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cold_and_warm_prefill_agree(model_dir, device, dtype):
    lm = _lm(model_dir, device, dtype)
    _, prompts = _prompts(lm, 3)
    t = prefix.timed_prefill(lm, [p.input_ids for p in prompts])
    assert t.tolerance == prefix.AGREEMENT[dtype] and t.agrees, t.max_logit_diff  # the tiny model's logits are < 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_profile_and_eager_attention_agree(model_dir, device, dtype):
    """The profile's rows are formed in float32 from the layer's queries and keys; eager attention's weights
    are rounded to the dtype, so each weight (at most 1) may differ by a few u."""
    from litm.attention import profile

    lm = _lm(model_dir, device, dtype)
    _, prompts = _prompts(lm, 1)
    prof = profile(lm, prompts[0], queries="question", per_key=True)
    eager = load_model(model_dir, device=device, dtype=dtype, attn_implementation="eager", reuse=False)
    with torch.inference_mode():
        out = eager.model(input_ids=torch.tensor([prompts[0].input_ids], device=eager.device), output_attentions=True)
    att = torch.stack([a[0] for a in out.attentions]).double()[:, :, list(prof.queries), :].mean(2).cpu().numpy()
    assert _gap(prof.per_key, att) < {"float32": 1e-4, "bfloat16": 8 * U * att.max()}[dtype]
