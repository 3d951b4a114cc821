"""benchmarks/rescore.py scores a stored folder's examples again and pairs them with the stored records: on the
machine that stored them the change is nil, a planted shift in the stored margins comes back as the change, and a
stored prompt that is not the one it would score now stops it."""
import json

import pytest

from conftest import benchmark_module


@pytest.fixture(scope="module")
def rescore():
    return benchmark_module("rescore")


@pytest.fixture
def stored(tmp_path, tiny_model_dir, tiny_lm):
    from litm.experiment import SweepConfig, sweep

    config = SweepConfig(task="kv", model=str(tiny_model_dir), num_docs=5, positions=(2,), closedbook=False,
                         oracle=False, limit=4, results_dir=str(tmp_path / "results"), progress=False)
    sweep(config, model=tiny_lm)
    (folder,) = (tmp_path / "results").iterdir()
    return folder


def _shift(folder, field, change):
    path = folder / "records.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, field: change(r[field])}) + "\n" for r in rows))


def test_rescoring_on_the_same_machine_changes_nothing_and_a_planted_shift_comes_back(rescore, stored, tmp_path):
    pairs = rescore.rescore(stored, 4, tmp_path / "again")
    assert len(pairs) == 4 and all(s["gold_margin"] == r["gold_margin"] for s, r in pairs)
    _shift(stored, "gold_margin", lambda m: m + 1.5)  # as if another machine had stored margins 1.5 nats higher
    pairs = rescore.rescore(stored, 3, tmp_path / "third")  # the first 3 examples only
    assert [s["example_id"] for s, _ in pairs] == ["kv-s0-0", "kv-s0-1", "kv-s0-2"]
    assert [r["gold_margin"] - s["gold_margin"] for s, r in pairs] == pytest.approx([-1.5] * 3)


def test_a_stored_prompt_that_differs_stops_the_comparison(rescore, stored, tmp_path):
    _shift(stored, "prompt_sha256", lambda h: "0" * len(h))
    with pytest.raises(SystemExit, match="not a rescore of the same input"):
        rescore.rescore(stored, 4, tmp_path / "again")



def test_the_table_row_reads_the_pairs(rescore, stored, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["rescore.py", str(stored), "--n", "4"])
    assert rescore.main() == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {stored.name} "))
    assert "| kv 5 | documents at 3 | float32 | 4 |" in row
    assert "| +0.000 [+0.000, +0.000] | 0.000 | 0.000 | 4/4 | 4/4 |" in row
