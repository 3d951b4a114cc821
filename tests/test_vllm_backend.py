"""The optional vLLM backend: a clear error without vllm, config checks, and the token-id contract, checked
with a stand-in `vllm` module whose engine decodes greedily with transformers, one prompt at a time."""
import sys
import types

import pytest

from litm.cli import main
from litm.errors import ConfigError, ModelError
from litm.experiment import Sweep, SweepConfig, sweep
from litm.models import run_identity
from litm.study import config_hash
from litm.vllm_backend import load_vllm


def test_missing_vllm_is_one_clear_error(monkeypatch, tiny_model_dir, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ModelError, match=r"pip install vllm"):
        load_vllm(str(tiny_model_dir))
    code = main(["sweep", "--task", "qa", "--model", str(tiny_model_dir), "--backend", "vllm",
                 "--scoring", "generate", "--limit", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install vllm" in err and "Traceback" not in err


def test_vllm_backend_only_generates(capsys):
    with pytest.raises(ConfigError, match="vllm backend generates"):
        SweepConfig(task="qa", backend="vllm", scoring="choice")
    with pytest.raises(ConfigError, match="unknown backend"):
        SweepConfig(task="qa", backend="tgi")
    assert main(["sweep", "--task", "qa", "--backend", "vllm", "--scoring", "loglik", "--limit", "2"]) == 2
    assert "vllm backend generates" in capsys.readouterr().err


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in for vllm: LLM loads the directory with transformers and decodes each prompt alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    calls = {"engines": [], "params": [], "prompts": []}

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw
            calls["params"].append(kw)

    class LLM:
        def __init__(self, **kw):
            calls["engines"].append(kw)
            self.model = AutoModelForCausalLM.from_pretrained(kw["model"]).eval()
            self.tok = AutoTokenizer.from_pretrained(kw["tokenizer"])

        def generate(self, prompts, params, use_tqdm=True):
            outs = []
            for p in prompts:
                calls["prompts"].append(p["prompt_token_ids"])
                ids = torch.tensor([p["prompt_token_ids"]])
                with torch.inference_mode():
                    gen = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                              max_new_tokens=params.kw["max_tokens"],
                                              pad_token_id=self.tok.pad_token_id)
                text = self.tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
                for s in params.kw["stop"]:  # vLLM cuts at a stop string and leaves it out
                    text = text.split(s)[0]
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(text=text)]))
            return outs

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams,
                                                                    __version__="0.0-test"))
    return calls


def test_vllm_sweep_gets_the_same_tokens_and_answers_as_transformers(fake_vllm, tiny_model_dir, tmp_path):
    from litm.models import load_model

    common = dict(task="qa", model=str(tiny_model_dir), num_docs=4, positions=(0, 3), limit=3, scoring="generate",
                  max_new_tokens=6, batch_size=1, progress=False)
    hf = sweep(SweepConfig(**common, results_dir=str(tmp_path / "hf")), load_model(str(tiny_model_dir)))
    vm = load_vllm(str(tiny_model_dir), tensor_parallel_size=2)
    vl = sweep(SweepConfig(**common, results_dir=str(tmp_path / "vl"), backend="vllm", tensor_parallel=2), vm)

    engine = fake_vllm["engines"][0]
    assert engine["tensor_parallel_size"] == 2 and engine["model"] == engine["tokenizer"]
    assert all(p == {"temperature": 0.0, "max_tokens": 6, "stop": ["\n"]} for p in fake_vllm["params"])
    assert vm.identity["backend"] == "vllm" and vm.window == 2048

    key = ["condition", "position", "example_id"]
    hf, vl = hf.sort_values(key).reset_index(drop=True), vl.sort_values(key).reset_index(drop=True)
    assert len(vl) == 3 * 4 and (vl["status"] == "ok").all()
    assert list(vl["prompt_sha256"]) == list(hf["prompt_sha256"])  # same rendered tokens
    assert sorted(map(len, fake_vllm["prompts"])) == sorted(vl["prompt_tokens"])  # token ids, not re-tokenized text
    assert [p.split("\n")[0] for p in hf["prediction"]] == list(vl["prediction"])
    assert list(hf["correct"]) == list(vl["correct"])
    assert set(vl["config_hash"]).isdisjoint(hf["config_hash"])  # the backends' results never mix


def test_the_backend_is_part_of_the_run_identity(fake_vllm, tiny_model_dir, tiny_lm):
    vm = load_vllm(str(tiny_model_dir), tensor_parallel_size=2)
    hf_id, vl_id = run_identity(tiny_lm), run_identity(vm)
    assert (hf_id["backend"], vl_id["backend"], vl_id["tensor_parallel"]) == ("transformers", "vllm", 2)
    assert hf_id["weights"] == vl_id["weights"]  # the same directory, known by its content either way
    cfg = SweepConfig(task="qa", scoring="generate")
    cond = {"condition": "documents", "position": 0}
    assert config_hash(Sweep(cfg).run_config(hf_id, cond)) != config_hash(Sweep(cfg).run_config(vl_id, cond))
    # the config's backend only says what to load; the model's identity names the folder
    vl_cfg = SweepConfig(task="qa", scoring="generate", backend="vllm", tensor_parallel=4)
    assert Sweep(vl_cfg).run_config(vl_id, cond) == Sweep(cfg).run_config(vl_id, cond)
