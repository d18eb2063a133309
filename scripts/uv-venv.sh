# Sourced by scripts/clients.sh and scripts/torch28.sh: one cached venv made with uv.
# uv (itself pip-installed once into a venv of its own) downloads and unpacks in parallel and skips
# compiling bytecode: a fresh litellm venv in under half a minute rather than minutes, the ~3 GB of
# torch 2.8 wheels in about two minutes rather than half an hour. Its wheel cache (~/.cache/uv, or
# UV_CACHE_DIR) stays, so a venv made again on the same machine links its files from there.
# Usage: uv_venv VENV [uv pip install args...]
#   Makes VENV with the machine's Python (PYTHON, default python3) and installs into it, once: a venv
#   is used only when its install finished (VENV/.complete), and concurrent callers wait on a lock.
UV_VERSION=0.13.9

uv_venv() {
  local venv=$1
  shift
  local cache py uv_home
  cache=$(dirname "$venv")
  py=${PYTHON:-python3}
  uv_home=$cache/uv-$UV_VERSION
  mkdir -p "$cache"
  if [ ! -x "$uv_home/bin/uv" ]; then
    (
      flock 9
      if [ ! -x "$uv_home/bin/uv" ]; then
        rm -rf "$uv_home"
        "$py" -m venv "$uv_home"
        "$uv_home/bin/pip" install -qq "uv==$UV_VERSION"
      fi
    ) 9>"$uv_home.lock" >&2
  fi
  if [ ! -e "$venv/.complete" ]; then
    (
      flock 9
      if [ ! -e "$venv/.complete" ]; then
        rm -rf "$venv"
        export UV_PYTHON_DOWNLOADS=never # the machine's Python, never a downloaded one
        "$uv_home/bin/uv" venv -q --python "$py" "$venv"
        "$uv_home/bin/uv" pip install -q --python "$venv/bin/python" "$@"
        touch "$venv/.complete"
      fi
    ) 9>"$venv.lock" >&2
  fi
}
