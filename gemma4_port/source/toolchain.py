"""The Neuron SDK release a manifest builds with, every component at its exact build, kept in one file."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from contract.typed import Frozen
from gemma4_port import MANIFESTS
from gemma4_port.source.manifest_yaml import read_mapping, validate

TOOLCHAIN = MANIFESTS / "toolchain.yaml"  # the toolchain a manifest without its own builds with
BUILD = r"^\d+(\.\d+){%d}$"  # a full build number: a release prefix would admit several SDKs


class Toolchain(Frozen):
    """One Neuron SDK release, every component at its exact build (the release's entry in aws-neuron-sdk
    src/helperscripts/n2-manifest.json): the wheels, the apt packages of the image, the oldest host
    driver (aws-neuronx-dkms) it runs on, and the neuronx-cc flags."""

    neuron_sdk: str
    torch_neuronx: str = Field(pattern=BUILD % 5, description="e.g. 2.8.0.2.12.22436 (torch 2.8.0, SDK build)")
    neuronx_cc: str = Field(pattern=BUILD % 3, description="e.g. 2.23.6484.0")
    neuronx_distributed: str = Field(pattern=BUILD % 2, description="e.g. 0.17.26814")
    neuron_runtime: str = Field(pattern=BUILD % 3, description="apt aws-neuronx-runtime-lib")
    neuron_collectives: str = Field(pattern=BUILD % 3, description="apt aws-neuronx-collectives")
    neuron_tools: str = Field(pattern=BUILD % 3, description="apt aws-neuronx-tools")
    neuron_driver: str = Field(pattern=BUILD % 3, description="the oldest host aws-neuronx-dkms the release supports")
    transformers: str = Field(pattern=r"^\d+(\.\d+)+((a|b|rc)\d+)?$", description="an exact release, e.g. 5.24.0")
    # NxD ModelBuilder's own defaults (model_builder.py append_default_compiler_flags), which NxD
    # Inference also passes for bf16 weights: --auto-cast=none keeps the float32 the graph asks for.
    compiler_args: tuple[str, ...] = (
        "--enable-saturate-infinity",
        "--auto-cast=none",
        "--model-type=transformer",
        "-O1",
    )


def load_toolchain(path: Path = TOOLCHAIN) -> Toolchain:
    """The toolchain every shipped manifest builds with, kept in one file."""
    return validate(Toolchain, read_mapping(path, "toolchain"), str(path))
