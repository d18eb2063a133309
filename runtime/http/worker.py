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

SIGTERM drains the worker and every close lingers: `closing.py`. The framing rules the main loop reads
by are pure: `framing.py`."""

from __future__ import annotations

import errno
import select
import time
from functools import partial
from selectors import EVENT_READ

from gunicorn.http import errors as perr
from gunicorn.http import get_parser
from gunicorn.workers.gthread import TConn

from runtime.http.accesslog import redact
from runtime.http.closing import RECV_BYTES, ClosingWorker
from runtime.http.framing import DRAIN_REFUSAL, READY, error_response, framing, is_probe

HEADER_TIMEOUT_S = 10.0  # connect (or a kept-alive connection's next byte) to the end of the head
BODY_TIMEOUT_S = 30.0  # end of the head to the end of the body (1 MiB at >= 35 kB/s)

# gunicorn's parse errors -> (status, code); the rest of its client errors are 400s.
STATUS = {
    perr.LimitRequestLine: (414, "uri_too_long"),
    perr.LimitRequestHeaders: (431, "headers_too_large"),
    perr.ExpectationFailed: (417, "expectation_failed"),
    perr.UnsupportedTransferCoding: (501, "unsupported_transfer_coding"),
}
CLIENT_ERRORS = (perr.ParseException, perr.NoMoreData)
APP_ERRORS = (perr.InvalidResponseHeader, perr.InvalidResponseHeaderName)  # headers the app tried to send


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


class ReadAheadWorker(ClosingWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reading: set[Conn] = set()
        self.max_body = 1 << 20

    def reading_admitted(self) -> bool:
        return any(c.head_done for c in self.reading)

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
        """Once per turn of the main loop, after the drain and the lingering closes: the requests
        being read that are late (or idle, or cut off by the worker's exit)."""
        super().murder_pending()
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
