"""gunicorn's logger with credentials taken out of every line it writes: a key sent in the query
string (`?api_key=...`, as some clients do), and the headers that carry one, whatever the access
log's format names (the request line, the referer, `%({authorization}i)s`, the environ ...)."""

from __future__ import annotations

import re

from gunicorn.glogging import Logger

REDACTED = "[redacted]"
# A query parameter whose name says it is a secret, and its value up to the next separator.
SECRET_PARAM = re.compile(
    r"(?i)((?:^|[?&;])(?:[a-z0-9_.-]*[_-])?(?:api[_-]?key|key|token|secret|password|passwd|auth|signature|sig)=)[^&;#\s\"]*"
)
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})


def redact(text: str) -> str:
    """`text` with the value of every secret-named query parameter replaced."""
    return SECRET_PARAM.sub(rf"\1{REDACTED}", text)


def _secret_atom(name: str) -> bool:
    """An atom that is a credential header: `{authorization}i`, or its environ form `{http_authorization}e`."""
    if name.endswith("}i"):
        return name[1:-2] in SECRET_HEADERS
    if name.endswith("}e") and name.startswith("{http_"):
        return name[6:-2].replace("_", "-") in SECRET_HEADERS
    return False


class RedactingLogger(Logger):
    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        for name, value in atoms.items():
            if _secret_atom(name):
                atoms[name] = REDACTED
            elif isinstance(value, str):
                atoms[name] = redact(value)
        return atoms
