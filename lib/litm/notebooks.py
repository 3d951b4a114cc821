"""Execute notebooks headless (what `make reproduce` runs); outputs go to build/notebooks, not to git."""
from __future__ import annotations

import sys
import time
from pathlib import Path


def execute(path: str | Path, out_dir: str | Path = "build/notebooks", overrides: str | None = None,
            timeout: int = 1800) -> Path:
    """Run a notebook top to bottom in its own folder; `overrides` is code run right after the config cell."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if overrides:
        at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code") + 1
        nb.cells.insert(at, nbformat.v4.new_code_cell(overrides))
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    out = Path(out_dir) / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


def main(paths: list[str]) -> int:
    for p in paths:
        t0 = time.perf_counter()
        out = execute(p)
        print(f"{p}: executed in {time.perf_counter() - t0:.0f} s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
