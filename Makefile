# Every target is idempotent: with everything installed, a second call starts work in seconds.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# checkov pins boto3, packaging and networkx below the project's pins: its own venv (tests/infra)
CHECKOV_VENV := .venv-checkov
CHECKOV_VERSION := 3.3.30
export CDK_DISABLE_VERSION_CHECK := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1

.PHONY: setup installs run test test-scale lint format typecheck openapi docs docs-gen package unit integration infra e2e synth deploy bench clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# The three installs run side by side (-j3), and pip does not byte-compile what it installs: Python
# compiles a module when it is first imported and caches it (__pycache__), and aws-cdk-lib alone is
# 428 MB of Python of which the project imports a few modules. Measured on a warm pip cache: the
# project's venv 164 s -> 97 s. So every target writes those caches, even where the environment
# says PYTHONDONTWRITEBYTECODE: else each of the suite's processes (xdist workers, local stacks,
# hundreds of CLI calls) would compile every module it imports again (measured: 2.0 s -> 4.3 s to
# import boto3, moto, pydantic and aws_cdk without caches; the CLI's `--help` 0.8 s -> 1.0 s).
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL := python -m pip install --quiet --disable-pip-version-check --no-compile
SETUP_PARTS := $(VENV)/.installed $(CHECKOV_VENV)/.installed node_modules/.installed

setup:  ## create .venv (project, dev tools) and .venv-checkov, npm ci (side by side)
	@$(MAKE) --no-print-directory -j3 installs

installs: $(SETUP_PARTS)

$(VENV)/.installed: pyproject.toml requirements-nodeps.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP_INSTALL) -e '.[dev]'
	$(BIN)/$(PIP_INSTALL) --no-deps -r requirements-nodeps.txt
	touch $@

$(CHECKOV_VENV)/.installed: Makefile
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/$(PIP_INSTALL) 'checkov==$(CHECKOV_VERSION)'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

run: setup  ## the main job: Lab 6.1 from the simulator, then a batch through the local stack
	$(BIN)/swarm sim lab61
	$(BIN)/swarm local demo

test: setup  ## lint, types, every tier with coverage, the package check, e2e on local stacks started first (~25 min)
	scripts/test-suite fast

test-scale: setup  ## the long scenarios (a 2,000-unit fairness flood, a 10,000-unit batch, a drain under a deep queue) on two local stacks (~15 min)
	scripts/test-suite scale

lint: setup  ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup  ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: setup  ## mypy on the library, the functions and the infrastructure
	$(BIN)/mypy swarm functions infra app.py

openapi: setup  ## regenerate docs/openapi.json from the API's models and routes (swarm/api)
	$(BIN)/python -m swarm.api.openapi docs/openapi.json

docs: setup  ## build the documentation site into site/ (mkdocs build --strict); fails on stale generated pages
	$(BIN)/python scripts/docgen.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-gen: setup  ## regenerate docs/reference/{cli,api,config}.md from the parser, docs/openapi.json and infra/config.py
	$(BIN)/python scripts/docgen.py

package: setup  ## build the wheel and the sdist into dist/ and twine-check them (make test also installs and synthesizes them)
	scripts/package-check build

unit: setup  ## tests/unit only
	$(BIN)/pytest tests/unit

integration: setup  ## tests/integration only (moto)
	$(BIN)/pytest tests/integration

infra: setup  ## tests/infra only (CDK assertions, cdk-nag, cfn-lint, ASL)
	$(BIN)/pytest tests/infra

e2e: setup  ## tests/e2e only (the whole stack on the local emulator)
	scripts/test-suite e2e

synth: setup  ## synthesize the CloudFormation templates offline into cdk.out/
	npx cdk synth --quiet

deploy: setup  ## drain, cdk deploy, undrain: make deploy STAGE=<stage> (local: the local stack; DRY_RUN=1: plan + cdk diff)
	@test -n "$(STAGE)" || { echo "make deploy: give the stage, e.g. make deploy STAGE=dev (DRY_RUN=1: the plan and cdk diff only)" >&2; exit 2; }
	$(BIN)/swarm deploy $(if $(filter local,$(STAGE)),--local,--stage $(STAGE)) $(if $(DRY_RUN),--dry-run)

clean:  ## remove build output (keeps .venv and node_modules)
	rm -rf cdk.out site .pytest_cache .mypy_cache .ruff_cache .hypothesis
