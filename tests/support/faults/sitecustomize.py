"""A device fault the tests control, for a server started with this folder on PYTHONPATH (Python
imports `sitecustomize` at startup): with GEMMA4_TEST_FAULT_PROMPT set to comma-separated token ids,
the model runner's batched decode step raises whenever a slot decoding in it began its prompt with
those ids, as a device whose decode call fails would. The engine treats a failed decode step as its
own death (the state of every slot is unknown), so this is how a test kills the real engine thread
in the real gunicorn worker. Nothing of it is in the product: it patches the runner as it is imported."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

MARK = [int(t) for t in os.environ.get("GEMMA4_TEST_FAULT_PROMPT", "").split(",") if t]
TARGET = "runtime.model.runner"


class InjectedFault(RuntimeError):
    pass


def _arm(runner_class) -> None:
    decode = runner_class.decode

    def faulty(self, tokens):
        if any(self.slots[slot].tokens[: len(MARK)] == MARK for slot in tokens):
            raise InjectedFault("the test's injected device fault")
        return decode(self, tokens)

    runner_class.decode = faulty


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_arm(module):
            exec_module(module)
            _arm(module.ModelRunner)

        spec.loader.exec_module = exec_and_arm
        return spec


if MARK:
    sys.meta_path.insert(0, _Finder())
