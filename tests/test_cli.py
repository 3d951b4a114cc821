"""The command line: sweep end to end on a tiny model, figures written, errors reported plainly."""
import subprocess
import sys
from pathlib import Path

import pytest

from litm.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_cli_sweep_prints_table_and_writes_figure(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["sweep", "--task", "qa", "--model", str(tiny_model_dir), "--docs", "4", "--positions", "0,3",
                 "--limit", "3", "--scoring", "loglik", "--results", "res", "--figure", "cli-curve"])
    out = capsys.readouterr().out
    assert code == 0
    assert "closedbook" in out and "oracle" in out and "mean_loglik" in out
    assert (tmp_path / "figures" / "cli-curve.png").stat().st_size > 1000
    assert (tmp_path / "figures" / "cli-curve.pdf").is_file()
    assert len(list((tmp_path / "res").glob("*/records.jsonl"))) == 4


def test_cli_sweep_in_bfloat16_on_the_cpu_gets_its_own_folders(tiny_model_dir, tmp_path, capsys):
    import json

    args = ["sweep", "--task", "qa", "--model", str(tiny_model_dir), "--docs", "4", "--positions", "0,3", "--limit",
            "2", "--scoring", "choice", "--results", str(tmp_path / "res"), "--device", "cpu"]
    assert main(args + ["--dtype", "bfloat16"]) == 0 and main(args) == 0
    dtypes = [json.loads(m.read_text())["config"]["dtype"] for m in (tmp_path / "res").glob("*/manifest.json")]
    assert sorted(dtypes) == ["bfloat16"] * 4 + ["float32"] * 4
    capsys.readouterr()
    assert main(args + ["--dtype", "float7"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown dtype 'float7'")


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["sweep", "--task", "qa", "--model", "no-such-model", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model") and "Traceback" not in err
    assert main(["sweep", "--task", "qa", "--limit", "0"]) == 2
    assert "expected a positive integer or 'all', got '0'" in capsys.readouterr().err
    assert main(["sweep", "--task", "kv", "--data", str(tmp_path / "missing.jsonl.gz")]) == 2
    assert "missing.jsonl.gz: no such file" in capsys.readouterr().err


def test_fetch_offline_is_a_clear_error(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = subprocess.run([sys.executable, "-m", "litm", "fetch", "liu2023", "--dest", str(tmp_path / "d"),
                        "--url", f"http://127.0.0.1:{port}/"], capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT / "lib"), "PATH": ""})
    assert r.returncode == 2
    assert r.stderr.startswith("error:") and "Traceback" not in r.stderr


def test_sharded_sweeps_merge_to_exactly_the_unsharded_records(tiny_model_dir, tmp_path, capsys):
    import json

    from litm.store import read_records

    common = ["sweep", "--task", "qa", "--model", str(tiny_model_dir), "--docs", "4", "--positions", "0,3",
              "--limit", "5", "--batch-size", "1"]  # batches of one: no padding partner changes a float
    assert main(common + ["--results", str(tmp_path / "whole")]) == 0
    for i in range(3):
        assert main(common + ["--results", str(tmp_path / "split"), "--shard", f"{i}/3"]) == 0
    shards = sorted((tmp_path / "split").iterdir())
    assert [p.name for p in shards] == ["shard-0-of-3", "shard-1-of-3", "shard-2-of-3"]
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0  # again: no duplicates

    def records(root):
        out = {}
        for m in root.glob("*/manifest.json"):
            recs = read_records(m.parent / "records.jsonl")[0]
            assert len(recs) == sum(1 for _ in open(m.parent / "records.jsonl")), "each example written once"
            out[m.parent.name] = {r["example_id"]: {k: v for k, v in r.items() if k != "latency_s"} for r in recs}
            assert json.loads(m.read_text())["config"]["condition"]
        return out

    whole, merged = records(tmp_path / "whole"), records(tmp_path / "merged")
    assert whole == merged and sum(len(v) for v in whole.values()) == 5 * 4  # 5 examples, 4 conditions
    capsys.readouterr()
    assert main(common + ["--shard", "3/3"]) == 2
    assert "0 <= i < n" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "nothing-here"), "--out", str(tmp_path / "m2")]) == 2
