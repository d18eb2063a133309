#!/usr/bin/env bash
# Creates .venv and installs the project with its test extras. Sourced by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The CPU build of torch: a bare `pip install torch` pulls the multi-GB CUDA build on Linux.
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "$TORCH_SPEC"
.venv/bin/pip install -q -c constraints/test.txt -e '.[test]'
