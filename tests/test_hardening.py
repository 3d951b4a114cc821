"""Issue 25's hostile checks: each way a fair user got a traceback, a misleading run or a doubled record is
here, and now ends in one line of ours (exit code 2, nothing written) or in a correct run."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from litm.cli import main
from litm.data import fictional_qa_records, write_jsonl
from litm.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "data" / "samples" / "rag_cases.jsonl"


@pytest.fixture(scope="module")
def unwritable() -> Path:
    """A folder this process cannot write in.  Mode 0555 binds everyone but root, to whom sysfs refuses new
    files; fails (not skips) when neither holds here."""
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys/kernel")):
        try:
            fd, name = tempfile.mkstemp(dir=candidate)
        except OSError:
            yield candidate
            break
        os.close(fd)
        os.unlink(name)
    else:
        pytest.fail("no folder here refuses new files; the read-only checks cannot run")
    folder.chmod(0o755)
    folder.rmdir()


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model fails the test: these errors must come before any model loads."""
    import litm.experiment
    import litm.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(litm.experiment, "load_backend", refuse)
    monkeypatch.setattr(litm.models, "load_model", refuse)


def _one_line_error(capsys, *needles) -> str:
    err = "\n".join(x for x in capsys.readouterr().err.splitlines() if x.strip() and "it/s]" not in x)  # no bars
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def _sweep(tiny_model_dir, results, *extra):
    return ["sweep", "--task", "qa", "--model", str(tiny_model_dir), "--docs", "4", "--positions", "0,3", "--limit",
            "3", "--results", str(results), *extra]


# 1. system errors: one line, exit 2, before the model loads, nothing written

def test_sweep_into_a_read_only_results_folder(tiny_model_dir, unwritable, no_model_load, capsys):
    assert main(_sweep(tiny_model_dir, unwritable / "res")) == 2
    _one_line_error(capsys, "--results", "cannot write in", str(unwritable))


def test_sweep_into_a_results_path_below_a_file(tiny_model_dir, tmp_path, no_model_load, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(_sweep(tiny_model_dir, tmp_path / "afile" / "res")) == 2
    _one_line_error(capsys, "is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "x"


def test_litm_cache_that_is_a_file(tiny_model_dir, tmp_path, no_model_load, monkeypatch, capsys):
    (tmp_path / "cachefile").write_text("x")
    monkeypatch.setenv("LITM_CACHE", str(tmp_path / "cachefile"))
    assert main(_sweep(tiny_model_dir, tmp_path / "res")) == 2
    _one_line_error(capsys, "LITM_CACHE", "is a file")
    assert not (tmp_path / "res").exists()


def test_read_only_litm_cache(tiny_model_dir, tmp_path, unwritable, monkeypatch, capsys):
    """A read-only cache costs only the hashes it cannot keep for a local model; where a GGUF model must be
    converted into it, one line says to point LITM_CACHE elsewhere."""
    from litm.models import gguf_to_safetensors
    from litm.errors import ModelError

    monkeypatch.setenv("LITM_CACHE", str(unwritable / "cache"))
    assert main(_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")) == 0
    with pytest.raises(ModelError, match="set LITM_CACHE to a writable folder"):
        gguf_to_safetensors(write_jsonl([{"not": "a model"}], tmp_path / "fake.gguf"))


def test_report_and_merge_into_a_read_only_out(tiny_model_dir, tmp_path, unwritable, capsys):
    assert main(_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "res"), "--out", str(unwritable / "rep")]) == 2
    _one_line_error(capsys, "--out", "cannot write in")
    assert main(["merge", str(tmp_path / "res"), "--out", str(unwritable / "merged")]) == 2
    _one_line_error(capsys, "--out", "cannot write in")


def test_diagnose_into_a_read_only_results_folder(tmp_path, unwritable, no_model_load, capsys):
    assert main(["diagnose", str(CASES), "--results", str(unwritable / "d"), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "--results", "cannot write in")
    assert main(["diagnose", str(CASES), "--results", str(tmp_path / "d"), "--out", str(unwritable / "o")]) == 2
    _one_line_error(capsys, "--out", "cannot write in")
    assert not (tmp_path / "d").exists()


def test_an_os_error_mid_run_is_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Past the checks, an OSError (a disk that fills, a folder made read-only while running) is still one
    line with the path."""
    import litm.store

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "res"))

    monkeypatch.setattr(litm.store, "environment", full)  # called as the first record is stored
    assert main(_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")) == 2
    _one_line_error(capsys, "No space left on device", str(tmp_path / "res"))


# 2. inputs that passed validation and then crashed or misled: refused before the model loads

def test_lone_surrogate_in_a_question_is_refused_with_file_and_line(tmp_path, no_model_load, capsys):
    recs = fictional_qa_records(3, 4, seed=1)
    recs[1]["question"] = recs[1]["question"] + "\ud800"
    data = write_jsonl(recs, tmp_path / "qa.jsonl")  # json.dumps writes the lone surrogate as "\ud800"
    assert "\\ud800" in data.read_text()
    assert main(["sweep", "--task", "qa", "--data", str(data), "--docs", "4", "--positions", "0,3", "--limit", "3",
                 "--results", str(tmp_path / "r")]) == 2
    _one_line_error(capsys, f"{data}:2", "not valid Unicode")


def test_lone_surrogate_in_a_case_is_refused_with_file_and_line(tmp_path, no_model_load, capsys):
    lines = CASES.read_text().splitlines()
    case = json.loads(lines[2])
    case["documents"][0]["text"] += "\udfff"
    bad = tmp_path / "cases.jsonl"
    bad.write_text("\n".join([lines[0], lines[1], json.dumps(case)]) + "\n")
    assert main(["diagnose", str(bad), "--results", str(tmp_path / "d"), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, f"{bad}:3", "not valid Unicode")


@pytest.mark.parametrize("flag,value,needle", [("--dtype", "int8", "unknown dtype 'int8'"),
                                               ("--dtype", "float64", "unknown dtype 'float64'"),
                                               ("--device", "banana", "unknown device 'banana'"),
                                               ("--device", "cuda:7", "torch sees no CUDA GPU")])
def test_dtype_and_device_are_checked(tiny_model_dir, tmp_path, no_model_load, capsys, flag, value, needle):
    assert main(_sweep(tiny_model_dir, tmp_path / "res", flag, value)) == 2
    _one_line_error(capsys, needle)
    assert main(["diagnose", str(CASES), "--results", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
                 flag, value]) == 2
    _one_line_error(capsys, needle)


@pytest.mark.parametrize("limit", ["0", "-1", "two", "1.5"])
def test_a_limit_is_a_positive_integer_or_all(tiny_model_dir, tmp_path, no_model_load, capsys, limit):
    assert main(["diagnose", str(CASES), f"--limit={limit}", "--results", str(tmp_path / "d")]) == 2
    _one_line_error(capsys, "--limit", "positive integer or 'all'")
    assert main(_sweep(tiny_model_dir, tmp_path / "res")[:-4] + [f"--limit={limit}"]) == 2
    _one_line_error(capsys, "--limit")


def test_diagnose_limit_in_the_library():
    from litm.diagnose import DiagnoseConfig
    from litm.errors import ConfigError

    for bad in (0, -1):
        with pytest.raises(ConfigError, match="limit must be at least 1"):
            DiagnoseConfig(cases=str(CASES), limit=bad)


@pytest.mark.parametrize("args,needle", [(["--positions", "0,0,2"], "positions lists [0] more than once")])
def test_duplicated_positions_are_refused(tiny_model_dir, tmp_path, no_model_load, capsys, args, needle):
    assert main(_sweep(tiny_model_dir, tmp_path / "res") + args) == 2
    _one_line_error(capsys, needle)


@pytest.mark.parametrize("args,needle", [(["--seeds", "0,0"], "seeds lists [0] more than once"),
                                         (["--depths", "0,0.5,0.5"], "depths lists [0.5] more than once"),
                                         (["--lengths", "1,2,2"], "lengths lists [2] more than once")])
def test_duplicated_seeds_depths_and_lengths_are_refused(tmp_path, no_model_load, capsys, args, needle):
    assert main(["diagnose", str(CASES), "--results", str(tmp_path / "d"), *args]) == 2
    _one_line_error(capsys, needle)


def test_data_is_checked_before_the_model_loads(tmp_path, no_model_load, capsys):
    bad = tmp_path / "qa.jsonl"
    bad.write_text('{"question": "q"}\n')
    assert main(["sweep", "--task", "qa", "--data", str(bad), "--results", str(tmp_path / "r")]) == 2
    _one_line_error(capsys, f"{bad}:1", "missing field")


def test_a_users_cases_file_is_not_told_to_fetch_and_bad_bytes_name_their_line(tmp_path, no_model_load, capsys):
    lines = CASES.read_text().splitlines()
    bad = tmp_path / "cases.jsonl"
    bad.write_bytes((lines[0] + "\n" + lines[1] + "\n").encode() + b'{"id": "caf\xe9"}\n')
    assert main(["diagnose", str(bad), "--results", str(tmp_path / "d")]) == 2
    err = _one_line_error(capsys, f"{bad}:3", "not UTF-8", "0xe9")
    assert "fetch" not in err
    bad.write_text(lines[0] + "\n" + lines[1][:40] + "\n")
    assert main(["diagnose", str(bad), "--results", str(tmp_path / "d")]) == 2
    err = _one_line_error(capsys, f"{bad}:2", "not valid JSON", "your cases file")
    assert "fetch" not in err
    assert main(["diagnose", str(tmp_path / "missing.jsonl")]) == 2
    assert "fetch" not in _one_line_error(capsys, "no such file")


# 3. the store: locked, self-checking

def test_three_writers_of_one_run_score_each_record_once(tiny_model_dir, tmp_path):
    """Three processes start the same sweep into one folder: one writes it, the others stop at once with one
    line naming the writer; every record is there once and no example was scored twice (the records file has
    exactly one line per record)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    args = [sys.executable, "-m", "litm", *_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik",
                                                  "--batch-size", "1")]
    args[args.index("--limit") + 1] = "60"  # a run long enough that the three meet
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes == [0, 2, 2], results
    for code, err in results:
        if code == 2:
            last = err.strip().splitlines()[-1]  # after the model's loading bar
            assert last.startswith("error: ") and "is being written by process" in last and "Traceback" not in err, err
    files = sorted((tmp_path / "res").glob("*/records.jsonl"))
    assert len(files) == 4
    for f in files:
        ids = [json.loads(line)["example_id"] for line in f.read_text().splitlines()]
        assert len(ids) == len(set(ids)) == 60
    assert main(_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")) == 0  # the lock was given back


def test_a_killed_writers_lock_is_recovered(tmp_path):
    """A process holding a run folder's lock is killed with SIGKILL; the next writer takes the lock."""
    from litm.store import LockedError, ResultStore

    code = ("import sys, time; sys.path.insert(0, sys.argv[2]); from litm.store import ResultStore; "
            "s = ResultStore(sys.argv[1], 'abc', {'x': 1}); print('locked', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(ROOT / "lib")], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    with pytest.raises(LockedError, match=f"process {proc.pid}"):
        ResultStore(tmp_path, "abc", {"x": 1})
    proc.kill()
    proc.wait()
    with ResultStore(tmp_path, "abc", {"x": 1}) as s:
        s.append({"example_id": "a"})
    assert (tmp_path / "abc" / "records.jsonl").read_text().count("\n") == 1


def _one_run(tiny_model_dir, tmp_path) -> list[Path]:
    assert main(_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")) == 0
    return sorted((tmp_path / "res").glob("*/records.jsonl"))


def test_a_records_line_that_is_not_a_record_names_file_and_line(tiny_model_dir, tmp_path, capsys):
    f = _one_run(tiny_model_dir, tmp_path)[0]
    lines = f.read_text().splitlines()
    f.write_text("\n".join([lines[0], '{"status": "ok"}', *lines[1:]]) + "\n")
    capsys.readouterr()
    assert main(_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")) == 2
    _one_line_error(capsys, f"{f}:2", "not a record of this run")
    assert main(["report", str(tmp_path / "res"), "--out", str(tmp_path / "rep")]) == 2
    _one_line_error(capsys, f"{f}:2", "not a record of this run")
    assert not (tmp_path / "rep").exists()


def test_a_truncated_manifest_names_its_file_in_sweep_and_report(tiny_model_dir, tmp_path, capsys):
    m = _one_run(tiny_model_dir, tmp_path)[0].parent / "manifest.json"
    m.write_text(m.read_text()[:50])
    capsys.readouterr()
    assert main(_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")) == 2
    _one_line_error(capsys, str(m), "not a readable manifest")
    assert main(["report", str(tmp_path / "res"), "--out", str(tmp_path / "rep")]) == 2
    _one_line_error(capsys, str(m), "not a readable manifest")
    assert not (tmp_path / "rep").exists()


def test_a_dropped_half_line_is_said(tiny_model_dir, tmp_path, capsys):
    f = _one_run(tiny_model_dir, tmp_path)[0]
    with open(f, "a") as fh:
        fh.write('{"example_id": "x", "sta')
    capsys.readouterr()
    assert main(_sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")) == 0
    err = capsys.readouterr().err
    assert f"note: {f}: dropped a half-written last line" in err
    assert f.read_text().endswith("}\n")


def test_a_run_that_fails_before_its_first_record_leaves_no_folder(tiny_lm, tmp_path):
    from litm import SweepConfig, sweep

    cfg = SweepConfig(task="qa", num_docs=3, positions=(0,), limit=2, template="paper",
                      data_dir=str(tmp_path / "no-paper-files"), results_dir=str(tmp_path / "r" / "deep"),
                      progress=False)
    with pytest.raises(DataError):
        sweep(cfg, tiny_lm)
    assert not (tmp_path / "r").exists()


# 4. the batch bound: batch size and sharding move scores by float rounding only, within BATCH_TOLERANCE

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scores_move_with_batch_size_and_shards_only_within_the_stated_bound(tiny_model_dir, tmp_path, dtype):
    """One choice sweep at batch 1 (no padding), at batch 4 and as two shards at batch 4: every score within
    `runner.BATCH_TOLERANCE` of batch 1, and every decision the same where the margin exceeds it."""
    import pandas as pd

    from litm.runner import BATCH_TOLERANCE
    from litm.store import read_records

    tol = BATCH_TOLERANCE[dtype]
    base = ["sweep", "--task", "qa", "--model", str(tiny_model_dir), "--docs", "6", "--positions", "0,2,5",
            "--limit", "10", "--scoring", "choice", "--device", "cpu", "--dtype", dtype]
    runs = {"batch1": ["--batch-size", "1"], "batch4": ["--batch-size", "4"], "shard0": ["--shard", "0/2"],
            "shard1": ["--shard", "1/2"]}
    for name, extra in runs.items():
        assert main(base + extra + ["--results", str(tmp_path / name)]) == 0

    def table(*names):
        rows = [r for n in names for f in (tmp_path / n).rglob("records.jsonl") for r in read_records(f)[0]]
        return pd.DataFrame(rows).set_index(["example_id", "condition", "position"]).sort_index()

    one, four, split = table("batch1"), table("batch4"), table("shard0", "shard1")
    assert len(one) == len(four) == len(split) == 10 * 5
    for other in (four, split):
        other = other.loc[one.index]
        for col in ("gold_loglik", "gold_margin"):
            assert (other[col] - one[col]).abs().max() <= tol, col
        clear = one["gold_margin"].abs() > tol
        assert clear.sum() >= 40 and (other["correct"][clear] == one["correct"][clear]).all()


# 5. honest merges

def test_merge_refuses_shards_of_different_configs(tiny_model_dir, tmp_path, capsys):
    base = _sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")
    assert main(base + ["--seed", "0", "--shard", "0/2"]) == 0
    assert main(base + ["--seed", "1", "--shard", "1/2"]) == 0
    capsys.readouterr()
    shards = sorted(str(p) for p in (tmp_path / "res").iterdir())
    assert main(["merge", *shards, "--out", str(tmp_path / "merged")]) == 2
    _one_line_error(capsys, "different studies", "seed: 0 vs 1")
    assert not (tmp_path / "merged").exists()


def test_a_merged_manifest_keeps_each_shards_environment_and_first_prompt(tiny_model_dir, tmp_path, capsys):
    base = _sweep(tiny_model_dir, tmp_path / "res", "--scoring", "loglik")
    for i in range(2):
        assert main(base + ["--shard", f"{i}/2"]) == 0
    shard_dirs = sorted((tmp_path / "res").iterdir())
    for j, d in enumerate(shard_dirs):  # as if each shard had run on its own machine
        for m in d.glob("*/manifest.json"):
            data = json.loads(m.read_text())
            data["environment"]["platform"] = f"machine-{j}"
            m.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["merge", *map(str, shard_dirs), "--out", str(tmp_path / "merged")]) == 0
    assert main(["merge", *map(str, shard_dirs), "--out", str(tmp_path / "merged")]) == 0  # again: nothing added
    for m in (tmp_path / "merged").glob("*/manifest.json"):
        data = json.loads(m.read_text())
        shard0 = json.loads((shard_dirs[0] / m.parent.name / "manifest.json").read_text())
        assert data["first_prompt"] == shard0["first_prompt"] and data["first_prompt"]["text"]
        assert data["environment"]["platform"] == "machine-0"
        assert sorted((s["shard"], s["environment"]["platform"]) for s in data["sources"]) == [
            ([0, 2], "machine-0"), ([1, 2], "machine-1")]
    assert main(["merge", str(shard_dirs[0]), "--out", str(tmp_path / "half")]) == 0
    assert "shards [1] of 0..1 are not among the sources" in capsys.readouterr().err


# smaller

def test_gpu_check_without_torch_is_one_line(tmp_path):
    """`make gpu-check` with a Python that has no torch: one line naming the interpreter and PYTHON=."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", "
                                                   "name='torch')\n")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "has no torch" in r.stderr and "PYTHON=" in r.stderr
    assert sys.executable in r.stderr
