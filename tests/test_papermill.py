"""`python -m litm.notebooks` (what `make reproduce` runs): papermill parameters keep their declared types, a
parameter no notebook declares is refused before anything runs, and executed copies' links are rebased."""
import json
from pathlib import Path

import nbformat
import pytest

from litm.notebooks import NotebookError, _translator, declared, execute, main, rebase


def _notebook(path: Path, config: str, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A test\n\nSee [the glossary](../docs/glossary.md#margin)."),
                nbformat.v4.new_code_cell(config), nbformat.v4.new_code_cell(body)]
    nb.cells[1].metadata["tags"] = ["parameters"]
    nbformat.write(nb, path)
    return path


def test_declared_reads_the_parameters_cell_with_its_defaults(tmp_path):
    p = _notebook(tmp_path / "a.ipynb", "X = (1, 2)\nA, B = 3, 'text'  # comment\nC = None\nRATE = 0.5\n", "pass")
    assert declared(p) == {"X": (1, 2), "A": 3, "B": "text", "C": None, "RATE": 0.5}
    nb = nbformat.read(p, as_version=4)
    nb.cells[1].metadata["tags"] = []
    nbformat.write(nb, p)
    with pytest.raises(NotebookError, match="tagged `parameters`"):
        declared(p)


def test_tuples_stay_tuples_in_the_injected_code():
    code = _translator().codify({"X": (0, 4, 9), "ONE": (0,), "EMPTY": (), "NEST": [(1, "a"), {"k": (2,)}]})
    ns = {}
    exec(code, ns)
    assert ns["X"] == (0, 4, 9) and ns["ONE"] == (0,) and ns["EMPTY"] == ()
    assert ns["NEST"] == [(1, "a"), {"k": (2,)}]


def test_the_command_line_runs_a_notebook_with_a_parameter_in_its_declared_type(tmp_path, capsys):
    src = tmp_path / "nb"
    src.mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "glossary.md").write_text('<a id="margin"></a>')
    nb = _notebook(src / "01-test.ipynb", "X = (1, 2)\nRATE = 0.5\nOUT = 'out.json'\n",
                   "import json\njson.dump({'X': repr(X), 'RATE': repr(RATE)}, open(OUT, 'w'))")
    out = tmp_path / "rendered" / "deeper"
    assert main([str(nb), "-p", "X", "[3, 4]", "-p", "RATE", "1", "--out", str(out)]) == 0
    written = json.loads((src / "out.json").read_text())  # the notebook ran in its own folder
    assert written == {"X": "(3, 4)", "RATE": "1.0"}
    assert "executed in" in capsys.readouterr().out
    executed = nbformat.read(out / "01-test.ipynb", as_version=4)
    assert "(../../docs/glossary.md#margin)" in executed.cells[0].source  # resolves from the copy's folder
    assert (out / executed.cells[0].source.split("(")[1].split("#")[0]).resolve() == tmp_path / "docs" / "glossary.md"


def test_a_parameter_no_notebook_declares_is_refused_before_anything_runs(tmp_path, capsys):
    nb = _notebook(tmp_path / "a.ipynb", "X = 1\n", "raise SystemExit('must not run')")
    assert main([str(nb), "-p", "LIMTI", "3", "--out", str(tmp_path / "out")]) == 2
    assert "no notebook given declares LIMTI" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(NotebookError, match="has no parameter LIMTI; its parameters are X"):
        execute(nb, tmp_path / "out", {"LIMTI": 3})


def test_a_failing_notebook_stops_the_run_and_says_where_its_copy_is(tmp_path, capsys):
    bad = _notebook(tmp_path / "01-bad.ipynb", "X = 1\n", "raise ValueError('broken on purpose')")
    never = _notebook(tmp_path / "02-never.ipynb", "X = 1\n", "open('ran', 'w')")
    assert main([str(bad), str(never), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "01-bad.ipynb: failed" in err and str(tmp_path / "out") in err
    assert not (tmp_path / "ran").exists()


def test_rebase_leaves_web_links_and_anchors_alone():
    md = "[a](../docs/x.md#y) ![f](../figures/f.png) [w](https://example.org/a) [h](#here)"
    assert rebase(md, Path("/r/notebooks"), Path("/r/notebooks/executed")) == (
        "[a](../../docs/x.md#y) ![f](../../figures/f.png) [w](https://example.org/a) [h](#here)")


def test_papermill_reads_every_parameter_of_every_shipped_notebook():
    """papermill parses the parameters cell itself (one name per line, no `;` in a comment); a name it cannot read
    is still injected but warned about as unknown, so every name ours declares must be one papermill sees."""
    import papermill

    from conftest import ROOT

    for nb in sorted((ROOT / "notebooks").glob("**/*.ipynb")):
        if "executed" in nb.parts or "paper" in nb.parts:
            continue
        seen = set(papermill.inspect_notebook(str(nb)))
        assert set(declared(nb)) <= seen, f"{nb.name}: papermill cannot read {sorted(set(declared(nb)) - seen)}"
