# foxhunt: `make run` and `make test` do all the set-up on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DATA ?= data
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

setup: $(STAMP) ## Create .venv and install foxhunt (editable) with its dev tools; idempotent

synth: setup ## Generate the demo market data (6 months of ES and NQ as DBN) into data/raw
	$(BIN)/foxhunt synth --out $(DATA)/raw

ingest: setup ## Validate data/raw into partitioned Parquet under data/ingested
	$(BIN)/foxhunt ingest --raw $(DATA)/raw --out $(DATA)/ingested

precompute: setup ## Bars, features and order flow of data/ingested into the fxcache (data/fxcache)
	$(BIN)/foxhunt precompute --data $(DATA)/ingested --out $(DATA)/fxcache

folds: setup ## Walk-forward folds of each demo cache into data/folds
	@for s in ES NQ; do $(BIN)/foxhunt folds --cache $(DATA)/fxcache --symbol $$s --out $(DATA)/folds/$$s.json || exit 1; done

MODEL ?= dqn
run: synth ## Demo data, then train-baseline through KFP's local runner (MLflow in ./mlflow.db); MODEL=dqn|ppo|pqn|tlob|cfc|mamba2|tft|ensemble
	$(BIN)/python -m pipelines run-local train-baseline --demo model=$(MODEL)
	@echo
	@echo "demo DBN files:      $(DATA)/raw/GLBX.MDP3   (synth.json says how they were made)"
	@echo "ingested Parquet:    $(DATA)/ingested        (manifest.json: inputs, rows, validation)"
	@echo "fxcache:             $(DATA)/fxcache         (foxhunt fxcache ls; docs/features.md)"
	@echo "walk-forward folds:  $(DATA)/folds"
	@echo "training runs:       $(DATA)/runs/<run id>   (checkpoints, results.json)"
	@echo "report:              $(DATA)/report/<run id> (report.md, report.html, equity curves)"
	@echo "MLflow:              make ui                 (http://127.0.0.1:5000)"

compile: setup ## Compile every pipeline to build/<name>.yaml (cluster) and build/<name>.local.yaml
	REGISTRY=$(REGISTRY) IMAGE_TAG=$(IMAGE_TAG) $(BIN)/python -m pipelines compile

PIPELINE ?= train-baseline
PARAMS ?=
# PARAMS reaches the recipe through the environment (make exports command-line variables), so
# JSON values keep their quotes and spaces: make submit PARAMS='epochs=20 overrides={"dqn": {}}'
submit: setup ## Upload PIPELINE (default train-baseline) as a new version and run it on KFP_HOST; PARAMS="k=v ..."
	REGISTRY=$(REGISTRY) IMAGE_TAG=$(IMAGE_TAG) $(BIN)/python -m pipelines submit $(PIPELINE) --params "$$PARAMS"

# One registry and tag for the images, the pipelines (components/images.py uses the same rule)
# and infra's MLflow image.
REGISTRY ?= ghcr.io/foxhunt
IMAGE_TAG ?= $(shell git rev-parse --short=12 HEAD)
images: ## Build and push the CPU and GPU images to REGISTRY (tag IMAGE_TAG, default: the commit)
	docker build -f images/Dockerfile.cpu --build-arg GIT_COMMIT=$$(git rev-parse HEAD) -t $(REGISTRY)/foxhunt-cpu:$(IMAGE_TAG) .
	docker build -f images/Dockerfile.gpu --build-arg GIT_COMMIT=$$(git rev-parse HEAD) -t $(REGISTRY)/foxhunt-gpu:$(IMAGE_TAG) .
	docker build -f images/Dockerfile.mlflow -t $(REGISTRY)/foxhunt-mlflow:$(IMAGE_TAG) .
	docker push $(REGISTRY)/foxhunt-cpu:$(IMAGE_TAG)
	docker push $(REGISTRY)/foxhunt-gpu:$(IMAGE_TAG)
	docker push $(REGISTRY)/foxhunt-mlflow:$(IMAGE_TAG)

images-local: ## Build the three images here without Docker or a registry (buildah, debootstrap), run each as uid 10001
	images/build-local.sh

deploy-infra: setup ## Apply infra/base (namespace, volumes, MLflow server; image REGISTRY/foxhunt-mlflow:IMAGE_TAG)
	$(BIN)/python infra/render.py base --image $(REGISTRY)/foxhunt-mlflow:$(IMAGE_TAG) --out build/infra
	kubectl apply -k build/infra
	@echo "now create the Secrets from infra/secrets/*.yaml (see infra/README.md)"

NAMESPACE ?=
STORAGE_CLASS ?=
deploy-volumes: setup ## Create the two PVCs in NAMESPACE (your Kubeflow profile) of STORAGE_CLASS (RWX)
	@test -n "$(NAMESPACE)" || { echo "NAMESPACE=<your Kubeflow profile namespace> is needed"; exit 2; }
	$(BIN)/python infra/render.py volumes --namespace $(NAMESPACE) --storage-class "$(STORAGE_CLASS)" --out build/infra-volumes
	kubectl apply -f build/infra-volumes

# torch's CPU build (no CUDA wheels in the closure) is found at TORCH_FIND_LINKS; torch itself is
# left out of the lock: each image installs its own build of it.
TORCH_FIND_LINKS ?= https://download.pytorch.org/whl/cpu/torch/
LOCK_OPTS = --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 --quiet
lock: setup ## Regenerate images/requirements.lock and images/mlflow.lock (uv pip compile, with hashes)
	$(BIN)/uv pip compile pyproject.toml --find-links $(TORCH_FIND_LINKS) --no-emit-package torch $(LOCK_OPTS) -o images/requirements.lock
	$(BIN)/uv pip compile images/mlflow.in --constraint images/requirements.lock $(LOCK_OPTS) -o images/mlflow.lock

ui: setup ## Serve the MLflow UI of ./mlflow.db on http://127.0.0.1:5000
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000

# A pytest worker per core, at most four (each holds a copy of the demo models' working set).
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
# The run's temporary files go to a folder of its own, removed after: pytest's, and torch
# inductor's precompiled C++ headers (~150 MB each, new ones for each venv path, as each
# fresh clone's is; inductor keeps them in the temporary folder for good).
test: setup ## Run the test suite (no GPU needed), TEST_WORKERS processes side by side
	@tmp=$$(mktemp -d -t foxhunt-test.XXXXXX); \
	TMPDIR=$$tmp $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15; \
	rc=$$?; rm -rf $$tmp; exit $$rc

TRITON ?= triton==3.9.0
test-kernels: setup ## foxhunt's Triton kernels in Triton's interpreter on the CPU (installs Triton 3.9, ~1 GB, into .triton/)
	@test -f ".triton/.installed-$(TRITON)" || { rm -rf .triton && \
	  $(BIN)/python -m pip install -q --target .triton --no-deps "$(TRITON)" && \
	  touch ".triton/.installed-$(TRITON)"; }
	PYTHONPATH=.triton $(BIN)/python -m pytest -q tests/test_triton_interpreter.py

lint: setup ## Check format and lint with ruff
	$(BIN)/ruff format --check src tests bench components pipelines images infra
	$(BIN)/ruff check src tests bench components pipelines images infra

format: setup ## Format the code with ruff
	$(BIN)/ruff format src tests bench components pipelines images infra
	$(BIN)/ruff check --fix src tests bench components pipelines images infra

bench: setup ## Run the CPU benchmarks (synth, ingest and precompute throughput, fxcache open)
	$(BIN)/python bench/bench_ingest.py
	$(BIN)/python bench/bench_precompute.py --data $(DATA)/ingested
	$(BIN)/python bench/bench_learning.py --data $(DATA)

bench-gpu: ## On a CUDA machine: the standard training workload, eager vs CUDA graphs (bench_train.py)
	python3 bench/bench_train.py --check

features-doc: setup ## Regenerate the feature table in docs/features.md from the catalogue
	$(BIN)/python -c "from foxhunt.precompute.features import write_docs; write_docs()"

clean: ## Remove the virtual environment, build outputs and demo data
	rm -rf $(VENV) .triton build $(DATA)

.PHONY: help setup synth ingest precompute folds run compile submit images images-local deploy-infra deploy-volumes lock ui test test-kernels lint format bench bench-gpu features-doc clean
