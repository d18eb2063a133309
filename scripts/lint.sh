#!/usr/bin/env bash
# The fast lane: lint, format and types, seconds long; .ci/run runs it before the long suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
