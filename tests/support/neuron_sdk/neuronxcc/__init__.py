"""CPU stand-in for neuronx-cc (tests only): its version is SDK 2.28's (n2-manifest.json). The
stand-in compiles nothing itself; NxD ModelBuilder's stand-in lowers graphs to TorchScript."""

__version__ = "2.23.6484.0"
