"""What every client script shares (it runs in the client's own venv, so only the standard library
here): the server's address from argv, and named checks whose results are printed as one JSON line
(the test reads it) - a failing check does not stop the others."""

from __future__ import annotations

import json
import sys
import traceback

BASE_URL, MODEL = sys.argv[1], sys.argv[2]  # http://127.0.0.1:PORT/v1, the served model's name
EXTRA = sys.argv[3:]
SEEDS = (11, 12, 13)  # sampled (temperature > 0) checks run once per seed
TEMPERATURE = 0.9

_results: dict[str, str] = {}


def check(fn):
    """Run `fn` now as a named check: "ok", or the reason it failed."""
    try:
        fn()
        _results[fn.__name__] = "ok"
    except Exception as exc:  # noqa: BLE001 - the report names it; the other checks still run
        _results[fn.__name__] = f"{type(exc).__name__}: {exc}"[:2000]
        traceback.print_exc(file=sys.stderr)
    return fn


def report() -> None:
    print(json.dumps(_results))
    sys.exit(0 if all(v == "ok" for v in _results.values()) else 1)
