"""Which Neuron platform a compile targets when the build host has no NeuronCore.

The `--target inf2` compiler flag reaches only neuronx-cc. NxD asks the platform a second time with
no flags: `initialize_model_parallel` sets its hardware type from `get_platform_target()`
(neuronx-distributed v2.28.0 parallel_layers/parallel_state.py:558-560), and ModelBuilder calls it
from both trace and shard_checkpoint (trace/model_builder.py:554, 816). That detection asks the
instance; on a host without a Neuron device (any x86 build machine, or `docker build` on an inf2
instance, where no --device is passed) it fails unless NEURON_PLATFORM_TARGET_OVERRIDE names the
platform (huggingface/optimum-neuron PR #961 quotes the error).

The value for Inferentia2 is "trn1": the SDK docs say so (aws-neuron-sdk v2.28.0
nki/get-started/quickstart-implement-run-kernel.rst:242, "For Trn1 and Inf2, specify trn1"), and
NxD's hardware enum takes the override as the value of a member of its own, read at import
(utils/utils.py:6-27): "trn1" makes that member an alias of hardware.TRN1, while "inf2" would resolve
to hardware.CUSTOM, which NxD's TRN1 branches (parallel_state.py:594, modules/qkv_linear.py:84) do
not take.

Set only when the host has no device: where one is present the SDK asks it, and nothing here
overrides the machine's own answer. A value the user set is kept as it is.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Mapping, MutableMapping

OVERRIDE = "NEURON_PLATFORM_TARGET_OVERRIDE"
INF2 = "trn1"  # the override's value for Inferentia2 (see above)
log = logging.getLogger(__name__)


def neuron_devices() -> list[str]:
    """The Neuron devices this process sees (/dev/neuron0 ...; a container sees those passed with --device)."""
    return sorted(glob.glob("/dev/neuron[0-9]*"))


def platform_override(env: Mapping[str, str], devices: list[str]) -> dict[str, str]:
    """The environment a compile needs on top of `env`: the Inf2 override when no device answers and
    none is set, else nothing."""
    if devices or env.get(OVERRIDE):
        return {}
    return {OVERRIDE: INF2}


def pin_platform(env: MutableMapping[str, str] | None = None, devices: list[str] | None = None) -> dict[str, str]:
    """Apply platform_override to `env` (the process environment by default). Call it before the SDK
    is imported: NxD reads the override once, at import. Returns what it set."""
    env = os.environ if env is None else env
    devices = neuron_devices() if devices is None else devices
    if env.get(OVERRIDE) == "inf2":
        log.warning(
            "%s=inf2: NxD resolves it to hardware.CUSTOM, not TRN1 (neuronx-distributed utils/utils.py); "
            "the SDK's value for Inferentia2 is trn1",
            OVERRIDE,
        )
    added = platform_override(env, devices)
    env.update(added)
    if added:
        log.info("no Neuron device on this host: %s=%s for the compile (Inferentia2)", OVERRIDE, INF2)
    return added
