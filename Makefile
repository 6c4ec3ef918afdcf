# InfraLens Diffusion Handbook. `make help` lists the targets.
# Every target installs what it needs into .venv first (Python 3.11).

PYTHON ?= python3.11
# its full path, found before .venv/bin goes first on PATH (below)
BASE_PYTHON := $(shell command -v $(PYTHON) 2>/dev/null || echo $(PYTHON))
VENV   := .venv
BIN    := $(VENV)/bin
# Install levels: what serving the site needs; the dev tools on top (pytest, ruff,
# Playwright); the verify extra on top of those (CPU torch, diffusers). `make serve` and
# `make build` take the first only, so a reader's venv stays lean (under 300 MB):
# - no pip or setuptools in the venv when this Python's pip can install into it
#   (`pip --python`, pip >= 22.3): serving needs neither (23 MB);
# - no bytecode compiled ahead for the whole dependency tree (`--no-compile`, 70 MB, most
#   of it for modules a build never imports: jedi's typeshed, debugpy, babel); Python
#   compiles what it imports on first use and keeps it, so the variable that would stop
#   it writing those caches is not passed on.
SITE   := $(VENV)/.installed-site
STAMP  := $(VENV)/.installed-dev
VERIFY := $(VENV)/.installed-verify
ifeq ($(shell $(BASE_PYTHON) -m pip --help 2>/dev/null | grep -c -- '--python <python>'),1)
VENV_FLAGS := --without-pip
PIP        := $(BASE_PYTHON) -m pip --python $(CURDIR)/$(BIN)/python
else
VENV_FLAGS :=
PIP        := $(BIN)/python -m pip
endif
unexport PYTHONDONTWRITEBYTECODE
export NO_MKDOCS_2_WARNING := 1
# nbconvert builds every exporter at import time only to list them in its CLI help
# (0.3 s of each build's start-up); mkdocs-jupyter never reads that list.
export NBCONVERT_DISABLE_CONFIG_EXPORTERS := 1
export PATH := $(CURDIR)/$(BIN):$(PATH)

.DEFAULT_GOAL := help
.PHONY: help install install-verify serve build offline test lint format verify verify-refresh verify-latest bench lighthouse clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(BIN)/python:
	$(BASE_PYTHON) -m venv $(VENV_FLAGS) $(VENV)

$(SITE): pyproject.toml | $(BIN)/python
	$(PIP) install --quiet --no-compile -e .
	@touch $@

$(STAMP): pyproject.toml $(SITE)
	$(PIP) install --quiet -e '.[dev]'
	@touch $@

$(VERIFY): pyproject.toml $(STAMP)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev,verify]'
	@touch $@

install: $(STAMP) ## Create .venv and install the project with its dev tools

install-verify: $(VERIFY) ## install, plus the verify extra (CPU torch 2.13.0 first, then diffusers)

serve: $(SITE) ## Serve the site with live reload on http://127.0.0.1:8000 (site deps only)
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

build: $(SITE) ## Strict build into site/ (site deps only)
	$(BIN)/mkdocs build --strict

OFFLINE := offline/infralens-diffusion-handbook
offline: $(SITE) ## Strict build to read from the file system, and its zip (offline/)
	rm -rf offline
	INFRALENS_OFFLINE=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(OFFLINE)
	cd offline && ../$(BIN)/python -m zipfile -c infralens-diffusion-handbook.zip infralens-diffusion-handbook
	@echo "open $(OFFLINE)/index.html, or unzip offline/infralens-diffusion-handbook.zip anywhere"

# One pytest worker per core (at most 4: the browser tests open two pages each), tests
# handed out as workers free up; `pytest` alone runs in one process.
test: $(STAMP) ## Run everything: lint, contracts, starters, labs, strict build, browser, verify (if installed)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist worksteal

lint: $(STAMP) ## ruff check + format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

verify: $(VERIFY) ## Install the verify extra (CPU torch 2.13.0 + diffusers) and run the verify tests
	$(BIN)/python -m pytest tests/verify

verify-refresh: verify ## After upgrading diffusers: rerun verify and record the versions the pages state
	INFRALENS_REFRESH_VERSIONS=1 $(BIN)/python -m pytest tests/verify

# The drift watch's own venv: the newest diffusers, transformers, peft, accelerate, gguf and torchao
# (upgraded on every run), beside the pinned torch here. The Drift workflow passes the newest
# CPU torch instead: LATEST_TORCH="torch --index-url https://download.pytorch.org/whl/cpu".
LATEST       := .venv-latest
LATEST_TORCH ?= torch==2.13.0
verify-latest: ## The verify suite against the newest diffusers/transformers/peft (.venv-latest), reported by page
	test -x $(LATEST)/bin/python || $(BASE_PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade $(LATEST_TORCH)
	$(LATEST)/bin/python -c "from importlib.metadata import version; print('torch==' + version('torch'))" > $(LATEST)/torch.txt
	$(LATEST)/bin/python -m pip install --quiet -c $(LATEST)/torch.txt -e '.[dev]'
	$(LATEST)/bin/python -m pip install --quiet -c $(LATEST)/torch.txt --upgrade diffusers transformers peft accelerate gguf torchao
	$(LATEST)/bin/python -m infralens_docs.drift --output $(LATEST)/drift-report.md

bench: $(STAMP) ## Prose words per page vs budget, cold/warm/one-starter build CPU time vs budget, starter wall times, lab page weight
	$(BIN)/python bench/run.py

lighthouse: $(STAMP) ## Lighthouse on every page: scores, KB at load, TBT, LCP (needs npm, nginx, chromium)
	$(BIN)/python bench/lighthouse.py

clean: ## Remove site/, caches, .venv and .venv-latest
	rm -rf site offline .cache .pytest_cache .ruff_cache $(VENV) $(LATEST)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
