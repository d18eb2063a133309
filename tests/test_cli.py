"""gemma4_port/cli.py, the command line `python build.py` runs: every argument explains itself, the
README's command table lists every option of every command, and a user's mistake is one `error:`
line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import re

from gemma4_port import cli
from support import ROOT
from support.cli import build_py


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def arguments(command: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in command._actions if not isinstance(a, argparse._HelpAction)]


def test_every_argument_and_option_has_help():
    missing = [
        f"{name} {a.option_strings or a.dest}"
        for name, command in commands().items()
        for a in arguments(command)
        if not a.help or a.help == argparse.SUPPRESS
    ]
    assert not missing, missing


def test_the_readme_command_table_lists_every_option():
    readme = (ROOT / "README.md").read_text()
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `python build\.py ([\w-]+)(.*?)` \|", readme, re.M)}
    assert set(rows) == set(commands()), sorted(rows)
    missing = [
        f"{name} {opt}"
        for name, command in commands().items()
        for a in arguments(command)
        for opt in a.option_strings
        if opt.startswith("--") and opt not in rows[name]
    ]
    assert not missing, missing


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    r = build_py("compile", bad)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {bad}: ") and "Traceback" not in r.stderr
    r = build_py("verify", tmp_path)
    assert r.returncode == 2 and "artifact.json is missing" in r.stderr


def test_every_error_the_project_defines_derives_from_the_one_base():
    """build.py catches Gemma4Error alone: an error class outside it would reach the user as a traceback."""
    import importlib
    import inspect

    from contract.errors import Gemma4Error
    from support.sources import project_modules

    defined = []
    for name in project_modules():
        module = importlib.import_module(name)
        defined += [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Exception) and cls.__module__ == name
        ]
    assert len(defined) > 15  # the walk reached them
    assert [c.__qualname__ for c in defined if not issubclass(c, Gemma4Error)] == []
