# alibi-lm. `make help` lists the targets. Every target sets up .venv first if it is missing.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
TASK ?=
EXPERIMENT ?= $(if $(TASK),tasks,quick)

.DEFAULT_GOAL := help

# A WikiText copy beside the checkout (../shared/data on the project's machines) is used when
# ALIBI_LM_DATA is not set; elsewhere the loader reads ./data or downloads from the hub.
ifeq ($(origin ALIBI_LM_DATA), undefined)
ifneq ($(wildcard ../shared/data/wikitext-2),)
export ALIBI_LM_DATA := $(abspath ../shared/data)
endif
endif

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

# pyproject.toml states ranges; the exact versions come from the lock file (pip constraints). Its
# torch==2.13.0 is the CPU build where pip finds a local wheel of it (or PIP_EXTRA_INDEX_URL names the CPU index).
LOCK ?= requirements/lock.txt

$(VENV)/.installed: pyproject.toml setup.py $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade -c $(LOCK) pip
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev,bench]'
	touch $@

setup: $(VENV)/.installed  ## create .venv and install the project with its dev and bench extras at the lock file's versions

# pytest-xdist processes for make test; each test file runs whole on one (its module fixtures are built once)
TEST_WORKERS ?= 2

test: setup  ## run the test suite (TEST_WORKERS=2 processes)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

test-fast: setup  ## the tests without the slow end-to-end ones (TEST_WORKERS=2 processes)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

lint: setup  ## ruff
	$(VENV)/bin/ruff check .

figures: setup  ## position-scheme figures -> results/figures/ (needs a trained T5 run: ARGS="--t5-checkpoint runs/quick/t5-L64-seed0", or --out <folder>)
	$(PY) scripts/visualize_positions.py $(ARGS)

.PHONY: help setup test test-fast lint figures

# ---- experiments -----------------------------------------------------------------------------
# The registry's schemes (alibi_lm/positions/), comma-separated.
SCHEMES ?= $(shell $(PY) -m alibi_lm.positions)

train: setup  ## train one model (default: ALiBi, model=tiny, WikiText-103); ARGS="position=rope train.seq_len=128"
	$(PY) -m alibi_lm.train $(ARGS)

eval: setup  ## perplexity at L, 2L, 4L, 8L of the latest run (or ARGS="run=runs/..."): python -m alibi_lm.eval
	$(PY) -m alibi_lm.eval $(ARGS)

eval-extrapolation: eval  ## the same as make eval (its alias)

sweep: setup  ## train + evaluate every position scheme at one L (EXPERIMENT=quick; TASK=copy: a synthetic task, EXPERIMENT=tasks; resumable)
	$(PY) -m alibi_lm.train -m position=$(SCHEMES) experiment=$(EXPERIMENT) $(if $(TASK),task=$(TASK),) \
		train.resume=auto train.evaluate_after=true logger.wandb.mode=disabled $(ARGS)

budget-probes: setup  ## 6 trainings beside the reproduction's 3 (~3 h of one-thread steps; ARGS="--jobs 2" about half): how budget and dropout change the paper's effects -> results/probes/ (resumable; ARGS=--report rebuilds the table)
	$(PY) scripts/budget_probes.py $(ARGS)

reproduce: setup  ## the CPU reproduction -> results/cpu-wt2/ (~35 h of one-thread steps, ~20 h with ARGS="--jobs 2"; resumable): every scheme and variant x 3 seeds, L sweep, both protocols, probes
	$(PY) scripts/reproduce.py $(ARGS)

context-probes: setup  ## passkey + context-use probes over every run of EXPERIMENT -> probes.md beside its rows (results/<name>/ or runs/<name>/results/<name>/; resumable)
	$(PY) -m alibi_lm.probes sweep=$(EXPERIMENT) $(ARGS)

smoke: setup  ## check an installation: train -> evaluate -> report of ALiBi and sinusoidal on WikiText-2, about a minute on 2 idle cores -> runs/smoke/
	$(PY) -m alibi_lm.train -m experiment=smoke position=alibi,sinusoidal $(ARGS)
	$(PY) -m alibi_lm.results runs/smoke/results/smoke --print

demo: setup  ## the idea in minutes: ALiBi and sinusoidal trained briefly on WikiText-2 at L=64, perplexity at L..8L -> runs/demo/
	$(PY) -m alibi_lm.train -m experiment=demo position=alibi,sinusoidal $(ARGS)
	$(PY) -m alibi_lm.results runs/demo/results/demo --print

tasks: setup  ## the synthetic task suite -> results/tasks/: every scheme x task (5 seeds for the paper's schemes and NoPE, else 3) at L=64, scored at L..16L (resumable; ARGS="--jobs 2 --keep-committed": the runs not committed yet)
	$(PY) scripts/tasks.py $(ARGS)

# make report's folder: only an EXPERIMENT (or TASK) given on the command line or in the environment, not the
# default above; results/<name>/ for a committed experiment, else its trials' runs/<name>/results/<name>/
REPORT_NAME = $(if $(TASK),tasks,$(if $(filter file,$(origin EXPERIMENT)),,$(EXPERIMENT)))
REPORT_DIR = $(if $(REPORT_NAME),$(or $(wildcard results/$(REPORT_NAME)),runs/$(REPORT_NAME)/results/$(REPORT_NAME)),)

report: setup  ## rebuild tables and plots of EXPERIMENT=<name> (results/<name>/, else runs/<name>/results/<name>/; TASK=: tasks); without one: list the folders
	$(PY) -m alibi_lm.results $(REPORT_DIR) $(ARGS)

bench: setup  ## speed / memory / MFU benchmark -> results/bench/
	$(PY) -m alibi_lm.bench $(ARGS)

.PHONY: smoke demo train eval eval-extrapolation sweep context-probes budget-probes reproduce tasks report bench

# ---- the paper's own checkpoints (fairseq) ---------------------------------------------------------
import-fairseq: setup  ## a fairseq transformer_lm checkpoint -> run folder: ARGS="alibi_wt103_L512.pt --dict dict.txt" (alibi_lm/fairseq_format/)
	$(PY) -m alibi_lm.fairseq_import $(ARGS)

.PHONY: import-fairseq
