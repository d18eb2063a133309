"""NxD's hardware enum, as src/neuronx_distributed/utils/utils.py:6-27 at tag v2.28.0 defines it:
three fixed members, a fourth (CUSTOM) whose value is NEURON_PLATFORM_TARGET_OVERRIDE as it stood
when this module was imported, and a lookup that maps the instance names trn1, trn1n and inf2 to
TRN1 when no member has that value. So an override of "trn1" makes CUSTOM an alias of TRN1 (one
value, one member), while an override of "inf2" is CUSTOM's own value and resolves to CUSTOM, not TRN1;
an unknown name is a ValueError."""

import os
from enum import Enum

_INSTANCE_FAMILY = {"trn1": "trn1", "trn1n": "trn1", "inf2": "trn1", "trn2": "trn2", "trn3": "trn3"}


class hardware(Enum):  # NxD's name, lower case
    TRN1 = "trn1"
    TRN2 = "trn2"
    TRN3 = "trn3"
    CUSTOM = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")

    @classmethod
    def _missing_(cls, value):
        family = _INSTANCE_FAMILY.get(value)
        return cls(family) if family else None
