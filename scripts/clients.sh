#!/usr/bin/env bash
# Runs Python in the venv of one OpenAI client library, made on first use (one venv per tool, so
# each resolves its own dependencies, apart from the project's and from each other's). The tests
# drive the server with these clients unchanged (tests/test_clients.py). uv (itself pip-installed
# once into a venv of its own) makes them: it downloads in parallel and skips compiling bytecode,
# which brought a fresh litellm venv from minutes to under half a minute here.
# Usage: bash scripts/clients.sh TOOL [python args...]    (no args: only make the venv)
#   TOOL: openai openai-agents langchain-openai pydantic-ai instructor litellm lm-eval
set -euo pipefail
TOOL=${1:?usage: clients.sh TOOL [python args...]}
shift
case "$TOOL" in
  openai) PINS="openai==3.57.0" ;;
  openai-agents) PINS="openai-agents==0.24.0" ;;
  langchain-openai) PINS="langchain-openai==1.7.4" ;;
  pydantic-ai) PINS="pydantic-ai-slim[openai]==2.68.0" ;;
  instructor) PINS="instructor==1.17.0" ;;
  litellm) PINS="litellm==1.110.2" ;;
  # local-completions tokenizes with the server's own tokenizer (transformers, no torch needed)
  lm-eval) PINS="lm-eval[api]==0.4.13 transformers==5.24.0" ;;
  *) echo "clients.sh: unknown tool $TOOL" >&2; exit 2 ;;
esac
# The pins name the venv: a changed pin makes a new one rather than reusing a stale one.
TAG=$(printf '%s' "$PINS" | sha1sum | cut -c1-10)
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/gemma4-inf2/client-$TOOL-$TAG
UV_VERSION=0.13.9
UV_VENV=$(dirname "$VENV")/uv-$UV_VERSION
PY=${PYTHON:-python3}
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
if [ ! -e "$VENV/.complete" ]; then
  (
    flock 9
    if [ ! -e "$VENV/.complete" ]; then
      rm -rf "$VENV"
      export UV_PYTHON_DOWNLOADS=never  # the machine's Python, never a downloaded one
      "$UV_VENV/bin/uv" venv -q --python "$PY" "$VENV"
      # shellcheck disable=SC2086
      "$UV_VENV/bin/uv" pip install -q --python "$VENV/bin/python" $PINS
      touch "$VENV/.complete"
    fi
  ) 9>"$VENV.lock" >&2
fi
if [ $# -eq 0 ]; then
  exit 0
fi
exec "$VENV/bin/python" "$@"
