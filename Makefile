# slurm-multi: `make demo` runs a real 2-node job on the built-in test cluster; `make test` runs
# every test. `make help` lists the rest.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV       ?= .venv
PY         := $(VENV)/bin/python
# The venv is made from the system's Python, which every user can execute: jobs run as ordinary
# users, and a venv whose base interpreter lives under /root (pyenv) is useless to them.
VENV_PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
STAMP      := $(VENV)/.sm-setup-stamp$(subst /,-,$(VENV_PYTHON))
NODES      ?= 2
CLUSTER_NODES ?= 3
NODE       ?= node1
PROFILE    ?= none
RUNTIME    ?= docker
EXAMPLE    ?= toy
JOBDIR     ?=
BATS       ?= bats
BATS_JOBS  ?=
export PYTHONPATH := $(CURDIR)/py
export SM_PYTHON  := $(CURDIR)/$(PY)

SH_FILES := $(shell git ls-files --cached --others --exclude-standard -- bin lib sbatch tests examples bench .ci 2>/dev/null \
              | grep -vE '\.(py|md|json|csv|txt|bats)$$|Dockerfile|/data/|\.keep$$' \
              | while read -r f; do [ -f "$$f" ] && head -c 64 "$$f" | grep -qE '^#!.*(ba)?sh|shell=bash' && echo "$$f"; done)
BATS_FILES := $(shell git ls-files --cached --others --exclude-standard -- '*.bats' 2>/dev/null)
PY_FILES := py tests/py bench examples $(shell git ls-files --cached --others --exclude-standard -- tests/fakes 2>/dev/null \
              | while read -r f; do head -c 64 "$$f" 2>/dev/null | grep -q '^#!.*python' && echo "$$f"; done)

.PHONY: help setup lint test test-unit test-py test-bats test-cluster cluster-up cluster-down cluster-status \
        toy-image torch-image demo collect bench clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "Variables: NODES=$(NODES) (demo), EXAMPLE=$(EXAMPLE) (demo: toy|torchrun), RUNTIME=$(RUNTIME) (demo: docker|pyxis), PROFILE=$(PROFILE) (demo), NODE=$(NODE) (toy-image, torch-image), JOBDIR= (collect)"

setup: $(STAMP) ## install Debian packages (as root) and create .venv (idempotent)
	@# The helpers' bytecode, compiled once: a job user who cannot write py/ (or runs with
	@# PYTHONDONTWRITEBYTECODE) would otherwise recompile every module at every helper start.
	@$(PY) -m compileall -q py

$(STAMP): pyproject.toml
	@if [ "$$(id -u)" = 0 ]; then tests/cluster/install-packages; else echo "setup: not root, skipping Debian packages" >&2; fi
	@if [ -f $(VENV)/pyvenv.cfg ] && [ "$$(sed -n 's/^home = //p' $(VENV)/pyvenv.cfg)" != "$$(dirname $(VENV_PYTHON))" ]; then \
	  echo "setup: $(VENV) was made from another Python; making it again from $(VENV_PYTHON)" >&2; rm -rf $(VENV); fi
	@test -x $(PY) || $(VENV_PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

lint: setup ## shellcheck every shell file, ruff every Python file
	@echo "lint: shellcheck $(words $(SH_FILES)) shell files, $(words $(BATS_FILES)) bats files; ruff"
	@$(VENV)/bin/shellcheck -x -P SCRIPTDIR $(SH_FILES)
	@$(VENV)/bin/shellcheck -x -P SCRIPTDIR -s bash -e SC2030,SC2031,SC2034,SC2154,SC2155,SC1091 $(BATS_FILES)
	@tests/lint/seam
	@$(VENV)/bin/ruff check $(PY_FILES)
	@$(VENV)/bin/ruff format --check $(PY_FILES)

test-py: setup ## pytest (unit, real sockets and files)
	@$(VENV)/bin/pytest tests/py

test-bats: setup ## bats unit tests of the shell libraries and entrypoints
	@$(BATS) $(BATS_JOBS) tests/bats

test-unit: lint test-py test-bats ## everything that needs no cluster (fast)

cluster-up: setup ## bring the test cluster up (CLUSTER_NODES=3)
	@tests/cluster/up --nodes $(CLUSTER_NODES)

cluster-down: ## take the test cluster down, leaving nothing behind
	@tests/cluster/down

cluster-status: ## show the test cluster's nodes and daemons
	@tests/cluster/status

test-cluster: setup ## end-to-end tests on the test cluster (brings it up)
	@$(BATS) --timing tests/e2e

# What the end-to-end tests need first, made in the background while lint, pytest and bats run:
# the PyTorch base rootfs (debootstrap, minutes on a fresh machine, then cached), the test cluster
# (4 nodes: 55-bad-nodes needs them; the rest take 3 of them) and the torch image on node1. Each
# step is idempotent; the e2e files bring up or build whatever this did not.
E2E_PREP_LOG := $(or $(TMPDIR),/tmp)/sm-e2e-prep.log
test: setup ## lint, bats, pytest, then end-to-end on the test cluster
	@( examples/torchrun/build-image --rootfs-only && tests/cluster/up --nodes 4 && \
	  examples/torchrun/build-image --node node1 ) >$(E2E_PREP_LOG) 2>&1 & prep=$$!; \
	  $(MAKE) --no-print-directory test-unit; rc=$$?; \
	  wait $$prep || echo "test: the e2e prerequisites were not all made in the background ($(E2E_PREP_LOG)); the e2e files try again"; \
	  [ $$rc -eq 0 ] || exit $$rc; \
	  $(MAKE) --no-print-directory test-cluster

toy-image: setup ## build toy/model:local on one node's engine only (NODE=node1)
	@examples/toy/build-image --node $(NODE)

torch-image: setup ## build the PyTorch DDP image sm/torchrun:local on one node's engine (NODE=node1; base rootfs cached)
	@examples/torchrun/build-image --node $(NODE)

demo: setup ## run a real 2-node job on the test cluster (NODES=2, EXAMPLE=toy|torchrun, RUNTIME=docker|pyxis, PROFILE=none|nsys)
	@bin/sm-demo --nodes $(NODES) --example $(EXAMPLE) --runtime $(RUNTIME) --profile $(PROFILE)

collect: setup ## re-run results collection for a finished job dir (JOBDIR=...)
	@bin/sm-collect $(JOBDIR)

bench: setup ## measure overheads against baselines taken in the same run (brings the cluster up)
	@bench/run

clean: ## remove the venv and local outputs (not the cluster: see cluster-down)
	rm -rf $(VENV) slurm_output bench/results .pytest_cache .ruff_cache
