"""Gemma-4 on Inferentia2: the device-graph port and its build tools."""
