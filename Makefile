# Quick start: `make run` (replay the bundled trace: FCFS vs LVF), `make test`.
# Every target creates or reuses the local virtual environment .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUF_VERSION := 1.75.0
TORCH_VERSION ?= 2.13.0
TRITON_VERSION ?= 3.8.0
BUF := .tools/node_modules/.bin/buf
PROTO_FILES := $(wildcard proto/planner/v1/*.proto)
# Base for the proto breaking-change check: the commit named in
# proto/BREAKING_BASE (the last landed contract), or BREAKING_BASE=<ref>.
BREAKING_BASE ?= $(shell cat proto/BREAKING_BASE 2>/dev/null)

.PHONY: run test test-slow test-gpu bench-gpu proto proto-check lint format bench serve buf clean

# torch is pinned and installed first so pip takes the local CPU wheel where
# one is on disk (an unpinned torch pulls several GB of CUDA packages); the
# kernels extra then finds it satisfied.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "planner needs Python >= 3.11 (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet 'torch==$(TORCH_VERSION)' 'triton==$(TRITON_VERSION)'
	$(BIN)/python -m pip install --quiet -e '.[dev,kernels]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/planner replay fixtures/traces/default.jsonl --policy fcfs --policy lvf \
		--json-out out/replay/default.json --report-dir out/replay

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# On a CUDA machine: the GPU tests, then the kernels benchmark (JSON under
# $OUT, default out/kernels); both skip or refuse cleanly without a GPU.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu tests/kernels

bench-gpu: $(STAMP)
	$(BIN)/python -m planner.kernels.bench_gpu --out $${OUT:-out/kernels}

serve: $(STAMP)
	$(BIN)/planner serve

bench: $(STAMP)
	$(BIN)/planner bench policies --policy rotation --out docs/bench/rotation.json --markdown docs/benchmarks.md
	$(BIN)/planner bench replay --out docs/bench/replay.json --markdown docs/benchmarks.md
	$(BIN)/planner bench solvers --problem offload --out docs/bench/solvers_offload.json --markdown docs/benchmarks.md
	$(BIN)/planner bench solvers --problem placement --out docs/bench/solvers_placement.json --markdown docs/benchmarks.md

$(BUF):
	mkdir -p .tools
	npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf@$(BUF_VERSION)

buf: $(BUF)

# Regenerates the Python stubs (messages, gRPC, and their type stubs) under planner/v1.
proto: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grpc_tools.protoc -I proto \
		--python_out=. --mypy_out=quiet:. --grpc_python_out=. --mypy_grpc_out=quiet:. \
		$(PROTO_FILES)

# Fails when the committed stubs differ from what `make proto` generates.
proto-check: $(STAMP)
	rm -rf .tools/proto-check && mkdir -p .tools/proto-check
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grpc_tools.protoc -I proto \
		--python_out=.tools/proto-check --mypy_out=quiet:.tools/proto-check \
		--grpc_python_out=.tools/proto-check --mypy_grpc_out=quiet:.tools/proto-check \
		$(PROTO_FILES)
	@for f in .tools/proto-check/planner/v1/*; do \
		diff -q "$$f" "planner/v1/$$(basename $$f)" >/dev/null || \
		{ echo "stale generated stub: planner/v1/$$(basename $$f) (run make proto)"; exit 1; }; \
	done
	@for f in planner/v1/*_pb2*.py*; do \
		test -e ".tools/proto-check/$$f" || { echo "stub without proto: $$f"; exit 1; }; \
	done
	@echo "generated stubs are up to date"

lint: $(STAMP) $(BUF)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BUF) lint
	@if [ -z "$(BREAKING_BASE)" ]; then \
		echo "buf breaking: no base recorded in proto/BREAKING_BASE, nothing to compare"; \
	elif git cat-file -e "$(BREAKING_BASE):proto" 2>/dev/null; then \
		$(BUF) breaking --against '.git#ref=$(BREAKING_BASE),subdir=proto'; \
	else echo "buf breaking: base $(BREAKING_BASE) not in this clone, nothing to compare"; fi

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache .hypothesis
