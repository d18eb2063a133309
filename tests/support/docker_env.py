"""A real Docker engine and registry for the `docker`-marked tests.

Debian's `docker.io`, `docker-registry` and `debootstrap` are installed with apt if missing. dockerd
runs with its data, exec root, pidfile and socket in a temp dir and with every flag that would touch
the host's network turned off (no bridge, no iptables, no forwarding, no NAT), so containers run with
network "none" or "host" on loopback. The registry listens on 127.0.0.1 only. Both are stopped by pid.
The engine's image store is kept in the image cache (GEMMA4_INF2_IMAGE_CACHE, like the wheelhouse
and the Debian rootfs), so a rerun's builds hit the layer cache; delete it to build from nothing.

Test modules import the fixtures: `from support.docker_env import docker_engine, registry`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from gemma4_port.bench.server import free_port

PACKAGES = {"dockerd": "docker.io", "docker-registry": "docker-registry", "debootstrap": "debootstrap"}


def ensure_installed() -> None:
    missing = [pkg for exe, pkg in PACKAGES.items() if shutil.which(exe) is None]
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        check=True,
        env=env,
        capture_output=True,
    )


def _wait_up(probe, not_yet: type[Exception], proc: subprocess.Popen, timeout: float, failed) -> None:
    """Call `probe` until it stops raising `not_yet`; if the process exits or `timeout` seconds pass
    first, raise the error `failed()` makes (it stops what was started)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe()
            return
        except not_yet:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise failed() from None
            time.sleep(0.2)


def _stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Engine:
    root: Path
    proc: subprocess.Popen

    @property
    def host(self) -> str:
        return f"unix://{self.root}/docker.sock"

    @classmethod
    def start(cls, root: Path, data: Path | None = None) -> Engine:
        """dockerd with its socket and exec root under `root`, images in `data` (default: under root)."""
        data = data or root / "data"
        log = open(root / "dockerd.log", "wb")
        proc = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(data),
                "--exec-root",
                f"{root}/exec",
                "--pidfile",
                f"{root}/pid",
                "-H",
                f"unix://{root}/docker.sock",
                "--storage-driver=overlay2",
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
                "--bridge=none",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        engine = cls(root, proc)
        import docker

        def failed() -> Exception:
            tail = (root / "dockerd.log").read_text(errors="replace").strip().splitlines()[-3:]
            engine.stop()
            return RuntimeError(f"dockerd did not start: {' | '.join(tail)}")

        _wait_up(lambda: docker.DockerClient(base_url=engine.host, version="auto").ping(), Exception, proc, 60, failed)
        return engine

    def stop(self) -> None:
        _stop(self.proc)
        # dockerd leaves its default network namespace mounted under the exec root.
        netns = self.root / "exec" / "netns" / "default"
        if os.path.ismount(netns):
            subprocess.run(["umount", str(netns)], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)  # socket, exec root, log, and a throwaway image store


@dataclass
class Registry:
    root: Path
    port: int
    proc: subprocess.Popen

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def storage(self) -> Path:
        return self.root / "storage"

    def stored_bytes(self) -> int:
        """Bytes of blob data the registry holds on disk (layers, configs, manifests)."""
        return sum(p.stat().st_size for p in self.storage.rglob("data") if p.is_file())

    @classmethod
    def start(cls, root: Path) -> Registry:
        port = free_port()
        (root / "storage").mkdir(parents=True, exist_ok=True)
        (root / "config.yml").write_text(
            "version: 0.1\n"
            f"storage: {{filesystem: {{rootdirectory: {root}/storage}}}}\n"
            f"http: {{addr: 127.0.0.1:{port}}}\n"
            "log: {level: warn}\n"
        )
        log = open(root / "registry.log", "wb")
        proc = subprocess.Popen(
            ["docker-registry", "serve", str(root / "config.yml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        registry = cls(root, port, proc)

        def failed() -> Exception:
            registry.stop()
            return RuntimeError(f"docker-registry did not start: see {root}/registry.log")

        _wait_up(
            lambda: requests.get(f"http://{registry.address}/v2/", timeout=2).raise_for_status(),
            requests.RequestException,
            proc,
            30,
            failed,
        )
        return registry

    def stop(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.storage, ignore_errors=True)  # the pushed images: hundreds of MB


def _data_root(stack: ExitStack) -> Path | None:
    """The engine's image store, kept between sessions in the image cache so a rerun reuses the built
    layers (the classic builder's cache); None (a throwaway store) while another session holds it."""
    cache = Path(os.environ.get("GEMMA4_INF2_IMAGE_CACHE", Path.home() / ".cache" / "gemma4-inf2" / "images"))
    (cache / "engine").mkdir(parents=True, exist_ok=True)
    lock = stack.enter_context(open(cache / "engine" / "lock", "w"))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # two dockerds must never share a data root
    except BlockingIOError:
        return None
    return cache / "engine" / "data"


@pytest.fixture(scope="session")
def docker_engine():
    """A private dockerd; DOCKER_HOST points at it for the session (SDK and subprocesses alike)."""
    ensure_installed()
    # The socket path must stay short (108 bytes), so not under pytest's deep tmp tree.
    stack = ExitStack()
    root = Path(tempfile.mkdtemp(prefix="g4d-"))
    engine = Engine.start(root, _data_root(stack))
    old = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = engine.host
    try:
        yield engine
    finally:
        if old is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = old
        engine.stop()
        stack.close()


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    ensure_installed()
    reg = Registry.start(tmp_path_factory.mktemp("registry"))
    try:
        yield reg
    finally:
        reg.stop()
