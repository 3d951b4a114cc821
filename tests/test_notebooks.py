"""Smoke runs: each notebook executes top to bottom on the default model with a small limit."""
import pytest

from litm.notebooks import execute

from conftest import ROOT

pytestmark = pytest.mark.notebook


@pytest.mark.parametrize("name, figure", [("01-kv-retrieval-position-sweep", "01-kv-position-curve"),
                                          ("02-multidoc-qa-position-sweep", "02-qa-position-curve")])
def test_notebook_executes(name, figure, tmp_path):
    overrides = (f"LIMIT = 2\nPOSITIONS = (0, 9)\nRESULTS_DIR = {str(tmp_path / 'results')!r}\n"
                 f"FIGURES_DIR = {str(tmp_path / 'figures')!r}")
    out = execute(ROOT / "notebooks" / f"{name}.ipynb", tmp_path / "executed", overrides=overrides)
    assert out.is_file()
    assert (tmp_path / "figures" / f"{figure}.png").stat().st_size > 1000
    assert (tmp_path / "figures" / f"{figure}.pdf").is_file()
    assert list((tmp_path / "results").glob("*/records.jsonl"))
