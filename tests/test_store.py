"""Results store and sweeps: resumable, no duplicates, no lost records, too-long prompts counted."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from litm import SweepConfig, summarize, sweep
from litm.errors import ConfigError, DataError
from litm.experiment import Sweep
from litm.models import run_identity
from litm.store import ResultStore
from litm.study import config_hash

ROOT = Path(__file__).resolve().parents[1]


def _store(tmp_path, name="abc"):
    return ResultStore(tmp_path, name, {"x": 1}, {"name": "m"})


def test_store_appends_and_skips_duplicates(tmp_path):
    s = _store(tmp_path)
    s.append({"example_id": "a", "v": 1})
    s.append({"example_id": "a", "v": 2})
    s.append({"example_id": "b", "v": 3})
    lines = (tmp_path / "abc" / "records.jsonl").read_text().splitlines()
    assert [json.loads(x)["v"] for x in lines] == [1, 3]
    manifest = json.loads((tmp_path / "abc" / "manifest.json").read_text())
    assert manifest["config"] == {"x": 1} and "packages" in manifest["environment"]


def test_truncated_last_line_is_dropped_and_redone(tmp_path):
    s = _store(tmp_path)
    s.append({"example_id": "a", "v": 1})
    s.close()
    with open(s.path, "a") as fh:
        fh.write('{"example_id": "b", "v"')  # a write cut short by a kill
    s2 = _store(tmp_path)
    assert "a" in s2 and "b" not in s2
    s2.append({"example_id": "b", "v": 2})
    assert [json.loads(x) for x in s.path.read_text().splitlines()] == [{"example_id": "a", "v": 1},
                                                                         {"example_id": "b", "v": 2}]


def test_corrupt_middle_line_and_foreign_manifest_are_errors(tmp_path):
    s = _store(tmp_path)
    s.append({"example_id": "a"})
    s.close()
    s.path.write_text('{"example_id": "a"}\nnot json\n{"example_id": "c"}\n')
    with pytest.raises(DataError, match="records.jsonl:2"):
        _store(tmp_path)
    with pytest.raises(DataError, match="another config"):
        ResultStore(tmp_path, "abc", {"x": 2})


def test_config_hash_ignores_run_settings_but_not_conditions(tiny_lm):
    def h(config, condition="documents", position=0):
        return config_hash(Sweep(config).run_config(run_identity(tiny_lm), {"condition": condition, "position": position}))

    a = SweepConfig(task="kv", limit=5, batch_size=1)
    b = SweepConfig(task="kv", limit=50, batch_size=8, results_dir="elsewhere", progress=False, shard=(0, 2))
    assert h(a) == h(b)
    assert h(a) != h(a, "documents", 4)
    assert h(a) != h(a, "oracle", None)
    assert h(a) != h(SweepConfig(task="kv", limit=5, seed=1))


@pytest.mark.parametrize("bad", [dict(limit=0), dict(positions=(10,)), dict(positions=(-1,)), dict(task="xx"),
                                 dict(scoring="vibes"), dict(num_docs=0), dict(limit=None)])
def test_bad_configs_raise_config_error(bad):
    with pytest.raises(ConfigError):
        SweepConfig(**bad)


def test_sweep_records_positions_and_resumes(tiny_lm, tmp_path):
    cfg = SweepConfig(task="qa", num_docs=5, positions=(0, 2, 4), limit=4, sentences_per_doc=2,
                      results_dir=str(tmp_path), progress=False, batch_size=3)
    df = sweep(cfg, tiny_lm)
    assert len(df) == 4 * 5 and set(df["status"]) == {"ok"}
    docs = df[df.condition == "documents"]
    for eid, g in docs.groupby("example_id"):
        g = g.sort_values("position")
        assert list(g["gold_index"]) == [0, 2, 4]
        assert g["gold_token_start"].is_monotonic_increasing and g["gold_rel_depth"].is_monotonic_increasing
        assert len(set(g["prompt_sha256"])) == 3
    assert df[df.condition == "closedbook"]["gold_in_prompt"].eq(False).all()
    assert (df[df.condition == "oracle"]["num_docs_shown"] == 1).all()
    assert ((df.gold_rank >= 1) & (df.gold_rank <= 5)).all() and df.correct.eq(df.gold_rank == 1).all()
    before = {p: p.read_bytes() for p in tmp_path.glob("*/records.jsonl")}
    assert len(before) == 5
    df2 = sweep(cfg, tiny_lm)  # everything is stored: nothing is recomputed or rewritten
    assert {p: p.read_bytes() for p in tmp_path.glob("*/records.jsonl")} == before
    assert df2.drop(columns="latency_s").equals(df.drop(columns="latency_s"))
    bigger = sweep(SweepConfig(**{**cfg.__dict__, "limit": 6}), tiny_lm)  # extends the same stores
    assert len(bigger) == 6 * 5
    assert sum(len(p.read_text().splitlines()) for p in tmp_path.glob("*/records.jsonl")) == 30


def test_prompts_longer_than_the_window_are_skipped_and_counted(tmp_path):
    from conftest import build_tiny_model
    from litm.models import load_model

    lm = load_model(str(build_tiny_model(tmp_path / "short", max_positions=200)), device="cpu", reuse=False)
    cfg = SweepConfig(task="qa", num_docs=5, positions=(0,), limit=3, closedbook=False, oracle=True,
                      results_dir=str(tmp_path / "r"), progress=False)
    df = sweep(cfg, lm)
    docs, oracle = df[df.condition == "documents"], df[df.condition == "oracle"]
    assert (docs.prompt_tokens > 200).all() and set(docs.status) == {"too_long"}
    assert docs.gold_loglik.isna().all() and docs.correct.isna().all()
    assert set(oracle.status) == {"ok"}
    s = summarize(df).set_index("condition")
    assert s.loc["documents", "too_long"] == 3 and s.loc["documents", "n"] == 0
    assert s.loc["oracle", "n"] == 3


def test_a_sweep_that_cannot_render_writes_nothing(tiny_lm, tmp_path):
    cfg = SweepConfig(task="qa", num_docs=3, positions=(0,), limit=2, template="paper",
                      data_dir=str(tmp_path / "no-paper-files"), results_dir=str(tmp_path / "r"), progress=False)
    with pytest.raises(DataError, match="litm fetch liu2023"):
        sweep(cfg, tiny_lm)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_results_of_a_data_file_are_keyed_by_its_content(tiny_lm, tmp_path):
    from litm.data import fictional_qa_records, write_jsonl

    a = write_jsonl(fictional_qa_records(2, 3, seed=5), tmp_path / "a" / "qa.jsonl")
    b = write_jsonl(fictional_qa_records(2, 3, seed=5), tmp_path / "b" / "copy.jsonl")
    c = write_jsonl(fictional_qa_records(2, 3, seed=6), tmp_path / "c" / "qa.jsonl")
    def h_of(path):
        sweep_ = Sweep(SweepConfig(task="qa", data=str(path), num_docs=3, positions=(0,), limit=2))
        return config_hash(sweep_.run_config(run_identity(tiny_lm), {"condition": "documents", "position": 0}))

    h = [h_of(p) for p in (a, b, c)]
    assert h[0] != h[2], "other content, other results"
    assert h[0] != h[1], "the file name is part of the key"
    moved = tmp_path / "moved" / "qa.jsonl"
    moved.parent.mkdir()
    a.rename(moved)
    assert h_of(moved) == h[0]


def _records(results: Path) -> dict:
    out = {}
    for f in sorted(results.glob("*/records.jsonl")):
        lines = f.read_text().splitlines()
        recs = [json.loads(x) for x in lines]
        out[f.parent.name] = [{k: v for k, v in r.items() if k != "latency_s"} for r in recs]
    return out


def test_killed_sweep_resumes_to_exactly_the_expected_records(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    args = [sys.executable, "-m", "litm", "sweep", "--task", "kv", "--model", str(tiny_model_dir), "--docs", "6",
            "--positions", "0,5", "--limit", "60", "--batch-size", "1", "--no-closedbook", "--seed", "7"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(args + ["--results", str(killed)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        n = sum(len(f.read_bytes().splitlines()) for f in killed.glob("*/records.jsonl"))
        if n >= 20 or proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = _records(killed)
    n_partial = sum(len(v) for v in partial.values())
    assert 20 <= n_partial < 3 * 60, "the run must be killed part way"
    first = next(iter(sorted(killed.glob("*/records.jsonl"))))
    with open(first, "a") as fh:  # and as if the kill had landed mid-write
        fh.write('{"example_id": "kv-s7-59", "status": "o')
    assert subprocess.run(args + ["--results", str(killed)], env=env, capture_output=True).returncode == 0
    clean = tmp_path / "clean"
    assert subprocess.run(args + ["--results", str(clean)], env=env, capture_output=True).returncode == 0
    got, want = _records(killed), _records(clean)
    assert set(got) == set(want) and len(want) == 3
    for key in want:
        ids = [r["example_id"] for r in got[key]]
        assert len(ids) == len(set(ids)) == 60
        by_id = {r["example_id"]: r for r in got[key]}
        for r in want[key]:
            g = by_id[r["example_id"]]
            for k, v in r.items():
                assert g[k] == pytest.approx(v, abs=1e-4) if isinstance(v, float) else g[k] == v, (key, k)
