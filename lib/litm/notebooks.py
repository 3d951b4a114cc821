"""Execute notebooks headless through papermill (what `make reproduce` runs), with parameters.

A notebook's config cell is tagged `parameters`; papermill adds a cell after it that sets what you pass. A value
keeps the type of the notebook's own default: a list given on the command line for a tuple default becomes a
tuple. A parameter is given to the notebooks that declare it; one that no notebook declares is an error.

    python -m litm.notebooks notebooks/02-*.ipynb -p MOST 100 -p POSITIONS "[0, 9, 19]" --out build/notebooks
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
import time
from pathlib import Path

KERNEL = "python3"  # this interpreter's own kernel (the notebooks name "litm", which `make lab` registers)
RENDERED = Path("notebooks") / "executed"  # what `make reproduce` writes, committed for readers who browse


class NotebookError(Exception):
    """A notebook, parameter or executor problem a user can fix; the message says what to do."""


def _translator():
    """papermill's Python translator, writing tuples as tuples (it would write them as strings)."""
    from papermill.translators import PythonTranslator

    class Translator(PythonTranslator):
        @classmethod
        def translate(cls, val):
            if isinstance(val, tuple):
                return "(" + "".join(f"{cls.translate(v)}, " for v in val) + ")"
            return super().translate(val)

        @classmethod
        def translate_list(cls, val):
            return "[" + ", ".join(cls.translate(v) for v in val) + "]"

        @classmethod
        def translate_dict(cls, val):
            return "{" + ", ".join(f"{cls.translate(k)}: {cls.translate(v)}" for k, v in val.items()) + "}"

    return Translator


def parameters_cell(nb) -> int:
    """The index of the cell tagged `parameters`; a notebook without one cannot take parameters."""
    for i, cell in enumerate(nb.cells):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return i
    raise NotebookError("the notebook has no cell tagged `parameters`; tag its config cell (View > Cell "
                        "Toolbar > Tags in Jupyter) so papermill can set its values")


def declared(path: str | Path) -> dict:
    """The names the parameters cell assigns, with their default values (None where it is not a literal)."""
    import nbformat

    nb = nbformat.read(Path(path), as_version=4)
    tree = ast.parse(nb.cells[parameters_cell(nb)].source)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
            values = (node.value.elts if isinstance(node.value, ast.Tuple) and isinstance(node.targets[0], ast.Tuple)
                      else [node.value])
            for t, v in zip(targets, values):
                try:
                    out[t.id] = ast.literal_eval(v)
                except ValueError:
                    out[t.id] = None
    return out


def _typed(value, default):
    """A value in the type of its default: lists for tuples, ints for floats."""
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(_typed(v, default[0] if default else None) for v in value)
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def execute(path: str | Path, out_dir: str | Path = "build/notebooks", parameters: dict | None = None,
            timeout: int | None = 1800, rebase_links: bool = False, name: str | None = None) -> Path:
    """Run a notebook top to bottom in its own folder with papermill; `parameters` set the config cell's values.

    The executed copy (outputs included) goes to `out_dir` (named `name`, default the notebook's); `timeout` is
    each cell's limit in seconds (None: none); with `rebase_links`, its markdown's relative links are
    rewritten to resolve from there."""
    import nbformat
    import papermill
    from papermill.translators import papermill_translators

    path = Path(path)
    defaults = declared(path)
    params = {k: _typed(v, defaults.get(k)) for k, v in (parameters or {}).items()}
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise NotebookError(f"{path.name} has no parameter {', '.join(unknown)}; its parameters are "
                            f"{', '.join(defaults)}")
    papermill_translators.register("python", _translator())
    out = Path(out_dir) / (name or path.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(path), str(out), parameters=params, kernel_name=KERNEL, language="python", cwd=str(path.parent),
                               progress_bar=False, execution_timeout=timeout)
    if rebase_links:
        nb = nbformat.read(out, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = rebase(cell.source, path.parent, out.parent)
        nbformat.write(nb, out)
    return out


def rebase(markdown: str, src: Path, dst: Path) -> str:
    """Rewrite the relative links of markdown written in folder `src` so that they resolve from folder `dst`."""
    import os

    def fix(m):
        target = m.group(2)
        if re.match(r"^[a-z]+:|^#", target):
            return m.group(0)
        path, hash_, anchor = target.partition("#")
        new = os.path.relpath((src / path).resolve(), dst.resolve()).replace(os.sep, "/")
        return f"{m.group(1)}({new}{hash_}{anchor})"

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", fix, markdown)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m litm.notebooks", description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", help="notebook files, run in the order given")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a parameter (VALUE read as YAML, as papermill's -p: 10, 0.5, '[0, 4, 9]', text)")
    p.add_argument("--out", default=str(RENDERED), help=f"where the executed copies go (default {RENDERED})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import yaml

    args = parse_args(sys.argv[1:] if argv is None else argv)
    params = {name: yaml.safe_load(value) for name, value in args.parameter}
    try:
        decl = {p: declared(p) for p in args.notebooks}
    except (NotebookError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    unused = sorted(n for n in params if not any(n in d for d in decl.values()))
    if unused:
        print(f"error: no notebook given declares {', '.join(unused)}", file=sys.stderr)
        return 2
    total = time.perf_counter()
    for p in args.notebooks:
        mine = {k: v for k, v in params.items() if k in decl[p]}
        t0 = time.perf_counter()
        try:
            out = execute(p, args.out, mine, rebase_links=True)
        except Exception as e:  # papermill's execution error names the failing cell; the copy holds its traceback
            print(f"{p}: failed after {time.perf_counter() - t0:.0f} s: {type(e).__name__}: "
                  f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}\n"
                  f"  the executed copy with the error is in {args.out}", file=sys.stderr)
            return 1
        shown = " ".join(f"{k}={v!r}" for k, v in mine.items())
        print(f"{p}: executed in {time.perf_counter() - t0:.0f} s -> {out}" + (f" ({shown})" if shown else ""),
              flush=True)
    print(f"{len(args.notebooks)} notebooks in {time.perf_counter() - total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
