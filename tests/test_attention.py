"""Attention profiles agree with eager attention's full matrices, per layer, head and span."""
import numpy as np
import pytest
import torch

from litm.attention import profile, token_spans
from litm.data import generate_fictional_qa
from litm.errors import ConfigError
from litm.models import load_model
from litm.ordering import gold_at
from litm.prompts import Variant, render

from conftest import build_tiny_model


def eager_reference(source: str, prompt, rows):
    """Independent computation: the full [layer, head, query, key] matrices from eager attention,
    summed over each span's keys and averaged over the chosen query rows."""
    lm = load_model(source, device="cpu", attn_implementation="eager", reuse=False)
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([prompt.input_ids]), output_attentions=True)
    att = torch.stack([a[0] for a in out.attentions]).double()  # [layer, head, query, key]
    att = att[:, :, rows, :].mean(dim=2)  # [layer, head, key]
    names, labels = token_spans(prompt)
    cols = [att[:, :, torch.as_tensor(labels == i)].sum(-1) for i in range(len(names))]
    return torch.stack(cols, -1).numpy(), att.numpy()


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma2", "gemma3"])
def arch_model(request, tmp_path_factory):
    d = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{request.param}"), arch=request.param)
    lm = load_model(str(d), device="cpu", reuse=False)
    ex = gold_at(generate_fictional_qa(1, 5, seed=4, sentences_per_doc=2)[0], 2)
    prompt = render(ex, lm.tokenizer, Variant(query_aware=True))
    assert prompt.manifest.num_tokens > 3 * 24, "long enough for the sliding windows to matter"
    return str(d), lm, prompt


@pytest.mark.parametrize("queries", ["last", "question", slice(10, 60, 7)])
def test_profile_matches_eager_attention(arch_model, queries):
    source, lm, prompt = arch_model
    prof = profile(lm, prompt, queries=queries, per_key=True, chunk=4)
    ref_mass, ref_keys = eager_reference(source, prompt, list(prof.queries))
    assert prof.mass.shape == ref_mass.shape == (lm.model.config.num_hidden_layers, 4, len(prof.span_names))
    np.testing.assert_allclose(prof.mass, ref_mass, atol=1e-4)
    np.testing.assert_allclose(prof.per_key, ref_keys, atol=1e-4)
    np.testing.assert_allclose(prof.mass.sum(-1), 1.0, atol=1e-5)


def test_forward_under_the_profile_gives_eager_logits(arch_model):
    """The layer outputs under the profile's attention function (SDPA, or its own soft-capped branch for Gemma
    2) are eager attention's, for one prompt (no mask: plain causal) and a left-padded batch (a mask)."""
    from litm.attention import _profiling

    source, lm, prompt = arch_model
    eager = load_model(source, device="cpu", attn_implementation="eager", reuse=False)
    ids = list(prompt.input_ids)
    short = ids[: len(ids) // 2]
    batch = torch.tensor([ids, [lm.tokenizer.pad_token_id] * (len(ids) - len(short)) + short])
    mask = (torch.arange(len(ids)) >= len(ids) - torch.tensor([[len(ids)], [len(short)]])).long()
    with torch.no_grad():
        ref_one = eager.model(input_ids=batch[:1]).logits
        ref_two = eager.model(input_ids=batch, attention_mask=mask).logits
        with _profiling(lm):
            one = lm.model(input_ids=batch[:1]).logits
            two = lm.model(input_ids=batch, attention_mask=mask).logits
    torch.testing.assert_close(one, ref_one, atol=1e-5, rtol=1e-5)
    real = mask.bool()
    torch.testing.assert_close(two[real], ref_two[real], atol=1e-5, rtol=1e-5)


def test_profile_holds_one_chunk_of_rows_and_keys_at_a_time(tiny_lm, monkeypatch):
    """The float32 scores it forms are at most heads x chunk rows x chunk keys, however long the prompt; and
    chunked that finely it still gives the profile formed in one block."""
    ex = generate_fictional_qa(1, 5, seed=4, sentences_per_doc=2)[0]
    prompt = render(ex, tiny_lm.tokenizer, Variant())
    whole = profile(tiny_lm, prompt, queries="all", per_key=True, chunk=len(prompt.input_ids))
    shapes, matmul = [], torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: shapes.append((a.shape, b.shape)) or matmul(a, b))
    small = profile(tiny_lm, prompt, queries="all", per_key=True, chunk=16)
    monkeypatch.undo()
    assert len(prompt.input_ids) > 100 and shapes
    assert max(a[-2] * b[-1] for a, b in shapes) <= 2 * 16 * 16  # 2 heads share each key head: 2 x 16 rows
    np.testing.assert_allclose(small.mass, whole.mass, atol=1e-6)
    np.testing.assert_allclose(small.per_key, whole.per_key, atol=1e-6)


def test_spans_partition_the_prompt(tiny_lm):
    ex = gold_at(generate_fictional_qa(1, 4, seed=1, sentences_per_doc=2)[0], 1)
    prompt = render(ex, tiny_lm.tokenizer, Variant())
    names, labels = token_spans(prompt)
    assert names == ("first token", "instruction", "doc 1", "doc 2", "doc 3", "doc 4", "question", "rest")
    m = prompt.manifest
    assert labels[0] == 0 and (labels[1:m.doc_spans[0][0]] == 1).all()
    for i, (s, e) in enumerate(m.doc_spans):
        assert (labels[s:e] == 2 + i).all()
    (qs, qe), = m.question_spans
    assert (labels[qs:qe] == 6).all() and (labels[qe:] == 7).all()
    prof = profile(tiny_lm, prompt)
    assert prof.span_names[-1] == "rest" and prof.documents.shape[-1] == 4
    assert prof.queries == (prompt.manifest.num_tokens - 1,)


def test_profile_leaves_the_model_as_it_was(tiny_lm):
    ex = generate_fictional_qa(1, 3, seed=2, sentences_per_doc=2)[0]
    prompt = render(ex, tiny_lm.tokenizer, Variant())
    before = tiny_lm.model.config._attn_implementation
    ids = torch.tensor([prompt.input_ids])
    with torch.no_grad():
        ref = tiny_lm.model(input_ids=ids).logits
    profile(tiny_lm, prompt)
    with torch.no_grad():
        after = tiny_lm.model(input_ids=ids).logits
    assert tiny_lm.model.config._attn_implementation == before
    assert torch.allclose(ref, after)


def test_bad_selections_are_clear_errors(tiny_lm):
    ex = generate_fictional_qa(1, 3, seed=2, sentences_per_doc=2)[0]
    prompt = render(ex, tiny_lm.tokenizer, Variant())
    with pytest.raises(ConfigError, match="empty"):
        profile(tiny_lm, prompt, queries=[])
    with pytest.raises(ConfigError, match="0.."):
        profile(tiny_lm, prompt, queries=[10_000])
    with pytest.raises(ConfigError, match="unknown query selection"):
        profile(tiny_lm, prompt, queries="middle")
    with pytest.raises(ConfigError, match="manifest"):
        profile(tiny_lm, None)
    from dataclasses import replace

    m = prompt.manifest
    bad = replace(prompt, manifest=replace(m, doc_spans=((m.doc_spans[0][0], m.doc_spans[1][0] + 3),) + m.doc_spans[1:]))
    with pytest.raises(ConfigError, match="overlap"):
        profile(tiny_lm, bad)
    outside = replace(prompt, manifest=replace(m, question_spans=((m.num_tokens - 2, m.num_tokens + 5),)))
    with pytest.raises(ConfigError, match="outside"):
        profile(tiny_lm, outside)


def test_unsupported_architecture_lists_the_supported(tiny_lm, monkeypatch):
    ex = generate_fictional_qa(1, 3, seed=2, sentences_per_doc=2)[0]
    prompt = render(ex, tiny_lm.tokenizer, Variant())
    monkeypatch.setattr(tiny_lm.model.config, "model_type", "mamba")
    with pytest.raises(ConfigError, match="supported: llama"):
        profile(tiny_lm, prompt)


@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_profile_matches_eager_on_the_registry_models(name):
    lm = load_model(name, reuse=False)
    ex = gold_at(generate_fictional_qa(1, 16, seed=9)[0], 8)
    prompt = render(ex, lm.tokenizer, Variant())
    assert prompt.manifest.num_tokens > 1000, "past Gemma 3's 512-token sliding window"
    rows = [prompt.manifest.num_tokens - 1, 0, 300, 777]
    prof = profile(lm, prompt, queries=rows, per_key=True)
    ref_mass, ref_keys = eager_reference(name, prompt, list(prof.queries))
    np.testing.assert_allclose(prof.mass, ref_mass, atol=1e-4)
    np.testing.assert_allclose(prof.per_key, ref_keys, atol=1e-4)


def test_sinks_match_eager_attention(tiny_model_dir, tiny_lm):
    from litm.attention import sinks

    ex = generate_fictional_qa(1, 3, seed=5, sentences_per_doc=2)[0]
    prompt = render(ex, tiny_lm.tokenizer, Variant())
    got = sinks(tiny_lm, prompt, chunk=16)
    n = prompt.manifest.num_tokens
    _, per_key = eager_reference(str(tiny_model_dir), prompt, list(range(n)))  # [layer, head, key], row mean
    np.testing.assert_allclose(got.first, per_key[:, :, 0], atol=1e-4)
    np.testing.assert_allclose(got.first_four, per_key[:, :, :4].sum(-1), atol=1e-4)
    assert got.num_tokens == n
    expected = [(l, h) for l in range(per_key.shape[0]) for h in range(per_key.shape[1]) if per_key[l, h, 0] > 0.5]
    assert got.sink_heads == expected


def test_sink_heads_are_those_over_one_half():
    from litm.attention import Sinks

    s = Sinks(np.array([[0.6, 0.4, 0.5], [0.2, 0.9, 0.51]]), np.ones((2, 3)), 10)
    assert s.sink_heads == [(0, 0), (1, 1), (1, 2)]
