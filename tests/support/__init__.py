"""Helpers the tests share (imported as `support.x`; tests/ is on sys.path through conftest.py):
engines (a running engine), artifact_copies (compiled artifacts with one thing planted),
docker_env (a real Docker engine and registry for the docker-marked tests)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
MANIFESTS = ROOT / "gemma4_port" / "manifests"
GOLDEN = ROOT / "tests" / "golden"  # reference files the tests compare against
