#!/usr/bin/env bash
# The project on an inf2 host without Docker (the Neuron DLAMI, Ubuntu 22.04): its python3 is 3.10 and
# the project needs 3.11, so this takes Ubuntu 22.04's own python3.11 (universe; the base image uses the
# same), makes .venv-neuron with the image's recipe (CPU torch from PyTorch's index and the Neuron SDK
# from Neuron's, both under constraints/neuron.txt, at the toolchain's exact builds), then the project.
# The Neuron apt packages and driver are the DLAMI's (doctor checks their versions).
# Usage: bash scripts/inf2-host.sh && .venv-neuron/bin/python build.py doctor
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv-neuron}
pin() { sed -n "s/^$1: \"\([^\"]*\)\".*/\1/p" gemma4_port/manifests/toolchain.yaml; }
if ! command -v python3.11 >/dev/null; then
  sudo apt-get update -qq && sudo apt-get install -y -qq python3.11 python3.11-venv
fi
[ -x "$VENV/bin/python" ] || python3.11 -m venv "$VENV"
TORCH=$(pin torch_neuronx | cut -d. -f1-2).*  # torch-neuronx X.Y.* runs on torch X.Y
"$VENV/bin/pip" install -q -c constraints/neuron.txt --index-url https://download.pytorch.org/whl/cpu "torch==$TORCH"
"$VENV/bin/pip" install -q -c constraints/neuron.txt --extra-index-url https://pip.repos.neuron.amazonaws.com \
  "torch-neuronx==$(pin torch_neuronx)" "neuronx-cc==$(pin neuronx_cc)" "neuronx-distributed==$(pin neuronx_distributed)"
# The project, resolved around what the SDK installed (as in the image: the test pins may not agree
# with what neuronx-cc asks of numpy and the rest; doctor's versions.txt records the outcome).
"$VENV/bin/pip" install -q -c constraints/neuron.txt -e .
"$VENV/bin/python" build.py doctor --help >/dev/null
echo "ready: $VENV/bin/python build.py doctor"
