"""A group of rank processes joined by torch.distributed (gloo, loopback), and the all-reduce that
the traced tensor-parallel graphs record: the CPU tp compile traces in such a group, the CPU tp
backend serves from one.

A call goes to every rank and returns every rank's answer; a rank that raises, dies or stalls fails
the whole group, since its peers would otherwise wait forever in an all-reduce.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from contract.errors import Gemma4Error

# Loading a rank's graphs, or one prefill, that takes longer than this means a rank is stuck.
CALL_TIMEOUT_S = 600.0
LOOPBACK = "127.0.0.1"

# torch.jit.trace cannot record `_c10d_functional.all_reduce` (its group argument is typed `Any`);
# this one-op library gives the same kernel a schema the tracer records and a saved graph replays.
_LIB = torch.library.Library("gemma4_tp", "DEF")
_LIB.define("all_reduce(Tensor x, str group_name) -> Tensor")


@torch.library.impl(_LIB, "all_reduce", "CPU")
def _all_reduce_cpu(x: torch.Tensor, group_name: str) -> torch.Tensor:
    out = torch.ops._c10d_functional.all_reduce(x, "sum", group_name)
    return torch.ops._c10d_functional.wait_tensor(out)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over all ranks of the default group: the decoder's `reduce` hook under tp > 1."""
    world = dist.group.WORLD
    assert world is not None, "all_reduce outside the rank group (init_process_group first)"
    return torch.ops.gemma4_tp.all_reduce(x, world.group_name)


class TensorParallelError(Gemma4Error, RuntimeError):
    pass


def _send(conn, message) -> None:
    """Tensors travel by value. Connection.send would pickle them with torch's multiprocessing
    reductions, which move each tensor's storage into shared memory in place, on the sender: a
    host table sent as a view would move under the numpy views that gather from it."""
    conn.send_bytes(pickle.dumps(message))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


def _rank_main(rank: int, tp: int, port: int, conn, factory, args: tuple, timeout: float) -> None:
    """A rank process: join the gloo group, build the actor, answer calls until told to stop."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # ranks talk over loopback only, whatever the hostname resolves to
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))  # the ranks share the machine's cores
    torch.set_grad_enabled(False)
    try:
        store = dist.TCPStore(LOOPBACK, port, is_master=False, timeout=timedelta(seconds=timeout))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=tp, timeout=timedelta(seconds=timeout))
        actor = factory(rank, tp, *args)
        _send(conn, ("ok", None))
        while True:
            try:
                method, call_args = _recv(conn)
            except EOFError:  # the driver is gone
                return
            if method is None:
                return
            _send(conn, ("ok", getattr(actor, method)(*call_args)))
    except Exception as exc:  # noqa: BLE001 - whatever a rank raises goes back to the driver, which raises it
        traceback.print_exc()
        _send(conn, ("error", f"{type(exc).__name__}: {exc}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class RankGroup:
    """`tp` spawned processes in one gloo group, each running the actor `factory(rank, tp, *args)`.

    A call goes to every rank and returns every rank's answer. A rank that raises, dies or stalls
    fails the whole group with a TensorParallelError: its peers would otherwise wait forever in an
    all-reduce, so the group shuts down rather than limp on.
    """

    def __init__(self, tp: int, factory, args: tuple = (), timeout: float = CALL_TIMEOUT_S):
        self.tp, self.timeout = tp, timeout
        ctx = mp.get_context("spawn")
        # The driver hosts the rendezvous store on a free loopback port: no port to pick, no race.
        self._store: dist.TCPStore | None = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
        self._conns, self._procs = [], []
        for rank in range(tp):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_rank_main,
                name=f"gemma4-tp-rank{rank}",
                daemon=True,
                args=(rank, tp, self._store.port, child, factory, args, timeout),
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._gather("start-up")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]  # started: each has one

    def call(self, method: str, *args) -> list:
        if not self._procs:
            raise TensorParallelError(f"cannot call {method}: the tensor-parallel ranks are shut down")
        for rank, conn in enumerate(self._conns):
            try:
                _send(conn, (method, args))
            except OSError:  # a broken pipe: the process is gone
                self._fail(self._died(rank, method))
        return self._gather(method)

    def _gather(self, what: str) -> list:
        replies: list = [None] * self.tp
        pending = dict(enumerate(self._conns))
        deadline = time.monotonic() + self.timeout
        while pending:
            ready = wait(
                [*pending.values(), *(self._procs[r].sentinel for r in pending)],
                timeout=max(0.0, deadline - time.monotonic()),
            )
            if not ready:
                self._fail(f"tp rank(s) {sorted(pending)} did not finish {what} within {self.timeout:g} s")
            died, failed = [], []
            for rank, conn in list(pending.items()):
                if conn.poll():
                    try:
                        status, value = _recv(conn)
                    except (EOFError, OSError):  # closed or reset without an answer: the process died
                        died.append(rank)
                        continue
                    if status == "error":
                        failed.append(f"tp rank {rank} failed during {what}: {value}")
                    else:
                        replies[rank] = value
                        del pending[rank]
                elif self._procs[rank].sentinel in ready:
                    died.append(rank)
            # A dead rank is the cause; its peers' errors (a broken all-reduce) are the consequence.
            if died:
                self._fail(self._died(died[0], what))
            if failed:
                self._fail(failed[0])
        return replies

    def _died(self, rank: int, what: str) -> str:
        proc = self._procs[rank]
        proc.join(1)
        return f"tp rank {rank} (pid {proc.pid}) died during {what} with exit code {proc.exitcode}"

    def _fail(self, message: str):
        self.close(grace_s=0)  # a broken group cannot finish its calls: no point waiting for it
        raise TensorParallelError(message)

    def close(self, grace_s: float = 10) -> None:
        """Ask every rank to stop, wait up to `grace_s`, then terminate whatever is left. Idempotent."""
        for conn, proc in zip(self._conns, self._procs):
            if proc.is_alive():
                try:
                    _send(conn, (None, ()))
                except OSError:
                    pass
        for proc in self._procs:
            proc.join(grace_s)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs, self._store = [], [], None
