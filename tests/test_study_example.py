"""The new-study example in lib/README.md runs as written: its conditions, units and items on the one loop."""
import re

from conftest import ROOT


def _example_code() -> tuple[str, str]:
    text = (ROOT / "lib" / "README.md").read_text()
    block = re.search(r"## A new study.*?```python\n(.*?)```", text, re.S).group(1)
    definitions, _, run = block.partition("# run it")
    return definitions, run


def test_the_readme_study_runs_resumes_and_keeps_its_conditions_apart(tiny_lm, tmp_path):
    definitions, run = _example_code()
    assert "Reverse(ReverseConfig()).run(litm.load_model(" in run
    ns: dict = {}
    exec(compile(definitions, "lib/README.md", "exec"), ns)
    config = ns["ReverseConfig"](num_docs=4, limit=3, results_dir=str(tmp_path))
    first = ns["Reverse"](config).run(tiny_lm)
    assert len(first) == 6 and set(first["condition"]) == {"given", "reversed"}
    assert set(first["status"]) == {"ok"} and first["correct"].notna().all()
    given = first[first["condition"] == "given"].set_index("example_id")
    reversed_ = first[first["condition"] == "reversed"].set_index("example_id")
    assert ((given["gold_index"] + reversed_["gold_index"]) == 3).all()  # the gold mirrored among 4 documents
    assert len(list(tmp_path.glob("*/records.jsonl"))) == 2
    again = ns["Reverse"](config).run(tiny_lm)
    assert again.drop(columns="latency_s").equals(first.drop(columns="latency_s"))
