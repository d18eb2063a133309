"""gunicorn's threaded worker, with each request read by the main loop before a thread takes it.

gunicorn's `gthread` gives a connection a thread as soon as its first byte arrives and reads the
head and body there, blocking: 50 clients sending one header line every 2 s held all 48 threads
and `/health` timed out for as long as they stayed; idle connections held a thread for 5 s each;
and the graceful close of a `Connection: close` response blocked the main loop for up to 2 s.

Here, as in a front proxy, the main loop reads each request without blocking: the head within
HEADER_TIMEOUT_S of the connection (or of a kept-alive connection's next byte), then the body,
within BODY_TIMEOUT_S, as far as its framing says (Content-Length, or chunks up to the final one).
A request that is complete goes to a thread with its bytes; one that is late gets a 408, a chunked
body over the limit a 413 and broken chunk framing a 400, at once, from the main loop. Closing
lingers in the main loop too. Threads are only ever given to whole requests, so idle and slow
clients cost a socket each, never a thread: the engine thread and the request threads are
untouched. Plain HTTP/1.1 only (no TLS, no HTTP/2), which is what runtime/serve.py configures.

SIGTERM starts a drain, and the time a request's head ended decides its fate: every request whose
head arrived before it is served to the end (its body may still be uploading); every later one gets
a 503 with Retry-After from the main loop as soon as its head is in (probes excepted: /ready says
"draining"). Once nothing admitted is left, the connections already waiting in the listen backlog
get their 503 too and the listener closes, so a late client is refused at once, never reset later."""

from __future__ import annotations

import errno
import json
import select
import socket
import time
from functools import partial
from http import HTTPStatus
from selectors import EVENT_READ

from gunicorn.http import errors as perr
from gunicorn.http import get_parser
from gunicorn.workers.gthread import TConn, ThreadWorker

from runtime.api.errors import APIError
from runtime.api.state import OPEN_PATHS, server_state
from runtime.http.accesslog import redact

HEADER_TIMEOUT_S = 10.0  # connect (or a kept-alive connection's next byte) to the end of the head
BODY_TIMEOUT_S = 30.0  # end of the head to the end of the body (1 MiB at >= 35 kB/s)
LINGER_S = 2.0  # after our last byte, how long a closing connection may keep sending before it is cut
MAX_HEAD_BYTES = 64 * 1024  # beyond this gunicorn's own parser names the limit (414 / 431)
MAX_LINGERING = 1024
RECV_BYTES = 256 * 1024
READY = "ready"
RETRY_AFTER_S = 5  # what a client refused during the drain is told to wait (another replica is up by then)
BACKLOG_READ_S = 0.05  # at the listener's close: how long to wait for a backlogged request's bytes

# gunicorn's parse errors -> (status, code); the rest of its client errors are 400s.
STATUS = {
    perr.LimitRequestLine: (414, "uri_too_long"),
    perr.LimitRequestHeaders: (431, "headers_too_large"),
    perr.ExpectationFailed: (417, "expectation_failed"),
    perr.UnsupportedTransferCoding: (501, "unsupported_transfer_coding"),
}
CLIENT_ERRORS = (perr.ParseException, perr.NoMoreData)
APP_ERRORS = (perr.InvalidResponseHeader, perr.InvalidResponseHeaderName)  # headers the app tried to send


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


def wait_readable(sock, timeout: float) -> bool:
    poll = select.poll()  # not select(): descriptors above 1023 are normal with many clients
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(max(0.0, timeout) * 1000))


class DeadlineReader:
    """The socket as the request parser reads it in a thread: every read waits until the request's
    deadline at most (a body the main loop did not read whole: `Expect: 100-continue`, pipelining)."""

    def __init__(self, sock):
        self.sock = sock
        self.deadline = 0.0

    def recv(self, size: int) -> bytes:
        if not wait_readable(self.sock, self.deadline - time.monotonic()):
            raise TimeoutError(f"the request was not received within {BODY_TIMEOUT_S:.0f} s")
        return self.sock.recv(size)


class Conn(TConn):
    def __init__(self, cfg, sock, client, server, linger):
        super().__init__(cfg, sock, client, server)
        self.ahead: bytearray | None = None  # the request read so far by the main loop
        self.head_done = False  # its head has ended (so it is admitted, or refused if the drain had begun)
        self.deadline = 0.0
        self.reader = DeadlineReader(sock)
        self.linger = linger

    def close(self, graceful=False):
        if graceful:
            self.linger(self.sock)  # without blocking the main loop
        else:
            super().close()


class ReadAheadWorker(ThreadWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reading: set[Conn] = set()
        self.lingering: dict[socket.socket, float] = {}
        self.max_body = 1 << 20
        self.drain_deadline: float | None = None  # set by SIGTERM
        self.serving = 0  # requests handed to a thread and not finished

    def handle_exit(self, sig, frame):
        """SIGTERM: drain before gunicorn's own graceful stop. /ready turns 503 and requests whose head
        comes later get a 503 with Retry-After (so a load balancer and clients go elsewhere) while the
        admitted ones finish; then the backlog is answered and the listener closed (gthread stopped
        accepting at once: new connections waited in the backlog until the exit and were reset)."""
        if self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + max(1.0, self.cfg.graceful_timeout - LINGER_S - 5)
            server_state(self.wsgi).draining.set()
            self.method_queue.defer(lambda: None)  # wake the main loop, which runs the drain

    def _drain_step(self) -> None:
        """Once a turn while draining: done when no admitted request is being read or served."""
        engine = server_state(self.wsgi).engine
        admitted = self.serving or any(c.head_done for c in self.reading) or not engine.idle
        assert self.drain_deadline is not None  # only called while draining
        if admitted and time.monotonic() <= self.drain_deadline:
            return
        engine.drain()
        self._close_listeners()
        self.alive = False

    def _check_engine(self) -> None:
        """An engine that served and then died (or hangs in a device call) never comes back in this
        process: the worker exits, its requests in flight having failed, and gunicorn starts a new one
        (which loads the artifact again). One that never came up is left for /ready to report: a new
        worker would fail the same way, over and over."""
        engine = server_state(self.wsgi).engine
        problem = engine.problem()
        if problem is not None and engine.served:
            self.log.error("the engine cannot serve any more (%s): this worker exits for a new one", problem)
            self.alive = False

    def _close_listeners(self) -> None:
        """Answer every connection already in the listen backlog with the drain's 503, then close the
        listeners: from then on a client is refused by the kernel at once."""
        self.set_accept_enabled(False)
        for listener in self.sockets:
            while True:
                try:
                    sock, _ = listener.accept()
                except OSError:
                    break
                self._refuse_backlogged(sock)
            listener.close()

    def _refuse_backlogged(self, sock) -> None:
        """Read what the client sent (closing with unread input would reset the connection, the 503
        with it), answer, and linger; BACKLOG_READ_S at most, as the worker is about to exit."""
        try:
            sock.settimeout(BACKLOG_READ_S)
            sock.recv(RECV_BYTES)
            sock.sendall(DRAIN_REFUSAL)
        except OSError:
            pass
        self._linger(sock)

    def enqueue_req(self, conn):
        self.serving += 1
        super().enqueue_req(conn)

    def finish_request(self, conn, fs):
        self.serving -= 1
        super().finish_request(conn, fs)

    def load_wsgi(self):
        super().load_wsgi()
        self.max_body = self.wsgi.config.get("MAX_CONTENT_LENGTH") or self.max_body

    # -- reading, in the main loop ----------------------------------------------------------------
    def accept(self, listener):
        try:
            sock, client = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        self._read(Conn(self.cfg, sock, client, listener.getsockname(), self._linger))

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request: read like a new one."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._read(conn)
        self._on_readable(conn)

    def _read(self, conn: Conn) -> None:
        conn.ahead, conn.deadline, conn.head_done = bytearray(), time.monotonic() + HEADER_TIMEOUT_S, False
        conn.sock.setblocking(False)
        self.reading.add(conn)
        self.poller.register(conn.sock, EVENT_READ, partial(self._on_readable, conn))

    def _on_readable(self, conn: Conn, _sock=None) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client left
            self._stop_reading(conn)
            self.nr_conns -= 1
            conn.close()
            return
        conn.ahead += data
        if not conn.head_done and b"\r\n\r\n" in conn.ahead:
            if self.drain_deadline is not None and not is_probe(bytes(conn.ahead[:4096])):
                return self._refuse(conn, DRAIN_REFUSAL, "draining")
            conn.head_done, conn.deadline = True, time.monotonic() + BODY_TIMEOUT_S
        verdict = framing(bytes(conn.ahead), self.max_body)
        if verdict == READY:
            self._stop_reading(conn)
            self.enqueue_req(conn)
        elif isinstance(verdict, tuple):
            status, message = verdict
            code = "request_entity_too_large" if status == 413 else "invalid_chunked_body"
            self._refuse(conn, error_response(status, message, code), f"{status} {message}")

    def _stop_reading(self, conn: Conn) -> None:
        self.reading.discard(conn)
        self.poller.unregister(conn.sock)

    def _refuse(self, conn: Conn, response: bytes, why: str) -> None:
        self._stop_reading(conn)
        self.nr_conns -= 1
        self.log.debug("refused %s: %s", conn.client, why)
        try:
            conn.sock.send(response)
        except OSError:
            pass
        self._linger(conn.sock)

    def murder_pending(self):
        """Runs once per turn of the main loop (at least every second): expiries, the drain, and
        the engine's liveness."""
        super().murder_pending()
        if self.drain_deadline is not None and self.alive:
            self._drain_step()
        elif self.alive:
            self._check_engine()
        now = time.monotonic()
        for conn in [c for c in self.reading if c.deadline <= now or not (self.alive or c.ahead)]:
            if conn.ahead:
                what = "body" if b"\r\n\r\n" in conn.ahead else "head"
                limit = BODY_TIMEOUT_S if what == "body" else HEADER_TIMEOUT_S
                message = f"the request {what} was not received within {limit:.0f} s"
                self._refuse(conn, error_response(408, message, "request_timeout"), f"408 {message}")
            else:  # idle: nothing was sent
                self._stop_reading(conn)
                self.nr_conns -= 1
                conn.close()
        for sock in [s for s, deadline in self.lingering.items() if deadline <= now]:
            self._unlinger(sock)

    # -- closing, in the main loop ----------------------------------------------------------------
    def _linger(self, sock) -> None:
        """Close after the client has read our last bytes: FIN first, then drain what it still
        sends until it closes or LINGER_S pass (closing with unread input would send a reset)."""
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self.lingering) >= MAX_LINGERING:
            sock.close()
            return
        sock.setblocking(False)
        self.lingering[sock] = time.monotonic() + LINGER_S
        self.poller.register(sock, EVENT_READ, self._drain)

    def _drain(self, sock) -> None:
        try:
            if sock.recv(RECV_BYTES):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._unlinger(sock)

    def _unlinger(self, sock) -> None:
        del self.lingering[sock]
        self.poller.unregister(sock)
        sock.close()

    # -- in a thread ------------------------------------------------------------------------------
    def handle(self, conn: Conn):
        """Serve a request whose bytes the main loop read: the parser starts from them, and reads
        anything further from the socket only until the request's deadline."""
        if not conn.initialized:
            conn.initialized = True
            conn.sock.setblocking(True)
            conn.parser = get_parser(self.cfg, conn.reader, conn.client)
        if conn.ahead:
            conn.parser.unreader.unread(bytes(conn.ahead))
            conn.ahead = None
        conn.reader.deadline = time.monotonic() + BODY_TIMEOUT_S
        conn.data_ready = True
        return super().handle(conn)

    def handle_error(self, req, client, addr, exc):
        """gunicorn's own errors (a bad request line, 414, 431, 417 ...) as OpenAI JSON, not HTML."""
        status, code = next((v for k, v in STATUS.items() if isinstance(exc, k)), (400, "bad_request"))
        if isinstance(exc, CLIENT_ERRORS) and not isinstance(exc, APP_ERRORS):
            self.log.warning("invalid request from %s: %s", (addr or ("",))[0], redact(str(exc)))
            message = f"the HTTP request is malformed: {type(exc).__name__}: {exc}"
        else:
            self.log.exception("error handling a request")
            status, code, message = 500, "internal_error", f"internal error: {type(exc).__name__}"
        try:
            client.sendall(error_response(status, message, code))
        except OSError:
            pass
