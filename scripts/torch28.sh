#!/usr/bin/env bash
# The project on the torch the Neuron image runs: torch-neuronx 2.8.0.2.12.22436 (SDK 2.28) is built
# for torch 2.8, while the main venv has a newer torch. Makes a venv of its own on first use (cached,
# like scripts/clients.sh), with torch 2.8 and the same pins as the tests (constraints/test.txt), then
# runs pytest on the focused subset below, or on the arguments given.
# Usage: bash scripts/torch28.sh [pytest args]    (.ci/run runs it with none, after the lint lane)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TORCH_VERSION=2.8.0
# PyPI's torch 2.8 for x86_64 Linux is the CUDA build (its nvidia-* wheels, ~3 GB in all): the CPU
# build lives on PyTorch's own index only. Into the venv go torch held at 2.8 (the constraints leave it
# out) and the project's dependencies and test extras at the test pins, not the project: the tests run
# the checkout they are started from (PYTHONPATH below), so one venv serves every clone and worktree.
INSTALL=(-c constraints/test.txt "torch==$TORCH_VERSION" -r pyproject.toml --extra test)
# The recipe and the pins name the venv: a changed one makes a new venv, never a stale reuse.
TAG=$( { cat pyproject.toml constraints/test.txt; echo "${INSTALL[*]}"; } | sha1sum | cut -c1-10)
VENV=${TORCH28_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gemma4-inf2/torch-$TORCH_VERSION-$TAG}
# shellcheck source=scripts/uv-venv.sh
source scripts/uv-venv.sh
started=$SECONDS
uv_venv "$VENV" "${INSTALL[@]}"
echo "torch28: venv ready in $((SECONDS - started)) s ($VENV)" >&2
"$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# The focused subset, a few minutes: the port (decoder, KV, slot copy), one compile and verify against
# transformers' float reference, the Neuron stand-in (ModelBuilder, the SPMD runtime) with a tp 2 layout
# compiled, verified and served and a fork through the copy key, and the server (the runner, the engine,
# greedy chat over HTTP equal to the reference).
SUBSET=(
  tests/test_decoder.py
  "tests/test_verify.py::test_compile_then_verify_matches_the_float_reference[fp32-tiny-e2b]"
  tests/test_neuron_standin.py
  "tests/test_neuron_path.py::test_every_layout_compiles_through_model_builder_and_verifies[tp2-device-prefill]"
  tests/test_neuron_path.py::test_serve_answers_on_the_stand_in
  "tests/test_neuron_path.py::test_a_fork_runs_the_copy_key_and_the_kv_never_leaves_the_device[batch4]"
  tests/test_runner.py
  tests/test_engine.py
  "tests/test_server_e2e.py::test_greedy_chat_equals_the_float_reference[stream-fp32]"
)
started=$SECONDS
status=0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=10 "${@:-${SUBSET[@]}}" || status=$?
echo "torch28: tests took $((SECONDS - started)) s" >&2
exit $status
