"""A request's own chat template rendered in a process of its own, which is killed at the deadline.

Such a template (only accepted with GEMMA4_TRUST_REQUEST_CHAT_TEMPLATE) is code the operator did not
write. In transformers' sandbox it cannot reach Python's internals, but it can loop for as long as it
likes without writing a character (nested `range`s), or build gigabytes in one expression (`'x' * n`),
and no check between output chunks sees either. So it runs in a child process (`python -m
runtime.api.template_sandbox`) that imports only transformers' templating, caps its own address space
(GEMMA4_REQUEST_TEMPLATE_MAX_MEMORY), renders as runtime.api.templating does, and answers one JSON line
per render. The server waits for the answer until the render's deadline, then kills the process: the
work stops with it, and a fresh process takes its place for the next render. JSON both ways (never
pickle): what comes back is text, whatever the template did."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import time

from contract.errors import Gemma4Error
from runtime.api.template_render import RenderTooLong, render
from runtime.bounded import Late

REPLY_BYTES_PER_CHAR = 12  # ASCII JSON writes a character in at most 12 bytes (a surrogate pair)
READ_BYTES = 1 << 16
STARTUP_S = 30.0  # the process imports transformers' templating before it says it is up
CHILD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # numpy's pools


class SandboxFailed(Gemma4Error, ValueError):
    """The request's template failed in its process; the message says how (for the client)."""


class Sandbox:
    """One child process, rendering one template at a time."""

    def __init__(self, memory_bytes: int):
        self.memory_bytes = memory_bytes
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONPROFILE")} | CHILD_ENV
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(memory_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self._started = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]

    def started(self) -> None:
        """Wait for the process to say it is up (its imports take a second or two), STARTUP_S at most."""
        if self._started:
            return
        if self._exchange(b"", time.monotonic() + STARTUP_S, 64) is None:
            self.kill()
            raise SandboxFailed(f"the process for the request's chat template did not start within {STARTUP_S:g} s")
        self._started = True

    def render(self, source: str, context: dict, timeout_s: float, max_chars: int) -> str:
        """The text the template writes within `timeout_s` of the process being up; Late past it (the
        process killed), RenderTooLong, or SandboxFailed (the template raised, ran out of memory, or
        the process died)."""
        self.started()
        deadline = time.monotonic() + timeout_s
        request = {"source": source, "context": context, "deadline": deadline, "max_chars": max_chars}
        reply = self._exchange(json.dumps(request).encode() + b"\n", deadline, max_chars * REPLY_BYTES_PER_CHAR + 1024)
        if reply is None:
            self.kill()
            raise Late("the request's chat template did not finish by its deadline")
        answer = json.loads(reply)
        kind = answer.get("error")
        if kind is None and isinstance(answer.get("text"), str):
            return answer["text"]
        if kind == "late":
            raise Late("the request's chat template did not finish by its deadline")
        if kind == "too_long":
            raise RenderTooLong(int(answer["chars"]), max_chars)
        if kind == "memory":  # the allocation that failed was undone: the process serves on
            raise SandboxFailed(
                f"the request's chat template needed more than {self.memory_bytes} bytes of memory "
                "(GEMMA4_REQUEST_TEMPLATE_MAX_MEMORY)"
            )
        raise SandboxFailed(f"the request's chat template failed: {str(answer.get('message', kind))[:300]}")

    def _exchange(self, data: bytes, deadline: float, most: int) -> bytes | None:
        """Write `data` and read one line back, both by `deadline`; None if it passed."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        os.set_blocking(stdin.fileno(), False)
        got = bytearray()
        while not got.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, writable, _ = select.select([stdout], [stdin] if data else [], [], left)
            if writable:
                try:
                    data = data[os.write(stdin.fileno(), data[:READ_BYTES]) :]
                except BlockingIOError:
                    pass
                except OSError:
                    raise SandboxFailed("the request's chat template's process ended") from None
            if readable:
                chunk = os.read(stdout.fileno(), READ_BYTES)
                if not chunk:
                    raise SandboxFailed("the request's chat template's process ended")
                got += chunk
                if len(got) > most:
                    raise SandboxFailed("the request's chat template's process answered more than it may")
        return bytes(got)


class Sandboxes:
    """Idle child processes, one taken per render (a render thread's at a time); a killed one is
    replaced at once, so the next render finds one that has already started."""

    def __init__(self, memory_bytes: int, start: int = 0):
        """`start`: processes started now, so that the first renders need not wait for one."""
        self.memory_bytes = memory_bytes
        self._idle: queue.SimpleQueue[Sandbox] = queue.SimpleQueue()
        for _ in range(start):
            self._idle.put(Sandbox(memory_bytes))

    def _take(self) -> Sandbox:
        while True:
            try:
                sandbox = self._idle.get_nowait()
            except queue.Empty:
                return Sandbox(self.memory_bytes)
            if sandbox.alive():
                return sandbox
            sandbox.kill()

    def render(self, call, timeout_s: float, max_chars: int) -> str:
        sandbox = self._take()
        try:
            return sandbox.render(call.source, call.context, timeout_s, max_chars)
        finally:
            if not sandbox.alive():
                sandbox.kill()  # reaped
                sandbox = Sandbox(self.memory_bytes)  # starting now, ready for the next render
            self._idle.put(sandbox)

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return


def _answer(request: dict) -> dict:
    from jinja2 import TemplateError

    try:
        return {"text": render(request["source"], request["context"], request["deadline"], request["max_chars"])}
    except Late:
        return {"error": "late"}
    except RenderTooLong as exc:
        return {"error": "too_long", "chars": exc.chars}
    except MemoryError:
        return {"error": "memory"}
    except RecursionError:
        return {"error": "failed", "message": "it nests too deeply (Python's recursion limit)"}
    except TemplateError as exc:
        return {"error": "failed", "message": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - the template's own fault, told to the client by type
        return {"error": "failed", "message": type(exc).__name__}


def main(memory_bytes: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    sys.stdout.buffer.write(b'{"up": true}\n')
    sys.stdout.buffer.flush()
    for line in sys.stdin.buffer:
        reply = _answer(json.loads(line))
        sys.stdout.buffer.write(json.dumps(reply).encode() + b"\n")  # ASCII: a lone surrogate survives
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]))
