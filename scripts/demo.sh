#!/usr/bin/env bash
# The main job on the embedded default: compile the tiny chat model (E2B-shaped, trained in code, shipped
# in the package) for the CPU backend, verify it against transformers' float reference in a fresh
# process, then serve it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
MANIFEST=${MANIFEST:-gemma4_port/manifests/tiny-chat.yaml}
VARIANT=${VARIANT:-fp32}
OUT=${OUT:-artifacts/demo}
.venv/bin/python build.py compile "$MANIFEST" --variant "$VARIANT" --out "$OUT"
.venv/bin/python build.py verify "$OUT"
echo "serving $OUT on http://127.0.0.1:${PORT:-8080} (Ctrl-C to stop)"
exec .venv/bin/python build.py serve "$OUT" --port "${PORT:-8080}"
