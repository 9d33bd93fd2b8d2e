# KernelFarm. Every target builds or refreshes .venv first; a second run with nothing changed
# costs a stat of the stamp file.
PYTHON     ?= python3
VENV       := .venv
BIN        := $(VENV)/bin
# A GPU host picks its own torch/triton build, e.g. make test FARM_TORCH='torch==2.13.0'
FARM_TORCH  ?= torch==2.13.0
FARM_TRITON ?= triton==3.7.1
STAMP      := $(VENV)/.kernelfarm-installed
PINS       := $(VENV)/.kernelfarm-pins
SPEC       ?= jobs/specs/gemm_cpu.yaml
PYTEST_ARGS ?=
# Test worker processes (pytest-xdist), each a test file at a time with its own session services; 0 runs
# the tests in the make process itself.
TEST_WORKERS ?= 2
PYTEST      = $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

.PHONY: all venv run test test-fast bench gpu-check lint gateway monitor deps-debian deps-agents clean FORCE

all: test

# Rewritten only when the chosen torch/triton pins change, so the stamp stays fresh otherwise.
$(PINS): FORCE
	@mkdir -p $(VENV)
	@echo "$(FARM_TORCH) $(FARM_TRITON)" | cmp -s - $@ || echo "$(FARM_TORCH) $(FARM_TRITON)" > $@

$(STAMP): pyproject.toml Makefile $(PINS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(FARM_TORCH)" "$(FARM_TRITON)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $@

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/farm sweep run $(SPEC) --ambiguous warn

# Two tiers (README, "Tests"): `make test` runs every test (what CI runs); `make test-fast` leaves out
# those marked slow (browser, multi-node clusters, fresh farm processes, real sweep series): minutes, not
# a quarter of an hour. PYTEST_ARGS narrows either, e.g. PYTEST_ARGS=tests/gateway/core/test_pricing_cost.py.
test: $(STAMP) deps-debian deps-agents
	$(PYTEST) $(PYTEST_ARGS)

test-fast: $(STAMP) deps-debian
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# On a GPU host: the GPU tests, one small sweep per family and the figures against the hardware, kept in
# benchmarks/results/gpu-check-<host>-<date>/ (scripts/gpu-check.sh). Pass the host's torch build:
# make gpu-check FARM_TORCH='torch==2.13.0' (its CUDA index in PIP_EXTRA_INDEX_URL). No GPU: exit 4 at once.
gpu-check:
	@FARM_TORCH='$(FARM_TORCH)' FARM_TRITON='$(FARM_TRITON)' scripts/gpu-check.sh

lint: $(STAMP)
	$(BIN)/ruff check cluster gateway kernels jobs schemakit testkit tests benchmarks
	$(BIN)/ruff format --check cluster gateway kernels jobs schemakit testkit tests benchmarks
	$(BIN)/lint-imports

gateway: $(STAMP)
	$(BIN)/farm gateway serve --config gateway/example-config.yaml

# Debian's prometheus (tests/observability, `make monitor`), redis-server and postgresql (the gateway's
# shared-state and PostgreSQL tests start their own servers from them) and chromium (the report and site
# tests load their pages in it headless): installed when missing (as root, or with passwordless sudo), a
# no-op once there. In CI (CI set, as .ci/run does) a machine that cannot install them fails here, and
# the tests that need them would fail too (tests/services.py); elsewhere it gets a warning and those
# tests skip, counted in pytest's summary.
deps-debian:
	@DEPS_OPTIONAL=$(if $(filter-out 0 false no,$(CI)),0,1) scripts/debian-deps.sh

# Claude Code and the Codex CLI from npm at pinned versions, in .agents/ (the real-agent tests, which are
# slow: `make test` only); as deps-debian, a failure in CI and a warning elsewhere without node and npm.
deps-agents:
	@DEPS_OPTIONAL=$(if $(filter-out 0 false no,$(CI)),0,1) scripts/agent-clis.sh

# Prometheus and Alertmanager on 127.0.0.1 (grafana/prometheus.yml and alerts.yml; alerts to the gateway
# config's alerting.slack_webhook_url, GATEWAY_CONFIG=...), in the background; prints the URLs.
monitor: $(STAMP)
	@scripts/monitor.sh start

clean:
	rm -rf $(VENV) .pytest_cache .farm .agents
