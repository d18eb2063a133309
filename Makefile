# Entry points over scripts/ (`make help` lists them). Extra pytest arguments: make test-fast ARGS="-k verify".
ARGS ?=
VENV := .venv/bin

.PHONY: help setup demo test test-fast test-docker test-torch28 lint fmt check

help:  ## this list
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -e 's/:.*## /\t/'

$(VENV)/python:
	bash scripts/setup.sh

setup:  ## create or update .venv (the project with its test extras, CPU torch)
	bash scripts/setup.sh

demo:  ## compile, verify and serve the tiny model on the CPU backend (127.0.0.1:8080)
	bash scripts/demo.sh

test:  ## every test that needs no inf2 machine, as CI runs it (installs the Docker packages when root)
	bash scripts/test.sh $(ARGS)

test-fast: | $(VENV)/python  ## every test that needs neither Docker nor inf2 (no apt, no daemon)
	$(VENV)/python -m pytest -m "not neuron and not docker" --durations=15 $(ARGS)

test-docker:  ## the image and registry tests alone
	TORCH28_LANE=0 bash scripts/test.sh -m docker $(ARGS)

lint: | $(VENV)/python  ## the fast lane: ruff check, ruff format --check, mypy
	bash scripts/lint.sh

fmt: | $(VENV)/python  ## format and fix what ruff can fix
	$(VENV)/ruff format .
	$(VENV)/ruff check --fix .

check: lint test-fast  ## lint, then the Docker-free tests

test-torch28: | $(VENV)/python  ## the torch 2.8 lane: port, verify, stand-in and server tests (its own cached venv)
	bash scripts/torch28.sh $(ARGS)
