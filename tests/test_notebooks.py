"""Smoke runs: each notebook executes top to bottom with a small limit, on the default model except where said."""
import pytest

from litm.notebooks import execute

from conftest import ROOT, build_tiny_model

pytestmark = pytest.mark.notebook

# five documents (or pairs) instead of ten: prompts half as long, the same code paths
SMALL = "NUM_DOCS = 5\nPOSITIONS = (0, 2, 4)\n"
# the pilot on the study's own seed, so the study reuses the pilot's records
PLANNED = "PILOT, PILOT_SEED, MOST = 3, SEED, 2\n"
# a pilot held out from the study (another seed, or a file's first cases), as the notebook checks
HELD_OUT = "PILOT, MOST = 3, 2\n"
NOTEBOOKS = [
    ("00-tour-move-the-answer", "QUESTIONS = 2\nNUM_DOCS = 5\n", []),
    ("01-kv-retrieval-position-sweep", "NUM_PAIRS = 5\nPOSITIONS = (0, 2, 4)\n" + HELD_OUT, ["01-kv-position-curve"]),
    ("02-multidoc-qa-position-sweep", SMALL + HELD_OUT, ["02-qa-position-curve"]),
    ("03-attention-sinks-and-troughs",
     "LIMIT = 2\nNUM_DOCS = 5\nPOSITIONS = (0, 4)\nCAL_EXAMPLES = 1\nSINK_LENGTHS = (250, 500)\n",
     ["03-sink-strength", "03-sink-map", "03-attention-heatmap", "03-attention-vs-accuracy", "03-calibrated-recall"]),
    ("04-reordering-strategies",
     HELD_OUT + "POOL = 8\nK = 4\nSTRATEGIES = ('rank', 'langchain', 'attention_sort', 'random')\n"
     "ORACLE_POSITIONS = (0,)\n"
     "VARIANTS = ('after', 'xml')\nSHARED, TIME_FIRST = 3, 1\n",
     ["04-strategy-accuracy", "04-rank-placement", "04-accuracy-vs-cache-reuse"]),
    ("05-compression-strategies", HELD_OUT + "NUM_DOCS = 5\nPOSITIONS = (0, 4)\nBUDGETS = (200,)\n",
     ["05-accuracy-vs-tokens", "05-evidence-survival", "05-position-curves"]),
    ("06-statistics-and-reporting",
     "LIMIT = 4\n" + SMALL + "LENGTHS = (250, 500)\nDEPTHS = 4\nGRID_LIMIT = 3\n",
     ["06-depth-length-heatmap"]),
    # the comparison's second model is a tiny random Gemma 3 (Gemma 3 270M's own loading and attention are tested in
    # test_default_model and test_attention): the two-model path, in under half the time
    ("07-diagnose-your-rag-prompt",
     HELD_OUT + "ORDERS = 2\nDEPTHS = (0.0, 0.5, 0.95)\nSECOND_MODEL = {tiny_gemma3!r}\n",
     ["07-diagnosis"]),
    # on a tiny random Llama, six of the ten levers: the notebook's own code; each lever's path is tested on the tiny
    # families (test_levers, test_parallel, test_channels, ...) and runs on the default model in `make reproduce`
    ("08-interventions-inside-the-model",
     PLANNED + "MODEL = {tiny_llama!r}\nNUM_DOCS = 5\nPOSITIONS = (0, 2, 4)\nBUDGET = 300\n"
     "LEVERS = ('baseline', 'attention_sort', 'calibration', 'rescaling', 'channel_scaling', 'parallel')\n"
     "BIAS_EXAMPLES, CHANNEL_EXAMPLES, SORT_ROUNDS = 1, 2, 1\n",
     ["08-lever-curves", "08-lever-curves-accuracy", "08-lever-forest"]),
]


@pytest.mark.parametrize("name, overrides, figures", NOTEBOOKS, ids=[n[0] for n in NOTEBOOKS])
def test_notebook_executes(name, overrides, figures, tmp_path):
    if "{tiny_" in overrides:
        overrides = overrides.format(**{f"tiny_{arch}": str(build_tiny_model(tmp_path / arch, chat=True, arch=arch))
                                        for arch in ("llama", "gemma3") if f"{{tiny_{arch}" in overrides})
    overrides += (f"RESULTS_DIR = {str(tmp_path / 'results')!r}\nFIGURES_DIR = {str(tmp_path / 'figures')!r}\n"
                  f"REPORT_DIR = {str(tmp_path / 'reports')!r}")
    out = execute(ROOT / "notebooks" / f"{name}.ipynb", tmp_path / "executed", overrides=overrides)
    assert out.is_file()
    for figure in figures:
        assert (tmp_path / "figures" / f"{figure}.png").stat().st_size > 1000
        assert (tmp_path / "figures" / f"{figure}.pdf").is_file()
    if "RESULTS_DIR =" in (ROOT / "notebooks" / f"{name}.ipynb").read_text():
        assert list((tmp_path / "results").glob("*/records.jsonl"))  # a notebook that stores results did


def test_every_notebook_is_smoke_tested():
    assert sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")) == sorted(n[0] for n in NOTEBOOKS)
