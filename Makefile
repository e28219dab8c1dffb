# foxhunt: `make run` and `make test` do all the set-up on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DATA ?= data
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

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

# Demo training settings: CPU-sized, costs off so that the planted signal pays (docs/performance.md).
TRAIN_DEMO := --epochs 8 --eval-segments 16 --episode-bars 512 --fee-bps 0 --half-spread-bps 0 \
	--hidden 128 128 --head-hidden 64 --gamma 0.5 --n-step 1 --v-min -6 --v-max 6 \
	--envs 64 --collect-steps 64 --learn-steps 128 --batch-size 256 --lr 1e-3

train: setup ## Train Rainbow DQN over the ES demo folds (CPU-sized demo settings; MLflow in ./mlflow.db)
	$(BIN)/foxhunt train --folds $(DATA)/folds/ES.json --cache $(DATA)/fxcache --out $(DATA)/runs $(TRAIN_DEMO)

run: synth ingest precompute folds train ## The pipeline end to end on demo data (grows with each stage)
	@echo
	@echo "demo DBN files:      $(DATA)/raw/GLBX.MDP3   (synth.json says how they were made)"
	@echo "ingested Parquet:    $(DATA)/ingested        (manifest.json: inputs, rows, validation)"
	@echo "fxcache:             $(DATA)/fxcache         (foxhunt fxcache ls; docs/features.md)"
	@echo "walk-forward folds:  $(DATA)/folds/{ES,NQ}.json"
	@echo "training runs:       $(DATA)/runs            (checkpoints, results.json; MLflow: mlflow.db)"

test: setup ## Run the test suite (no GPU needed)
	$(BIN)/python -m pytest -q

lint: setup ## Check format and lint with ruff
	$(BIN)/ruff format --check src tests bench
	$(BIN)/ruff check src tests bench

format: setup ## Format the code with ruff
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

bench: setup ## Run the CPU benchmarks (synth, ingest and precompute throughput, fxcache open)
	$(BIN)/python bench/bench_ingest.py
	$(BIN)/python bench/bench_precompute.py --data $(DATA)/ingested
	$(BIN)/python bench/bench_learning.py --data $(DATA)

bench-gpu: ## On a CUDA machine: the standard training workload, eager vs CUDA graphs (bench_train.py)
	python3 bench/bench_train.py --check

features-doc: setup ## Regenerate the feature table in docs/features.md from the catalogue
	$(BIN)/python -c "from foxhunt.precompute.features import write_docs; write_docs()"

clean: ## Remove the virtual environment, build outputs and demo data
	rm -rf $(VENV) build $(DATA)

.PHONY: help setup synth ingest precompute folds train run test lint format bench bench-gpu features-doc clean
