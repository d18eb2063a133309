"""CPU stand-in for the part of torch-neuronx that this project calls. Tests put this folder on
PYTHONPATH; it is never installed. Its version is SDK 2.28's build (aws-neuron-sdk
src/helperscripts/n2-manifest.json, releases 2.28.0 and 2.28.1).

Importing it registers the stand-in NeuronCore runtime (the ops a saved NxD model calls), as
importing the real package registers `torch.classes.neuron` before `torch.jit.load` can read a
Neuron model. `torch_neuronx.trace` is not here: the project compiles through NxD ModelBuilder only.
"""

from ._runtime import visible_cores  # noqa: F401

__version__ = "2.8.0.2.12.22436"
