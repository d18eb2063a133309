#!/usr/bin/env bash
# The whole test suite, from a fresh machine: Debian packages for the image tests, the venv, the lint
# lane (ruff, mypy), the torch 2.8 lane (scripts/torch28.sh), pytest.
# Extra arguments go to pytest (e.g. `-m "not docker"`, `-k verify`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
need=()
for pkg in docker.io docker-registry debootstrap; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "note: ${need[*]} missing and not root: the docker-marked tests will be skipped" >&2
  fi
fi
bash scripts/setup.sh
bash scripts/lint.sh  # the fast lane (seconds) fails the run before the long suite starts
# The torch 2.8 lane (the torch the Neuron image runs, in a cached venv of its own; TORCH28_LANE=0 skips
# it): a failure there fails the run, after the suite has run too.
lane=0
if [ "${TORCH28_LANE:-1}" != 0 ]; then
  bash scripts/torch28.sh || lane=$?
fi
suite=0
.venv/bin/python -m pytest -m "not neuron" --durations=15 "$@" || suite=$?
if [ "$lane" != 0 ]; then
  echo "test.sh: the torch 2.8 lane failed (exit $lane): bash scripts/torch28.sh" >&2
fi
exit $((suite != 0 ? suite : lane))
