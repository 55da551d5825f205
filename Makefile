# The newcomer's commands are `make serve` and `make test` (see README.md).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test unit e2e lint generate serve bench

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[runtime,operator,dev]'
	touch $(STAMP)

# Everything CI runs: lint, fast tests, then the tests against a local control plane.
test: setup lint unit e2e

unit: setup
	images/install-tools.sh
	$(BIN)/pytest tests

e2e: setup
	$(BIN)/pytest e2e

lint: setup
	$(BIN)/ruff check .
	$(BIN)/hadolint Containerfile

generate: setup
	$(BIN)/python -m infernetes.generate

serve: setup
	$(BIN)/infernetes serve

bench: setup
	$(BIN)/python -m bench

# The runtime and operator images with podman; BASE_IMAGE=debootstrap builds from a local Debian
# base instead of a registry's (see images/build-images.sh).
.PHONY: images
images:
	images/install-tools.sh
	images/build-images.sh
