"""What stops a benchmark in a way the user can fix (printed as one line by build.py)."""

from contract.errors import Gemma4Error


class BenchError(Gemma4Error, RuntimeError):
    pass
