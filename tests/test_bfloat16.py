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

from conftest import build_tiny_model, need_cuda

U = 2.0 ** -9  # bfloat16's unit roundoff
TOLERANCE = {"float32": 1e-4, "bfloat16": 4 * U}  # per score (nats)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-bf16")))


def _lm(model_dir, device, dtype):
    need_cuda(device)
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


@pytest.mark.parametrize("device", DEVICES)
def test_a_bfloat16_tie_with_the_gold_goes_by_the_tie_rule(model_dir, device):
    """Constructed in the output head of a bfloat16 model, with two one-token candidates a and b.  Equal head
    rows give equal scores: whichever is the gold loses (rank 2, the other chosen; runner's tie rule).  Then
    a's row is moved one bfloat16 step in one weight: the model's own bfloat16 logits still tie, but the
    float32 logits forced choice reads (`runner.float32_logits`) put a ahead by the step times the hidden
    state (computed here by hand), so a wins as the gold and beats b when b is the gold."""
    lm = _lm(model_dir, device, "bfloat16")
    _, (prompt,) = _prompts(lm, 1)
    one = {}
    for t in range(lm.model.config.vocab_size):
        text = lm.tokenizer.decode([t]).removeprefix(" ")  # scored after a space
        if text.strip() and runner._cont_ids(lm, prompt, text) == [t]:
            one[t] = text
        if len(one) == 2:
            break
    (a, b), texts = list(one), list(one.values())
    ids = torch.tensor([prompt.input_ids], device=lm.device)
    head = lm.model.lm_head.weight
    with torch.no_grad():
        hidden = lm.model.model(input_ids=ids).last_hidden_state[0, -1]  # bfloat16, after the final norm
        head[a] = head[b]
    for gold, other in ((0, 1), (1, 0)):
        s = runner.choice(lm, [prompt], [texts], [gold])[0]
        assert s.candidate_logliks[0] == s.candidate_logliks[1]
        assert (s.gold_rank, s.correct, s.chosen, s.gold_margin) == (2, False, other, 0.0)

    row = head[b].detach().clone()
    for i in torch.argsort(hidden.float().abs()).tolist():  # the smallest moves first
        up = torch.nextafter(row[i], torch.full_like(row[i], float("inf") if hidden[i] > 0 else float("-inf")))
        with torch.no_grad():
            head[a] = row
            head[a, i] = up
            rounded = lm.model(input_ids=ids).logits[0, -1]  # the model's bfloat16 logits
        step = float(hidden[i].float() * (up.float() - row[i].float()))
        if rounded[a] == rounded[b] and 2e-5 < step < 1e-3:
            break
    else:
        pytest.fail("no weight of the row moves the logit by less than bfloat16 rounds away")
    by_hand = (hidden.float() @ head[[a, b]].float().T).tolist()
    assert by_hand[0] - by_hand[1] == pytest.approx(step, rel=1e-3)
    won = runner.choice(lm, [prompt], [texts], [0])[0]
    assert (won.gold_rank, won.correct, won.chosen) == (1, True, 0)
    assert won.gold_margin == pytest.approx(step, abs=2e-6)
    lost = runner.choice(lm, [prompt], [texts], [1])[0]
    assert (lost.gold_rank, lost.correct, lost.chosen) == (2, False, 0)


LOGIT_SCALE = 20.0  # the tiny models' head multiplied, so their logits are as large as a trained model's (10-30)


def _scaled(directory, dtype, noise: float = 0.0):
    """A tiny model in `dtype` with a trained model's logit scale; `noise` perturbs every weight by that relative
    amount (a planted fault: weights that are not the model's)."""
    lm = load_model(directory, device="cpu", dtype=dtype, reuse=False)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        lm.model.get_output_embeddings().weight.mul_(LOGIT_SCALE)
        for p in lm.model.parameters() if noise else ():
            p.add_((torch.randn(p.shape, generator=gen) * noise).to(p.dtype) * p)
    return lm


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_float32_and_bfloat16_records_agree_within_the_dtype_bound(tmp_path_factory, arch):
    """Point 3 of the CPU bfloat16 default: every record's margin and gold log-likelihood moves between float32
    and bfloat16 by at most `runner.dtype_bound` of its prompt length, and decisions whose float32 margin is
    beyond the bound are equal.  A planted fault, weights moved by 15% (a wrong conversion), breaks it."""
    d = str(build_tiny_model(tmp_path_factory.mktemp(f"dtype-{arch}"), arch=arch))
    exs = generate_fictional_qa(8, 8, seed=4, sentences_per_doc=2)
    f32 = _scaled(d, "float32")
    prompts = [render(gold_at(e, (3 * i) % 8), f32.tokenizer, Variant()) for i, e in enumerate(exs)]
    cands = [runner.candidates(e) for e in exs]

    def scored(lm):
        return runner.choice(lm, prompts, [c[0] for c in cands], [c[1] for c in cands], batch_size=4)

    def bound(x, p, margin=True):
        return runner.dtype_bound(len(p.input_ids), max(abs(x.gold_loglik), abs(x.gold_loglik - x.gold_margin))
                                  if margin else x.gold_loglik)

    def worst(a, b):
        return max(max(abs(x.gold_margin - y.gold_margin) / bound(x, p), abs(x.gold_loglik - y.gold_loglik)
                       / bound(x, p, margin=False)) for x, y, p in zip(a, b, prompts))
    ref, bf16 = scored(f32), scored(_scaled(d, "bfloat16"))
    assert np.ptp([s.gold_margin for s in ref]) > 4 * max(bound(x, p) for x, p in zip(ref, prompts))  # not vacuous
    assert worst(ref, bf16) <= 1
    for x, y, p in zip(ref, bf16, prompts):
        if abs(x.gold_margin) > bound(x, p):
            assert x.gold_rank == y.gold_rank
    assert worst(ref, scored(_scaled(d, "float32", noise=0.15))) > 1
