#!/usr/bin/env bash
# Runs guidellm (the benchmark tool of the vLLM project) from its own venv, made on first use:
# its dependencies (datasets, sanic, ...) stay out of the project's venv. The CPU build of torch
# goes in first, else guidellm's bare `torch` requirement pulls the multi-GB CUDA build.
# Usage: bash scripts/guidellm.sh run --backend kind=openai_http,target=http://127.0.0.1:8080 ...
set -euo pipefail
GUIDELLM_VERSION=0.8.1
VENV=${GUIDELLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gemma4-inf2/guidellm-$GUIDELLM_VERSION}
PY=${PYTHON:-python3}
mkdir -p "$(dirname "$VENV")"
if [ ! -x "$VENV/bin/guidellm" ]; then
  (
    flock 9
    if [ ! -x "$VENV/bin/guidellm" ]; then
      rm -rf "$VENV"
      "$PY" -m venv "$VENV"
      "$VENV/bin/pip" install -q "${TORCH_SPEC:-torch==2.13.0}"
      "$VENV/bin/pip" install -q "guidellm==$GUIDELLM_VERSION"
    fi
  ) 9>"$VENV.lock" >&2
fi
exec "$VENV/bin/guidellm" "$@"
