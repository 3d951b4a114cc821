"""benchmarks/gpu_check.py runs on a CPU-only machine (with --device cpu), its arithmetic is right, and
`make gpu-check` without CUDA says so in one line and runs nothing."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import benchmark_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_check():
    return benchmark_module("gpu_check")


def test_flops_of_a_prefill_counted_by_hand(gpu_check):
    lm = gpu_check.build("tiny", "cpu", __import__("torch").float32)
    # per layer: q 64x64, k and v 64x32 (2 of 4 heads' width), o 64x64, gate/up/down 3 x 64x128, two norms
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    non_embedding = 2 * per_layer + 64  # + the final norm
    params = sum(p.numel() for p in lm.model.parameters())
    assert params - 2 * 512 * 64 == non_embedding  # untied input and output embeddings of 512 x 64
    # 2 FLOPs per parameter per token, plus QK^T and AV over the causal half: 2 x T^2 x (4 heads x 16) per layer
    assert gpu_check.flops_per_prefill(lm.model.config, non_embedding, 100) == 2 * non_embedding * 100 + 2 * 2 * 100 ** 2 * 64


def test_peak_lookup(gpu_check):
    assert gpu_check.peak_tflops("NVIDIA H200") == 989.0
    assert gpu_check.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_check.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_check.peak_tflops("NVIDIA L40S") == 362.0 and gpu_check.peak_tflops("NVIDIA L4") == 121.0
    assert gpu_check.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert gpu_check.peak_tflops("Some Future Card") is None


def test_cpu_fallback_prints_all_three_tables(gpu_check, tmp_path, capsys):
    out = tmp_path / "gc.json"
    junit = tmp_path / "tests.xml"  # what pytest --junitxml writes: one pass, one failure, one skip
    junit.write_text('<testsuites><testsuite name="pytest"><testcase classname="tests.test_a" name="test_ok" '
                     'time="1.5"/><testcase classname="tests.test_a" name="test_bad" time="0.2"><failure '
                     'message="x"/></testcase><testcase classname="tests.test_b" name="test_gpu" time="0">'
                     '<skipped message="y"/></testcase></testsuite></testsuites>')
    md = tmp_path / "gc.md"
    assert gpu_check.main(["--device", "cpu", "--shape", "tiny", "--lengths", "96,160", "--score-length", "48",
                           "--batches", "1,3", "--repeats", "1", "--kv", "64,5,4", "--tests", str(junit),
                           "--json", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    for heading in ("1. prefill", "2. batched log-likelihood scoring", "3. attention profile", "4. forced choice"):
        assert heading in text
    res = json.loads(out.read_text())
    assert (res["tests"]["passed"], res["tests"]["failed"], res["tests"]["skipped"]) == (1, 1, 1)
    assert res["tests"]["cases"][1] == {"test": "tests.test_a::test_bad", "outcome": "failed", "seconds": 0.2}
    fc = res["forced_choice"]
    assert (fc["prompt_tokens"], fc["candidates"], fc["slots"]) == (64, 5, 15) and fc["candidates_s"] > 0
    report = md.read_text()
    assert "1 passed, 1 failed, 1 skipped" in report and "| `tests.test_a::test_bad` | failed | 0.2 |" in report
    assert "| 160 |" in report and "5 candidates of 4 tokens (15 slots)" in report
    assert [r["tokens"] for r in res["prefill"]] == [96, 160]
    assert all(r["tokens_per_s"] > 0 and r["fraction_of_peak"] is None for r in res["prefill"])  # no CPU peak
    assert [r["batch"] for r in res["scoring"]] == [1, 3] and res["scoring"][0]["ratio"] == 1.0
    assert [r["tokens"] for r in res["profile"]] == [96, 160] and all(r["time_ratio"] > 0 for r in res["profile"])


def test_cuda_asked_for_without_one_is_a_clear_error(gpu_check, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert gpu_check.main(["--run-tests", "--json", "x.json"]) == gpu_check.NO_CUDA == 3  # no --device: the check
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "sees no CUDA device, so nothing was run" in err


def test_make_gpu_check_without_cuda_stops_in_one_line_and_writes_nothing(tmp_path):
    """The Makefile's target as a user runs it, in a copy of the repository's parts it uses; CUDA hidden (this
    machine has none anyway)."""
    shutil.copy(ROOT / "Makefile", tmp_path)
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks")
    (tmp_path / "lib").symlink_to(ROOT / "lib")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = subprocess.run(["make", "--no-print-directory", "gpu-check", f"PYTHON={sys.executable}"], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=120,
                         check=False)
    assert res.returncode != 0 and res.stdout == ""
    ours, make = res.stderr.splitlines()  # our line, and make's report of the exit code
    assert ours.startswith("gpu-check: torch") and "sees no CUDA device" in ours and make.endswith("Error 3")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no report, no build/


def test_run_tests_reports_each_outcome_and_fails_when_a_test_fails(gpu_check, tmp_path, capsys):
    """What `make gpu-check` runs, on this CPU: the gpu-marked tests fail here for want of CUDA, which the report
    shows test by test, and the exit code is pytest's, not 0."""
    out, md = tmp_path / "gc.json", tmp_path / "gc.md"
    rc = gpu_check.main(["--run-tests", "--device", "cpu", "--shape", "tiny", "--lengths", "64", "--score-length",
                         "32", "--batches", "1", "--repeats", "1", "--kv", "32,3,3", "--json", str(out), "--markdown",
                         str(md)])
    assert rc == 1  # pytest's code for failed tests
    res = json.loads(out.read_text())
    t = res["tests"]
    names = {c["test"] for c in t["cases"]}
    assert t["failed"] == len(names) >= 15 and t["passed"] == t["skipped"] == 0
    assert "tests.test_bfloat16::test_batched_and_alone_logliks_agree[bfloat16-cuda]" in names
    assert any(n.startswith("tests.test_gpu::test_a_sweep_runs_end_to_end_on_cuda_for_each_family") for n in names)
    sec = res["seconds"]
    assert 0 < sec["tests"] < sec["total"] and 0 < sec["benchmark"] < sec["total"]
    assert f"Wall time: {sec['total']:.0f} s in all" in md.read_text()
