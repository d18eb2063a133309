"""build.py, the CLI: a user's mistake is one `error:` line and exit 2, never a traceback."""

from support.cli import build_py


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
        defined += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                    if issubclass(cls, Exception) and cls.__module__ == name]
    assert len(defined) > 15  # the walk reached them
    assert [c.__qualname__ for c in defined if not issubclass(c, Gemma4Error)] == []
