"""How the worker closes, in its main loop: every connection with a lingering close, and the whole
worker with a drain on SIGTERM.

SIGTERM starts a drain, and the time a request's head ended decides its fate: every request whose
head arrived before it is served to the end (its body may still be uploading); every later one gets
a 503 with Retry-After from the main loop as soon as its head is in (probes excepted: /ready says
"draining"). Once nothing admitted is left, the connections already waiting in the listen backlog
get their 503 too and the listener closes, so a late client is refused at once, never reset later.

An engine that dies after serving ends the worker too (gunicorn starts a new one)."""

from __future__ import annotations

import socket
import time
from selectors import EVENT_READ

from gunicorn.workers.gthread import ThreadWorker

from runtime.api.state import server_state
from runtime.http.framing import DRAIN_REFUSAL

LINGER_S = 2.0  # after our last byte, how long a closing connection may keep sending before it is cut
MAX_LINGERING = 1024
RECV_BYTES = 256 * 1024
BACKLOG_READ_S = 0.05  # at the listener's close: how long to wait for a backlogged request's bytes


class ClosingWorker(ThreadWorker):
    """gunicorn's threaded worker with a lingering close and a drain. A subclass that reads requests in
    the main loop says, by `reading_admitted`, whether one admitted before the drain is still arriving."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lingering: dict[socket.socket, float] = {}
        self.drain_deadline: float | None = None  # set by SIGTERM
        self.serving = 0  # requests handed to a thread and not finished

    def reading_admitted(self) -> bool:
        return False

    # -- the drain ----------------------------------------------------------------------------------
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
        admitted = self.serving or self.reading_admitted() or not engine.idle
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

    def murder_pending(self):
        """Runs once per turn of the main loop (at least every second): the drain, the engine's
        liveness, and the lingering closes that are due."""
        super().murder_pending()
        if self.drain_deadline is not None and self.alive:
            self._drain_step()
        elif self.alive:
            self._check_engine()
        now = time.monotonic()
        for sock in [s for s, deadline in self.lingering.items() if deadline <= now]:
            self._unlinger(sock)

    # -- a connection's close -----------------------------------------------------------------------
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
        self.poller.register(sock, EVENT_READ, self._read_lingering)

    def _read_lingering(self, sock) -> None:
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
