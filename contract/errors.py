"""One base for every error this project raises on purpose: build.py prints any of them as one line."""


class Gemma4Error(Exception):
    """Something a user can act on, said in one line; each module raises its own subclass."""
