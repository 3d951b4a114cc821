"""On a CUDA machine only (`pytest -m gpu`; the default run deselects them): the run identity keeps CPU and
GPU numerics apart, and CUDA float32 scores agree with CPU float32."""
import numpy as np
import pytest

from litm import SweepConfig, sweep
from litm.models import load_model, run_identity

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run `pytest -m gpu` there)")


def test_each_device_and_dtype_gets_its_own_folders_and_cuda_float32_agrees_with_the_cpu(cuda, tiny_model_dir,
                                                                                          tmp_path):
    cfg = SweepConfig(task="qa", num_docs=5, positions=(0, 2, 4), limit=16, sentences_per_doc=2,
                      results_dir=str(tmp_path), progress=False)
    runs = {}
    for device, dtype in (("cpu", "float32"), ("cuda", "float32"), ("cuda", "bfloat16")):
        lm = load_model(str(tiny_model_dir), device=device, dtype=dtype, reuse=False)
        assert (run_identity(lm)["device"], run_identity(lm)["dtype"]) == (device, dtype)
        runs[device, dtype] = sweep(cfg, lm).sort_values(["condition", "position", "example_id"],
                                                         key=lambda c: c.astype(str)).reset_index(drop=True)
    folders = [set(df["config_hash"]) for df in runs.values()]
    assert all(len(f) == 5 for f in folders) and len(set.union(*folders)) == 15
    cpu, gpu = runs["cpu", "float32"], runs["cuda", "float32"]
    assert np.abs(cpu["gold_loglik"] - gpu["gold_loglik"]).max() < 1e-4  # float32 kernels differ in sum order
    assert (cpu["gold_rank"] == gpu["gold_rank"]).all()
