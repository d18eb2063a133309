#!/usr/bin/env bash
# The project on the torch the Neuron image runs: torch-neuronx 2.8.0.2.12.22436 (SDK 2.28) is built
# for torch 2.8, while the main venv has a newer torch. Makes a venv of its own on first use (cached,
# like scripts/clients.sh), with torch 2.8 and the same pins as the tests (constraints/test.txt), then
# runs pytest on the focused subset below, or on the arguments given.
# Usage: bash scripts/torch28.sh [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TORCH_VERSION=2.8.0
# The project's dependencies and pins name the venv: a changed one makes a new venv, never a stale reuse.
TAG=$(cat pyproject.toml constraints/test.txt | sha1sum | cut -c1-10)
VENV=${TORCH28_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gemma4-inf2/torch-$TORCH_VERSION-$TAG}
PY=${PYTHON:-python3}
UV_VERSION=0.13.9  # as scripts/clients.sh: uv downloads and unpacks the ~3 GB of wheels in parallel
UV_VENV=$(dirname "$VENV")/uv-$UV_VERSION
mkdir -p "$(dirname "$VENV")"
if [ ! -x "$UV_VENV/bin/uv" ]; then
  (
    flock 9
    if [ ! -x "$UV_VENV/bin/uv" ]; then
      rm -rf "$UV_VENV"
      "$PY" -m venv "$UV_VENV"
      "$UV_VENV/bin/pip" install -qq "uv==$UV_VERSION"
    fi
  ) 9>"$UV_VENV.lock" >&2
fi
if [ ! -f "$VENV/.complete" ]; then
  (
    flock 9
    if [ ! -f "$VENV/.complete" ]; then
      rm -rf "$VENV"
      export UV_PYTHON_DOWNLOADS=never  # the machine's Python, never a downloaded one
      "$UV_VENV/bin/uv" venv -q --python "$PY" "$VENV"
      # PyPI's torch 2.8 for x86_64 Linux is the CUDA build (its nvidia-* wheels, ~3 GB in all): the CPU
      # build lives on PyTorch's own index only. The project and its test extras at the test pins, torch
      # held at 2.8 (the constraints leave it out).
      "$UV_VENV/bin/uv" pip install -q --python "$VENV/bin/python" -c constraints/test.txt \
        "torch==$TORCH_VERSION" -e '.[test]'
      touch "$VENV/.complete"
    fi
  ) 9>"$VENV.lock" >&2
fi
"$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__"
# The port and the Neuron stand-in, as run on torch 2.8 (85 + 4 passed). verify and the server
# (tests/test_verify.py, tests/test_server_e2e.py) belong here too but have not yet run on it.
SUBSET=(tests/test_decoder.py tests/test_attention.py tests/test_sharding.py tests/test_lint.py
  tests/test_neuron_standin.py tests/test_neuron_platform.py tests/test_neuron_backend.py)
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${@:-${SUBSET[@]}}"
