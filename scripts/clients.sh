#!/usr/bin/env bash
# Runs Python in the venv of one OpenAI client library, made on first use (one venv per tool, so
# each resolves its own dependencies, apart from the project's and from each other's). The tests
# drive the server with these clients unchanged (tests/test_clients.py). scripts/uv-venv.sh makes them.
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
# shellcheck source=scripts/uv-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/uv-venv.sh"
# shellcheck disable=SC2086
uv_venv "$VENV" $PINS
if [ $# -eq 0 ]; then
  exit 0
fi
exec "$VENV/bin/python" "$@"
