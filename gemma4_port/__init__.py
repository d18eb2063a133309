"""Gemma-4 on Inferentia2: the device-graph port and its build tools."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: build.py, manifests/, images/, pyproject.toml
