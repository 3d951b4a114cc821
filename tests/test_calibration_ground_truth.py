"""Calibration against a planted ground truth, on tiny random Llama, Qwen2 and Gemma 3 models.  In the layers
that can be calibrated (those that attend over the whole prompt), a known term per document position is added
to the attention logits of the documents' keys, a different shape in each head (U-shaped, rising, an
inverted U, falling; 3 nats from end to end), through the layer's attention mask, so the SDPA kernel, the
attention profile and calibration's recomputation all see it.  The rotation estimator must recover the
planted shape, and calibration built from its estimate must make a document's share of the documents'
attention at the scored row the same wherever the document sits."""
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from litm import runner
from litm.attention_study import position_bias, slot_bias
from litm.data import generate_fictional_qa
from litm.experiment import SweepConfig
from litm.interventions import calibration, full_attention_layers, intervene, tracing
from litm.models import load_model
from litm.prompts import Variant, render
from litm.types import Document

from conftest import build_tiny_model

N_DOCS, WORDS = 6, 12
AMPLITUDE = 3.0  # nats from the planted term's lowest position to its highest, in every head
SPREAD_KEPT = 0.25  # the most of the uncalibrated spread of a document's log share that calibration may leave


def planted_shapes(n_heads: int) -> np.ndarray:
    """[head, position]: U-shaped, rising, inverted U and falling, in turn; each spans AMPLITUDE nats."""
    x = np.linspace(-1, 1, N_DOCS)
    shapes = [x ** 2, (x + 1) / 2, 1 - x ** 2, (1 - x) / 2]
    return AMPLITUDE * np.stack([shapes[h % 4] for h in range(n_heads)])


def equal_length_examples(tokenizer, n: int, seed: int):
    """Fictional QA examples whose documents are WORDS words that are one token each (with their leading
    space), so every document has the same number of tokens and a rotation moves no document boundary."""
    words = sorted(t[1:] for t in tokenizer.get_vocab() if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 4)
    rng = random.Random(seed)
    out = []
    for e in generate_fictional_qa(n, N_DOCS, seed, sentences_per_doc=1):
        docs = tuple(Document(id=f"{e.id}-d{i}", title=rng.choice(words), text=" ".join(rng.choices(words, k=WORDS)))
                     for i in range(N_DOCS))
        out.append(replace(e, documents=docs))
    return out


def rotations(example):
    return [replace(example, documents=example.documents[r:] + example.documents[:r]) for r in range(N_DOCS)]


class Plant:
    """Adds `shapes[h, k]` to head h's logits on document k's keys in `layers`, for every query: a forward pre-hook
    on each layer's attention module turns its mask into a float mask (causal where it was None) plus the
    plant, which SDPA, the profile's function and calibration all add to the logits.  Batch size 1."""

    def __init__(self, lm, layers, spans, shapes):
        self.per_key = torch.zeros(shapes.shape[0], 4096)
        for k, (s, e) in enumerate(spans):
            self.per_key[:, s:e] = torch.tensor(shapes[:, k], dtype=torch.float32)[:, None]
        self.handles = [lm.model.model.layers[i].self_attn.register_forward_pre_hook(self.hook, with_kwargs=True)
                        for i in layers]

    def hook(self, module, args, kwargs):
        pos = kwargs["position_ids"][0]  # this call's queries' positions; the keys are 0..last
        n_k = int(pos[-1]) + 1
        mask = kwargs.get("attention_mask")
        if mask is None:
            mask = (torch.arange(n_k)[None, :] <= pos[:, None])[None, None]
        mask = mask[..., :n_k]
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        kwargs["attention_mask"] = mask + self.per_key[None, :, None, :n_k]
        return args, kwargs

    def remove(self):
        for h in self.handles:
            h.remove()


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def planted(request, tmp_path_factory):
    lm = load_model(str(build_tiny_model(tmp_path_factory.mktemp(f"gt-{request.param}"), arch=request.param)),
                    device="cpu", dtype="float32", reuse=False)
    held, (test,) = equal_length_examples(lm.tokenizer, 2, seed=7), equal_length_examples(lm.tokenizer, 1, seed=8)
    spans = {render(x, lm.tokenizer, Variant()).manifest.doc_spans for e in (*held, test) for x in rotations(e)}
    assert len(spans) == 1, "precondition: every rotation's documents sit at the same tokens"
    layers = full_attention_layers(lm)
    shapes = planted_shapes(lm.text_config.num_attention_heads)
    plant = Plant(lm, layers, spans.pop(), shapes)
    cfg = SweepConfig(task="qa", num_docs=N_DOCS, positions=(0,), limit=2, progress=False)
    try:
        yield lm, layers, shapes, position_bias(lm, cfg, held, progress=False), test
    finally:
        plant.remove()


def test_the_rotation_estimator_recovers_the_planted_shape(planted):
    _, layers, shapes, bias, _ = planted
    b = slot_bias(bias)
    for layer in layers:
        for h, shape in enumerate(shapes):
            r = np.corrcoef(b[layer, h], shape)[0, 1]
            assert r >= 0.95, f"layer {layer}, head {h}: r = {r:.3f}"


def _log_shares(lm, iv, example):
    """[rotation, layer, head, document (original order)]: log share of the documents' attention at the
    prompt's last token, in each calibrated layer, each document followed through the rotations."""
    out = []
    for r, shown in enumerate(rotations(example)):
        prompt = render(shown, lm.tokenizer, Variant())
        with intervene(lm, iv), tracing() as trace:
            runner.loglik(lm, [prompt], [example.answers[0]])
        after = torch.stack([a[:, 0] for _, _, _, a in trace])  # [layer, head, position]
        np.testing.assert_allclose(after.sum(-1), torch.stack([m[:, 0] for _, _, m, _ in trace]).sum(-1), atol=1e-6)
        share = (after / after.sum(-1, keepdim=True)).numpy()
        out.append(np.log(np.roll(share, r, axis=-1)))  # document d sat at position (d - r) mod n
    return np.stack(out)


def test_calibration_makes_a_documents_share_the_same_at_every_position(planted):
    """The spread over positions (standard deviation) of each document's log share, averaged over documents,
    per layer and head: calibration leaves at most SPREAD_KEPT of the plain model's (about 1.0-1.25 nats).
    What it leaves is the tiny model's own position effects that are not one additive logit term per position,
    and the estimate's noise: 12-17% of the plain spread in Gemma 3, under 0.4% in Llama and Qwen2, whose
    attention is nearly uniform."""
    lm, layers, _, bias, test = planted
    plain = _log_shares(lm, calibration(bias, layers, strength=0.0), test).std(axis=0).mean(-1)  # [layer, head]
    calibrated = _log_shares(lm, calibration(bias, layers), test).std(axis=0).mean(-1)
    assert (plain > 0.5).all()  # the plant moves shares by position
    ratio = calibrated / plain
    assert (ratio <= SPREAD_KEPT).all(), f"calibrated / plain spread per layer and head: {ratio.round(3)}"
