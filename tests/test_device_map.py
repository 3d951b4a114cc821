"""A model split by a `device_map` scores exactly as the same model in one piece.

On a GPU machine `load_model` spreads a model with `device_map="auto"`, and a model too big for the cards has
layers offloaded to the CPU or the disk: accelerate then keeps those weights on the meta device, and hooks
load them onto the execution device for each call.  This machine has one device, but accelerate splits a
model between the CPU and the disk the same way, so the placement logic is tested here: inputs go to the
input embeddings' execution device (their weight is meta when offloaded), and the float32 head of forced
choice runs inside the hook (an offloaded head's weight is meta outside it).  Every offloaded module runs on
the main device, the same kernels on the same shapes, so the scores agree exactly.  Marked `gpu`, the same
on CUDA, with GPU 0 in place of the CPU and, there, offloading to the CPU as well."""
import numpy as np
import pytest

from litm import runner
from litm.attention import profile
from litm.data import generate_fictional_qa
from litm.models import load_model
from litm.ordering import gold_at
from litm.prompts import Variant, render

from conftest import build_tiny_model, need_cuda

MAIN = "main"  # the main device: the CPU here, GPU 0 on CUDA
COMMON = {"model.norm": MAIN, "model.rotary_emb": MAIN}
MAPS = {
    "layer-and-head-on-disk": {"model.embed_tokens": MAIN, "model.layers.0": MAIN, "model.layers.1": "disk",
                               "lm_head": "disk", **COMMON},
    "embeddings-on-disk": {"model.embed_tokens": "disk", "model.layers.0": "disk", "model.layers.1": MAIN,
                           "lm_head": MAIN, **COMMON},
    "offloaded-to-the-cpu": {"model.embed_tokens": "cpu", "model.layers.0": MAIN, "model.layers.1": "cpu",
                             "lm_head": "cpu", **COMMON},  # on CUDA only: on a CPU machine "cpu" is the main device
}
CASES = [("cpu", "layer-and-head-on-disk"), ("cpu", "embeddings-on-disk")] + [
    pytest.param("cuda", split, marks=pytest.mark.gpu) for split in sorted(MAPS)]


def placed(split: str, device: str) -> dict:
    return {k: ((0 if device == "cuda" else "cpu") if v == MAIN else v) for k, v in MAPS[split].items()}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-split")))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("device, split", CASES)
def test_a_split_model_scores_exactly_as_the_whole_one(model_dir, device, split, dtype):
    need_cuda(device)
    whole = load_model(model_dir, device=device, dtype=dtype, reuse=False)
    device_map = placed(split, device)
    lm = load_model(model_dir, device=device, dtype=dtype, reuse=False, device_map=device_map)
    assert lm.model.hf_device_map == device_map and lm.device == whole.device
    for name in ("model.embed_tokens", "lm_head"):
        offloaded = device_map[name] == "disk" or (device == "cuda" and device_map[name] == "cpu")
        assert (lm.model.get_submodule(name).weight.device.type == "meta") == offloaded

    exs = generate_fictional_qa(4, 5, seed=3, sentences_per_doc=2)
    prompts = [render(gold_at(e, i % 5), lm.tokenizer, Variant()) for i, e in enumerate(exs)]
    answers = [e.answers[0] for e in exs]
    cands, gold = [[d.answer for d in e.documents] for e in exs], [e.gold_index for e in exs]

    def logliks(m):
        return [s.gold_loglik for s in runner.loglik(m, prompts, answers, batch_size=4)]

    def choices(m):
        return [s.candidate_logliks for s in runner.choice(m, prompts, cands, gold, batch_size=4)]

    def tree(m):
        return [s.candidate_logliks for s in runner.shared_choice(m, prompts, cands, gold)[0]]

    for fn in (logliks, choices, tree):
        np.testing.assert_allclose(fn(lm), fn(whole), rtol=0, atol=1e-6, err_msg=fn.__name__)
    assert [s.prediction for s in runner.generate(lm, prompts, 8)] == [
        s.prediction for s in runner.generate(whole, prompts, 8)]
    a, b = (profile(m, prompts[0], queries="question", per_key=True).per_key for m in (lm, whole))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
