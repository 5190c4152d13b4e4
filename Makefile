# alibi-lm. `make help` lists the targets. Every target sets up .venv first if it is missing.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
EXPERIMENT ?= quick

.DEFAULT_GOAL := help

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

setup: $(VENV)/.installed  ## create .venv and install the project with its dev extras

test: setup  ## run the test suite
	$(PY) -m pytest -q $(ARGS)

test-fast: setup  ## the tests without the slow end-to-end ones
	$(PY) -m pytest -q -m "not slow" $(ARGS)

lint: setup  ## ruff
	$(VENV)/bin/ruff check .

figures: setup  ## position-scheme figures -> results/figures/
	$(PY) scripts/visualize_positions.py $(ARGS)

.PHONY: help setup test test-fast lint figures
