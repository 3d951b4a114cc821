"""The command line: sweep end to end on a tiny model, figures written, errors reported plainly."""
import subprocess
import sys
from pathlib import Path

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


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["sweep", "--task", "qa", "--model", "no-such-model", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model") and "Traceback" not in err
    assert main(["sweep", "--task", "qa", "--limit", "0"]) == 2
    assert "limit must be at least 1" in capsys.readouterr().err
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
