"""Channel scaling (after Yu et al. 2024) on tiny random Llama, Qwen2 and Gemma 3 models: scale 1 is the plain
model; forced choice, which reads the prompt's scaled keys from the KV cache, gives the scores of one pass over
prompt and answer; against a planted positional channel (one channel of a layer's input made to fall linearly
with position) the finder names exactly that channel at that layer, and scaling it gives the scored rows the
attention computed here by hand from the captured input with that one channel times s, while every other row
and the values are untouched; bad parameters are one ConfigError each and leave the model as it was."""
import math

import pytest
import torch

from litm import interventions, runner
from litm.data import generate_fictional_qa
from litm.errors import ConfigError
from litm.interventions import (ChannelScaling, SCALE_RANGE, channel_scaling, intervene, positional_channels,
                                scoring)
from litm.models import load_model, run_identity
from litm.ordering import gold_at
from litm.prompts import Variant, render

from conftest import build_tiny_model, family_case

PLANTED_LAYER, PLANTED_CHANNEL, SLOPE = 1, 13, -1e-3  # the hidden state entering layer 1 falls along channel 13


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def arch(request, tmp_path_factory):
    return family_case(tmp_path_factory, request.param)


def _choice(lm, ex, prompt):
    return runner.score(lm, [prompt], [runner.target(ex, "choice")], "choice")[0].candidate_logliks


def _hooks_left(lm) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in lm.model.modules())


@pytest.mark.parametrize("rows", ["scored", "all"])
def test_scale_one_is_the_plain_model(arch, rows):
    lm, ex, prompt = arch
    plain = _choice(lm, ex, prompt)
    plain_ll = runner.score(lm, [prompt], [runner.target(ex, "loglik")], "loglik")[0].gold_loglik
    with intervene(lm, ChannelScaling(7, None, 1.0, rows)):
        neutral = _choice(lm, ex, prompt)
        neutral_ll = runner.score(lm, [prompt], [runner.target(ex, "loglik")], "loglik")[0].gold_loglik
    # 1e-5, as for the other levers at strength 0: the scored rows come from an SDPA call over fewer query rows,
    # which rounds differently (measured: up to 4e-6 on these scores of tens of nats)
    assert max(abs(a - b) for a, b in zip(neutral, plain)) <= 1e-5
    assert abs(neutral_ll - plain_ll) <= 1e-5
    with intervene(lm, ChannelScaling(7, None, 0.0, rows)):  # the same channel removed does change the scores
        assert max(abs(a - b) for a, b in zip(_choice(lm, ex, prompt), plain)) > 1e-4  # ten times the tolerance
    assert _hooks_left(lm) == 0


def test_forced_choice_reads_the_scaled_keys_from_the_cache(arch):
    """Forced choice prefills the prompt (its scaled keys kept in the cache) and scores the candidates from the
    cache (tree mask, or copies for sliding windows): the scores of each prompt-plus-answer run in one pass."""
    lm, ex, prompt = arch
    cands = [d.answer for d in ex.documents]
    plain = runner.choice(lm, [prompt], [cands], [ex.gold_index])[0].candidate_logliks
    with intervene(lm, ChannelScaling(7, None, -1.0)):
        got = runner.choice(lm, [prompt, prompt], [cands, cands[:3]], [ex.gold_index, 0], batch_size=2)
        one_pass = [s.gold_loglik for s in runner.loglik(lm, [prompt] * len(cands), cands)]
    assert max(abs(a - b) for a, b in zip(got[0].candidate_logliks, one_pass)) < 1e-4
    assert max(abs(a - b) for a, b in zip(got[1].candidate_logliks, one_pass[:3])) < 1e-4
    assert max(abs(a - b) for a, b in zip(one_pass, plain)) > 1e-5


def test_greedy_decoding_reads_the_scaled_keys_from_the_cache(arch):
    """Each decoding step (one new token on the cache) picks what one pass over prompt and tokens so far picks."""
    lm, _, prompt = arch
    ids = torch.tensor([list(prompt.input_ids)])
    n = ids.shape[1]
    with torch.inference_mode(), intervene(lm, ChannelScaling(7, None, 0.0)), scoring([prompt], [0]):
        gen = lm.model.generate(input_ids=ids, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                                pad_token_id=lm.tokenizer.pad_token_id, output_logits=True,
                                return_dict_in_generate=True)
        one_pass = lm.model(input_ids=gen.sequences).logits[0, n - 1:-1]
    steps = torch.cat(gen.logits)  # [step, vocab]: the prefill's last row, then one row per decoding step
    assert gen.sequences.shape[1] == n + 5 and steps.shape[0] == 5
    torch.testing.assert_close(steps, one_pass, atol=1e-5, rtol=0)
    assert one_pass.argmax(-1).tolist() == gen.sequences[0, n:].tolist()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny Llama whose layer 0 output (the hidden state entering layer 1) gets SLOPE x position added to
    PLANTED_CHANNEL: a positional channel by construction, at one layer.  Layer 1's query and key projections
    read that channel strongly, so its attention depends on it (a random model's barely depends on anything)."""
    d = build_tiny_model(tmp_path_factory.mktemp("ch-planted"))
    lm = load_model(str(d), device="cpu", dtype="float32", reuse=False)
    attn = lm.model.model.layers[PLANTED_LAYER].self_attn
    with torch.no_grad():
        attn.q_proj.weight[:, PLANTED_CHANNEL] = 0.3
        attn.k_proj.weight[:, PLANTED_CHANNEL] = 0.3

    def plant(module, args, kwargs, output):
        h = output[0] if isinstance(output, tuple) else output
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(h.shape[1])[None]
        h = h.clone()
        h[..., PLANTED_CHANNEL] += SLOPE * pos.to(h.dtype)
        return (h, *output[1:]) if isinstance(output, tuple) else h

    handle = lm.model.model.layers[PLANTED_LAYER - 1].register_forward_hook(plant, with_kwargs=True)
    examples = [gold_at(e, 2) for e in generate_fictional_qa(6, 5, seed=8, sentences_per_doc=2)]
    yield lm, examples, [render(e, lm.tokenizer, Variant()) for e in examples]
    handle.remove()


def test_the_finder_names_the_planted_channel_at_its_layer(planted):
    lm, _, prompts = planted
    table = positional_channels(lm, prompts)
    assert list(table["layer"]) == [0, 1]
    row = table.set_index("layer").loc[PLANTED_LAYER]
    assert row["channel"] == PLANTED_CHANNEL and row["sign"] == -1 and row["correlation"] < -0.99
    assert abs(row["runner_up_correlation"]) < 0.8  # the tiny model's own channels follow position far less
    assert row["positions"] == min(len(p.input_ids) for p in prompts) and row["prompts"] == len(prompts)
    before = table.set_index("layer").loc[PLANTED_LAYER - 1]
    assert abs(before["correlation"]) < 0.8  # nothing planted in the state entering layer 0
    assert _hooks_left(lm) == 1  # the finder's hooks are gone; the planting hook stays
    iv = channel_scaling(table, scale=-0.5, layers=[PLANTED_LAYER])
    assert iv == ChannelScaling((PLANTED_CHANNEL,), (PLANTED_LAYER,), -0.5, "scored")
    assert channel_scaling(table, shared=True).channels in set(table["channel"])
    assert channel_scaling(table).scale == 0.0 and channel_scaling(table).layers == (0, 1)
    only = positional_channels(lm, [list(p.input_ids) for p in prompts], layers=[PLANTED_LAYER])
    assert list(only["layer"]) == [PLANTED_LAYER] and only["channel"].iloc[0] == PLANTED_CHANNEL


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _reference(lm, x, s, n_prompt):
    """Layer PLANTED_LAYER's attention output, by hand, from its captured input `x` [1, token, hidden]: the rows
    from the prompt's last token on read queries and keys formed from x with PLANTED_CHANNEL times s, values
    from x itself; every earlier row is the plain attention."""
    with torch.inference_mode():
        return _by_hand(lm, x, s, n_prompt)


def _by_hand(lm, x, s, n_prompt):
    attn = lm.model.model.layers[PLANTED_LAYER].self_attn
    cfg = lm.model.config
    n, hd = x.shape[1], attn.head_dim
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    pos = torch.arange(n)[None]
    cos, sin = lm.model.model.rotary_emb(x, pos)  # [1, token, head dim]

    def project(h):
        q = attn.q_proj(h).view(1, n, heads, hd).transpose(1, 2)
        k = attn.k_proj(h).view(1, n, kv, hd).transpose(1, 2).repeat_interleave(heads // kv, dim=1)
        c, s_ = cos[:, None], sin[:, None]
        return q * c + _rotate_half(q) * s_, k * c + _rotate_half(k) * s_

    v = attn.v_proj(x).view(1, n, kv, hd).transpose(1, 2).repeat_interleave(heads // kv, dim=1)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    rows = []
    scaled = x * torch.where(torch.arange(x.shape[-1]) == PLANTED_CHANNEL, s, 1.0)
    for h in (x, scaled):
        q, k = project(h)
        w = torch.softmax((q @ k.transpose(-1, -2) * hd ** -0.5).masked_fill(~causal, -math.inf), dim=-1)
        rows.append((w @ v).transpose(1, 2).reshape(1, n, heads * hd))
    out = torch.cat([rows[0][:, :n_prompt - 1], rows[1][:, n_prompt - 1:]], dim=1)
    return attn.o_proj(out)


@pytest.mark.parametrize("s", [0.0, -1.0, 0.5])
def test_scaling_the_planted_channel_scales_it_for_the_scored_rows_only(planted, s):
    lm, examples, prompts = planted
    ex, prompt = examples[0], prompts[0]
    n = len(prompt.input_ids)
    ids = list(prompt.input_ids) + lm.tokenizer(prompt.continuation(ex.answers[0]), add_special_tokens=False)[
        "input_ids"]
    attn = lm.model.model.layers[PLANTED_LAYER].self_attn
    seen = {}

    def capture(name):
        def hook(module, args, kwargs, output=None):
            x = kwargs.get("hidden_states", args[0] if args else None)
            seen.setdefault(name, []).append((x.detach().clone(), None if output is None else
                                              (output[0] if isinstance(output, tuple) else output).detach().clone()))
        return hook

    def run(iv):
        seen.clear()
        handles = [attn.register_forward_hook(capture("attn"), with_kwargs=True)]
        handles += [getattr(attn, p).register_forward_pre_hook(capture(p), with_kwargs=True)
                    for p in ("q_proj", "k_proj", "v_proj")]
        try:
            with torch.inference_mode(), intervene(lm, iv), scoring([prompt], [0]):
                logits = lm.model(input_ids=torch.tensor([ids])).logits
        finally:
            for handle in handles:
                handle.remove()
        return logits, {k: list(v) for k, v in seen.items()}

    plain_logits, plain = run(None)
    logits, got = run(ChannelScaling(PLANTED_CHANNEL, (PLANTED_LAYER,), s))
    (x, plain_out), = plain["attn"]
    (x_iv, out), = got["attn"]
    assert torch.equal(x_iv, x)  # the layer's input (the residual stream) is not scaled
    assert torch.equal(out[:, :n - 1], plain_out[:, :n - 1])  # rows before the prompt's last token: untouched
    assert torch.equal(logits[:, :n - 1], plain_logits[:, :n - 1])
    reference = _reference(lm, x, s, n)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)
    assert (out[:, n - 1:] - plain_out[:, n - 1:]).abs().max() > 1e-3  # the scored rows did move
    # what the projections read: the queries and keys once more, from x with exactly that channel times s
    for proj in ("q_proj", "k_proj"):
        (first, _), (second, _) = got[proj]
        assert torch.equal(first, x)
        assert torch.equal(second[..., PLANTED_CHANNEL], x[..., PLANTED_CHANNEL] * s)
        keep = torch.arange(x.shape[-1]) != PLANTED_CHANNEL
        assert torch.equal(second[..., keep], x[..., keep])
    assert len(got["v_proj"]) == 1  # values come from the plain input only


def test_the_planted_channel_scaled_for_every_row(planted):
    """rows="all" (the paper's "modify all tokens" ablation): every row reads the scaled queries and keys."""
    lm, _, prompts = planted
    prompt = prompts[0]
    n = len(prompt.input_ids)
    attn = lm.model.model.layers[PLANTED_LAYER].self_attn
    seen = []
    handles = [attn.register_forward_pre_hook(lambda m, a, k: seen.append(k["hidden_states"].clone()),
                                              with_kwargs=True),
               attn.register_forward_hook(lambda m, a, o: seen.append(o[0].clone()))]
    try:
        with torch.inference_mode(), intervene(lm, ChannelScaling(PLANTED_CHANNEL, (PLANTED_LAYER,), 0.0, "all")):
            lm.model(input_ids=torch.tensor([list(prompt.input_ids)]))  # no runner needed: no row is singled out
    finally:
        for handle in handles:
            handle.remove()
    x, out = seen
    full = _reference(lm, x, 0.0, 1)  # from row 0 on
    torch.testing.assert_close(out, full, atol=1e-5, rtol=0)
    assert out.shape[1] == n


def test_identity_hooks_and_state_are_restored_even_after_an_error(arch):
    lm, ex, prompt = arch
    iv = ChannelScaling((3,) * lm.text_config.num_hidden_layers, None, -0.5)
    with pytest.raises(RuntimeError, match="inside"):
        with intervene(lm, iv):
            assert run_identity(lm)["intervention"] == iv.identity() == {
                "kind": "channel_scaling", "channels": [3] * lm.text_config.num_hidden_layers, "layers": None,
                "scale": -0.5, "rows": "scored"}
            assert _hooks_left(lm) == lm.text_config.num_hidden_layers
            raise RuntimeError("inside the block")
    assert _hooks_left(lm) == 0 and "intervention" not in lm.identity and not interventions._state
    assert lm.model.config._attn_implementation == "sdpa"
    kinds = [ChannelScaling(3, (1,), 0.0), ChannelScaling(4, (1,), 0.0), ChannelScaling(3, (1,), -1.0),
             ChannelScaling(3, (0,), 0.0), ChannelScaling(3, (1,), 0.0, "all")]
    assert len({str(k.identity()) for k in kinds}) == len(kinds)


def test_runs_the_runner_does_not_announce_are_refused(arch):
    lm, ex, prompt = arch
    other = render(gold_at(ex, 4), lm.tokenizer, Variant())  # shares the instruction and first documents
    targets = [runner.target(ex, "choice"), runner.target(gold_at(ex, 4), "choice")]
    with intervene(lm, ChannelScaling(7, None, 0.0)):
        with pytest.raises(ConfigError, match="shared_prefix"):
            runner.score(lm, [prompt, other], targets, "choice", shared_prefix=True)
        with pytest.raises(ConfigError, match="litm.runner.score"), torch.inference_mode():
            lm.model(input_ids=torch.tensor([list(prompt.input_ids)]))
    assert _hooks_left(lm) == 0 and not interventions._state


def test_bad_channel_scalings_are_one_clear_error_each(arch, monkeypatch):
    lm, ex, prompt = arch
    n_layers, hidden = lm.text_config.num_hidden_layers, lm.text_config.hidden_size
    low, high = SCALE_RANGE
    assert (low, high) == (-1.0, 1.0)
    cases = [
        (ChannelScaling(3, (n_layers,), 0.0), f"outside the model's {n_layers} layers"),
        (ChannelScaling(hidden, (0,), 0.0), rf"channels \[{hidden}\] are outside the hidden state's {hidden} channels"),
        (ChannelScaling(-1, (0,), 0.0), r"channels \[-1\]"),
        (ChannelScaling(3, (0,), 1.5), r"must lie in \[-1, 1\]"),
        (ChannelScaling(3, (0,), -1.01), r"must lie in \[-1, 1\]"),
        (ChannelScaling(3, (0,), float("nan")), r"must lie in \[-1, 1\]"),
        (ChannelScaling((3, 4), (0,), 0.0), "2 channels given for 1 layers"),
        (ChannelScaling(3, (), 0.0), "at least one layer"),
        (ChannelScaling(3, (0,), 0.0, "first"), "rows must be one of"),
        (object(), "unknown intervention object"),
    ]
    for iv, match in cases:
        with pytest.raises(ConfigError, match=match):
            with intervene(lm, iv):
                pytest.fail("the block ran")
        assert _hooks_left(lm) == 0 and not interventions._state and "intervention" not in lm.identity
    with pytest.raises(ConfigError, match=r"must lie in \[-1, 1\]"):
        channel_scaling(positional_channels(lm, [prompt], layers=[0]), scale=2.0)
    with pytest.raises(ConfigError, match="not in the table"):
        channel_scaling(positional_channels(lm, [prompt], layers=[0]), layers=[1])
    with pytest.raises(ConfigError, match=f"outside the model's {n_layers} layers"):
        positional_channels(lm, [prompt], layers=[n_layers])
    with pytest.raises(ConfigError, match="needs prompts"):
        positional_channels(lm, [])
    monkeypatch.setattr(lm.text_config, "model_type", "gpt2")  # a family the interventions do not know
    with pytest.raises(ConfigError, match="not supported for model type 'gpt2'"):
        with intervene(lm, ChannelScaling(3, (0,), 0.0)):
            pytest.fail("the block ran")
    assert lm.model.config._attn_implementation == "sdpa" and _hooks_left(lm) == 0 and not interventions._state
