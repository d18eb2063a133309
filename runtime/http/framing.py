"""What the worker's main loop reads of a request's bytes without parsing it: whether its framing says
it is complete (a thread may take it), still short, or to be answered at once (a chunked body over the
limit, broken chunk framing); and the responses the main loop sends itself, as OpenAI JSON.
gunicorn's parser stays the judge of everything else, in the thread."""

from __future__ import annotations

import json
from http import HTTPStatus

from runtime.api.openai_errors import APIError
from runtime.api.state import OPEN_PATHS

MAX_HEAD_BYTES = 64 * 1024  # beyond this gunicorn's own parser names the limit (414 / 431)
READY = "ready"
RETRY_AFTER_S = 5  # what a client refused during the drain is told to wait (another replica is up by then)


def _chunks(body: bytes, max_body: int) -> str | tuple[int, str] | None:
    """Walk a chunked body read so far: READY at its last chunk, None while it is short, or the
    error to answer: broken framing (400), more data than max_body (413), told by the size lines."""
    pos = total = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            return (
                None
                if len(body) - pos <= 4096
                else (400, "malformed chunked encoding: a chunk size line over 4096 bytes")
            )
        digits = body[pos:eol].split(b";", 1)[0].rstrip(b" \t")
        if not digits or digits.strip(b"0123456789abcdefABCDEF"):
            return (
                400,
                f"malformed chunked encoding: chunk size {digits[:32].decode('latin-1')!r} is not a hexadecimal number",
            )
        size = int(digits, 16)
        total += size
        if total > max_body:
            return 413, f"the chunked request body is larger than the limit of {max_body} bytes (GEMMA4_MAX_BODY_BYTES)"
        if size == 0:  # the last chunk, then optional trailer lines and an empty line
            rest = body[eol:]
            return READY if rest.startswith(b"\r\n\r\n") or b"\r\n\r\n" in rest else None
        end = eol + 2 + size
        if len(body) < end + 2:
            return None
        if body[end : end + 2] != b"\r\n":
            return 400, "malformed chunked encoding: a chunk's data is not followed by CRLF"
        pos = end + 2


def framing(buf: bytes, max_body: int) -> str | tuple[int, str] | None:
    """What the bytes read so far of one request say: None (wait for more), READY (a thread may
    take it: it is complete, or broken in a way gunicorn's parser names), or (status, message) to
    answer at once. Only the framing is read here; gunicorn's parser stays the judge of the rest."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return READY if len(buf) > MAX_HEAD_BYTES else None
    fields: dict[str, str] = {}
    for line in buf[:end].decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        fields[name] = f"{fields[name]},{value.strip()}" if name in fields else value.strip()
    if "100-continue" in fields.get("expect", "").lower():
        return READY  # the client waits for "100 Continue" (sent when the body is read) before the body
    body = buf[end + 4 :]
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return _chunks(body, max_body)
    length = fields.get("content-length", "")
    if not length.isdigit():
        return READY  # no body, or a bad length gunicorn refuses
    if int(length) > max_body:
        return READY  # refused (413) before the body is read
    return READY if len(body) >= int(length) else None


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> bytes:
    body = json.dumps(APIError(status, message, code=code).body()).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n{extra}"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


DRAIN_REFUSAL = error_response(
    503,
    "the server is shutting down: retry the request (another replica, or this one once restarted)",
    "draining",
    {"Retry-After": str(RETRY_AFTER_S)},
)


def is_probe(head: bytes) -> bool:
    """A GET of /health, /ready or /metrics: answered by the app even while draining."""
    method, _, rest = head.partition(b" ")
    path = rest.split(b" ", 1)[0].split(b"?", 1)[0].decode("latin-1")
    return method == b"GET" and path in OPEN_PATHS
