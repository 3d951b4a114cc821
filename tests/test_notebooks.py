"""Smoke runs: each notebook executes top to bottom with a small limit, on the default model except where said."""
import nbformat
import pytest

from litm.notebooks import declared, execute

from conftest import ROOT, build_tiny_model

pytestmark = pytest.mark.notebook

# five documents (or pairs) instead of ten: prompts half as long, the same code paths
SMALL = {"NUM_DOCS": 5, "POSITIONS": (0, 2, 4)}
# the pilot on the study's own seed, so the study reuses the pilot's records
PLANNED = {"PILOT": 3, "PILOT_SEED": 0, "MOST": 2}
# a pilot held out from the study (another seed, or a file's first cases), as the notebook checks
HELD_OUT = {"PILOT": 3, "MOST": 2}
# parameter values replaced by the path of a tiny random model of that family, built in the test
TINY = {"<tiny llama>": "llama", "<tiny gemma3>": "gemma3"}
NOTEBOOKS = [
    ("00-tour-move-the-answer", {"QUESTIONS": 2, "NUM_DOCS": 5}, []),
    ("01-kv-retrieval-position-sweep", {"NUM_PAIRS": 5, "POSITIONS": (0, 2, 4), **HELD_OUT}, ["01-kv-position-curve"]),
    ("02-multidoc-qa-position-sweep", {**SMALL, **HELD_OUT}, ["02-qa-position-curve"]),
    ("03-attention-sinks-and-troughs",
     {"LIMIT": 2, "NUM_DOCS": 5, "POSITIONS": (0, 4), "CAL_EXAMPLES": 1, "SINK_LENGTHS": (250, 500)},
     ["03-sink-strength", "03-sink-map", "03-attention-heatmap", "03-attention-vs-accuracy", "03-calibrated-recall"]),
    ("04-reordering-strategies",
     {**HELD_OUT, "POOL": 8, "K": 4, "STRATEGIES": ("rank", "langchain", "attention_sort", "random"),
      "ORACLE_POSITIONS": (0,), "VARIANTS": ("after", "xml"), "SHARED": 3, "TIME_FIRST": 1},
     ["04-strategy-accuracy", "04-rank-placement", "04-accuracy-vs-cache-reuse"]),
    ("05-compression-strategies", {**HELD_OUT, "NUM_DOCS": 5, "POSITIONS": (0, 4), "BUDGETS": (200,)},
     ["05-accuracy-vs-tokens", "05-evidence-survival", "05-position-curves"]),
    ("06-statistics-and-reporting",
     {"LIMIT": 4, **SMALL, "LENGTHS": (250, 500), "DEPTHS": 4, "GRID_LIMIT": 3},
     ["06-depth-length-heatmap"]),
    # the comparison's second model is a tiny random Gemma 3 (Gemma 3 270M's own loading and attention are tested in
    # test_default_model and test_attention): the two-model path, in under half the time
    ("07-diagnose-your-rag-prompt",
     {**HELD_OUT, "ORDERS": 2, "DEPTHS": (0.0, 0.5, 0.95), "SECOND_MODEL": "<tiny gemma3>"},
     ["07-diagnosis"]),
    # on a tiny random Llama, six of the ten levers: the notebook's own code; each lever's path is tested on the tiny
    # families (test_levers, test_parallel, test_channels, ...) and runs on the default model in `make reproduce`
    ("08-interventions-inside-the-model",
     {**PLANNED, "MODEL": "<tiny llama>", "NUM_DOCS": 5, "POSITIONS": (0, 2, 4), "BUDGET": 300,
      "LEVERS": ("baseline", "attention_sort", "calibration", "rescaling", "channel_scaling", "parallel"),
      "BIAS_EXAMPLES": 1, "CHANNEL_EXAMPLES": 2, "SORT_ROUNDS": 1},
     ["08-lever-curves", "08-lever-curves-accuracy", "08-lever-forest"]),
]


@pytest.mark.parametrize("name, parameters, figures", NOTEBOOKS, ids=[n[0] for n in NOTEBOOKS])
def test_notebook_executes(name, parameters, figures, tmp_path):
    """Through papermill, as `make reproduce` runs them, with the config cell's values set as parameters."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    parameters = {k: str(build_tiny_model(tmp_path / TINY[v], chat=True, arch=TINY[v])) if v in TINY else v
                  for k, v in parameters.items()}
    for key, folder in (("RESULTS_DIR", "results"), ("FIGURES_DIR", "figures"), ("REPORT_DIR", "reports")):
        if key in declared(path):
            parameters[key] = str(tmp_path / folder)
    out = execute(path, tmp_path / "executed", parameters=parameters)
    assert out.is_file()
    for figure in figures:
        assert (tmp_path / "figures" / f"{figure}.png").stat().st_size > 1000
        assert (tmp_path / "figures" / f"{figure}.pdf").is_file()
    if "RESULTS_DIR" in declared(path):
        assert list((tmp_path / "results").glob("*/records.jsonl"))  # a notebook that stores results did
    injected = [c for c in nbformat.read(out, as_version=4).cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and all(f"{k} = " in injected[0].source for k in parameters)


def test_every_notebook_is_smoke_tested():
    assert sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")) == sorted(n[0] for n in NOTEBOOKS)


def test_a_worked_solution_executes_and_answers_its_exercises(tmp_path):
    """notebooks/solutions/00 through papermill as `make solutions` runs it, with a tiny Gemma 3 as the second model."""
    path = ROOT / "notebooks" / "solutions" / "00-tour-solutions.ipynb"
    tiny = build_tiny_model(tmp_path / "gemma3", chat=False, arch="gemma3")
    out = execute(path, tmp_path / "executed",
                  parameters={"QUESTIONS": 2, "NUM_DOCS": 5, "LONG_DOCS": 6, "SECOND_MODEL": str(tiny)})
    printed = "".join(o.get("text", "") for c in nbformat.read(out, as_version=4).cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "of 2 questions rank the gold lower in the middle than at both edges" in printed  # exercise 1
    assert printed.count("middle penalty of the gold's log-likelihood") == 2  # exercise 2, both models
    assert "6 documents: gold in the middle" in printed and "n = 2" in printed  # exercise 3


def test_every_solution_notebook_declares_parameters_and_is_linked_from_its_exercises():
    for solution in sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]-*.ipynb")):
        assert declared(solution), f"{solution.name} has no parameters cell"
        number = solution.name[:2]
        (notebook,) = (ROOT / "notebooks").glob(f"{number}-*.ipynb")
        assert f"solutions/{solution.name}" in notebook.read_text(), f"{notebook.name}'s Try this does not link it"
