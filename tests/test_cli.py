"""build.py's command line: every argument explains itself, and the README's command table lists
every option of every command."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import build

ROOT = Path(__file__).resolve().parents[1]


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def arguments(command: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in command._actions if not isinstance(a, argparse._HelpAction)]


def test_every_argument_and_option_has_help():
    missing = [f"{name} {a.option_strings or a.dest}" for name, command in commands().items()
               for a in arguments(command) if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, missing


def test_the_readme_command_table_lists_every_option():
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `python build\.py (\w+)(.*?)` \|", (ROOT / "README.md").read_text(),
                                             re.M)}
    assert set(rows) == set(commands()), sorted(rows)
    missing = [f"{name} {opt}" for name, command in commands().items() for a in arguments(command)
               for opt in a.option_strings if opt.startswith("--") and opt not in rows[name]]
    assert not missing, missing
