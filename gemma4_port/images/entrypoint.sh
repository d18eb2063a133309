#!/usr/bin/env bash
# The Neuron images' entrypoint: `docker run --device /dev/neuron0 --ipc=host IMAGE doctor` (or compile,
# verify, plan, bench, serve DIR) runs that command of build.py; `serve` alone serves the artifact the
# slim image names (GEMMA4_ARTIFACT); anything else runs as given (the slim image's CMD among them).
set -euo pipefail
APP=${GEMMA4_APP:-/opt/gemma4}  # where the base image keeps build.py (a checkout, in the tests)
build_py() {
  # The slim image puts the whole server on PYTHONPATH (/app); the base's own copy of runtime/ holds only
  # the load path. PYTHONSAFEPATH keeps build.py's folder off the front of sys.path, so the slim's server
  # wins there, and every process doctor starts inherits the same path.
  export PYTHONSAFEPATH=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$APP"
  # The slim image's user has no home: artifacts, random checkpoints and reports go under /tmp unless
  # the caller points GEMMA4_INF2_CACHE (or doctor --work) at a mounted folder.
  export GEMMA4_INF2_CACHE="${GEMMA4_INF2_CACHE:-/tmp/gemma4-inf2}"
  exec python "$APP/build.py" "$@"
}
case "${1:-}" in
  doctor | compile | verify | plan | bench) build_py "$@" ;;
  serve)
    if [ $# -eq 1 ]; then
      export PYTHONSAFEPATH=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$APP"
      python -c "import runtime.serve" 2>/dev/null || {
        echo "serve: the server is in the slim images (the base holds the build tools only)" >&2
        exit 2
      }
      exec python -m runtime.serve
    fi
    build_py "$@"
    ;;
  "") build_py --help ;;
  *) exec "$@" ;;
esac
