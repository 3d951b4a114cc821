"""Shared fixtures: a tiny randomly initialised Llama-shaped model with a small trained BPE tokenizer."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))  # also works before `pip install -e .`
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# The CPU default dtype depends on the CPU (bfloat16 where it has the units, litm.models.cpu_dtype); the tests pin
# float32 so their numbers mean the same on every machine, and tests/test_models.py checks the choice by patching.
os.environ.setdefault("LITM_CPU_DTYPE", "float32")
# `make test` runs the tests in parallel workers (pytest-xdist): each worker, and the notebook kernels and
# subprocesses it starts, takes its share of the cores rather than all of them, so they do not fight over them
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                  // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))

CHAT_TEMPLATE = ("{% for m in messages %}<|user|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def benchmark_module(name: str):
    """A script under benchmarks/ imported as a module (they are not a package), for tests of its arithmetic."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def need_cuda(device: str = "cuda") -> None:
    """A gpu-marked test fails, not skips, without CUDA: `pytest -m gpu` asked for them on purpose."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        pytest.fail("a gpu-marked test needs a CUDA GPU (`pytest -m gpu` runs them; the default run leaves them out)")


def build_tiny_model(directory: Path, chat: bool = False, max_positions: int = 2048, seed: int = 0,
                     arch: str = "llama") -> Path:
    """Write a tiny randomly initialised model (grouped-query attention; `arch` llama, qwen2, gemma2 or
    gemma3, the last three with sliding-window layers) and a byte-level BPE tokenizer to `directory`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from litm.data import fictional_qa_records, kv_records

    corpus = []
    for r in fictional_qa_records(20, 5, seed=99):
        corpus.append(r["question"])
        corpus += [c["title"] + " " + c["text"] for c in r["ctxs"]]
    for r in kv_records(10, 5, seed=99):
        corpus += [f'"{k}": "{v}",' for k, v in r["ordered_kv_records"]]
    specials = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    common = dict(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=max_positions, bos_token_id=fast.bos_token_id,
                  eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, tie_word_embeddings=False, **common))
    elif arch == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=3, use_sliding_window=True, sliding_window=24,
                                             max_window_layers=1, **common))
    elif arch == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        model = Gemma3ForCausalLM(Gemma3TextConfig(num_hidden_layers=3, head_dim=16, sliding_window=24,
                                                   layer_types=["sliding_attention", "sliding_attention",
                                                                "full_attention"], query_pre_attn_scalar=24,
                                                   **common))
    elif arch == "gemma2":  # soft-capped attention logits and final logits
        from transformers import Gemma2Config, Gemma2ForCausalLM

        model = Gemma2ForCausalLM(Gemma2Config(num_hidden_layers=2, head_dim=16, sliding_window=24,
                                               query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                                               final_logit_softcapping=30.0, **common))
    else:
        raise ValueError(arch)
    model = model.float().eval()
    model.save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


def sharpened(bias, times: float = 30.0):
    """A `position_bias` table with its log masses, hence its bias, multiplied: a tiny random model's attention is
    nearly uniform (its bias is thousandths of a nat in Llama and Qwen2), too little to move its scores beyond
    float32 rounding."""
    out = bias.assign(mass=bias["mass"] ** times)
    out.attrs = bias.attrs
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir):
    from litm.models import load_model

    return load_model(str(tiny_model_dir), device="cpu", dtype="float32", reuse=False)


def family_case(tmp_path_factory, arch: str):
    """A tiny model of `arch` (float32, CPU), a generated question with its gold third of five and the question's
    prompt, longer than three of Qwen2's and Gemma 3's 24-token sliding windows: the shared case of the
    intervention tests."""
    from litm.data import generate_fictional_qa
    from litm.models import load_model
    from litm.ordering import gold_at
    from litm.prompts import Variant, render

    d = build_tiny_model(tmp_path_factory.mktemp(f"case-{arch}"), arch=arch)
    lm = load_model(str(d), device="cpu", dtype="float32", reuse=False)
    ex = gold_at(generate_fictional_qa(1, 5, seed=4, sentences_per_doc=2)[0], 2)
    prompt = render(ex, lm.tokenizer, Variant())
    assert len(prompt.input_ids) > 3 * 24  # past the sliding windows of Qwen2 and Gemma 3
    return lm, ex, prompt
