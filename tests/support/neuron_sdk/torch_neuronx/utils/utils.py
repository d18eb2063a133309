"""The platform detection NxD calls: `get_platform_target(compiler_args=None)`.

torch-neuronx's own source is not public, so only what is documented or reported is modelled:
- a `--target X` in the compiler flags names the platform: ModelBuilder passes each graph's flags
  (neuronx-distributed v2.28.0 trace/model_builder.py:608 and 646), and the SDK's error on a CPU host
  asks for that flag (quoted in huggingface/optimum-neuron PR #961);
- otherwise NEURON_PLATFORM_TARGET_OVERRIDE is the platform (aws-neuron-sdk v2.28.0
  nki/get-started/quickstart-implement-run-kernel.rst:242, nki/api/nki/__init__.py:14-16);
- otherwise the real package asks the instance, a closed path: the stand-in never has a device, so it
  raises the SDK's CPU-host error, as a build host without a NeuronCore would meet it.
"""

import os
import re

OVERRIDE = "NEURON_PLATFORM_TARGET_OVERRIDE"
# The platform names the SDK's CPU-host error lists (optimum-neuron PR #961).
SUPPORTED_TYPES = ("trn1", "inf2", "trn1n", "trn2")


def get_platform_target(compiler_args=None) -> str:
    flags = " ".join(compiler_args) if isinstance(compiler_args, (list, tuple)) else compiler_args or ""
    named = re.search(r"--target[= ](\S+)", flags)
    if named:
        return named.group(1)
    if os.environ.get(OVERRIDE):
        return os.environ[OVERRIDE]
    raise RuntimeError(
        "If you want to compile on CPU, please supply compiler argument target, with one of options "
        f'{", ".join(SUPPORTED_TYPES)}. Ex: "--target trn1" (stand-in: no Neuron device and no {OVERRIDE})'
    )
