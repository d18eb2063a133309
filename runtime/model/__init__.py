"""The loaded model, as the server and `build.py verify` both use it: the artifact's graphs behind a
backend (cpu, cpu tp, neuron), the runner that feeds them, and the one way to load it all (loader).
The base image ships this subpackage for verify; the rest of runtime is the HTTP server."""
