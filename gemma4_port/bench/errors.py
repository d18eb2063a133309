"""What stops a benchmark in a way the user can fix (printed as one line by build.py)."""


class BenchError(RuntimeError):
    pass
