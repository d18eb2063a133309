"""Gemma-4 on Inferentia2: the device-graph port and its build tools."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: build.py, pyproject.toml
MANIFESTS = Path(__file__).resolve().parent / "manifests"  # the shipped manifests (package data)
