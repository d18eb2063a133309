"""Manifest to artifact: one pipeline, a graph builder per backend (CPU, CPU tensor parallel, NeuronCores)."""
