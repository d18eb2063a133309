"""The only module that talks to the Docker engine (the docker SDK, classic builder): make the local OS image
(from os_rootfs's Debian tarball), build with streamed logs, smoke-test a server image, push with per-layer
progress (the bytes sent, from what the registry says of the layers).

Every daemon or registry failure comes back as one `ImageError` line naming the step that failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import requests
from docker.errors import APIError, ContainerError, DockerException, ImageNotFound, NotFound
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

from gemma4_port.images.os_rootfs import debian_rootfs
from gemma4_port.images.registry import layer_sizes
from gemma4_port.images.spec import DEFAULT_OS_IMAGE, ImageError, ImageSpec

OS_PYTHON = sys.version_info[:2]  # the wheelhouse is made by this interpreter's pip, for its own version


@dataclass(frozen=True)
class Built:
    ref: str
    image_id: str
    size: int  # bytes, uncompressed
    seconds: float


@dataclass(frozen=True)
class Pushed:
    ref: str
    digest: str
    uploaded: int  # layers the registry did not have
    reused: int  # layers it had already (same digest): not sent again
    bytes_pushed: int | None  # compressed bytes of the uploaded layers (None: the registry would not say)
    seconds: float


def _reason(exc: BaseException) -> str:
    """The innermost useful sentence of a docker / requests error, on one line."""
    text = getattr(exc, "explanation", None) or str(exc)
    return " ".join(str(text).split())


@contextmanager
def _step(step: str):
    """Daemon errors inside a step become one line that names it."""
    try:
        yield
    except ImageError:
        raise
    except (DockerException, requests.RequestException) as exc:
        raise ImageError(f"{step}: {_reason(exc)}") from None


class Driver:
    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        try:
            self.client = docker.from_env()
            self.client.ping()
        except DockerException as exc:
            raise ImageError(
                f"connect: cannot reach the Docker daemon at {host} ({_reason(exc)}); "
                "start dockerd or point DOCKER_HOST at it"
            ) from None

    # ------------------------------------------------------------------------------------ OS image

    def ensure_os_image(self, tag: str, cache: Path) -> None:
        """The image the cpu base starts FROM; the default one is made here without any registry. An
        image that is there already is checked before it is trusted (a stale or foreign tag failed
        deep in the build with "returned a non-zero code: 127")."""
        with _step(f"prepare OS image {tag}"):
            try:
                self.client.images.get(tag)
            except ImageNotFound:
                if tag != DEFAULT_OS_IMAGE["cpu"]:
                    raise ImageError(
                        f"prepare OS image: {tag} is not in the Docker engine and this machine cannot "
                        f"pull it; load it first or leave --base-image at {DEFAULT_OS_IMAGE['cpu']}"
                    ) from None
                tarball = debian_rootfs(cache, self.console)
                repository, _, version = tag.partition(":")
                with self.console.status(f"importing {tarball.name} as {tag}"):
                    self.client.api.import_image_from_file(
                        str(tarball), repository=repository, tag=version, changes=["ENV LANG=C.UTF-8"]
                    )
            lacks = self._lacks(tag)
        if lacks:
            fix = (
                f"remove it (docker rmi {tag}) and it is made again"
                if tag == DEFAULT_OS_IMAGE["cpu"]
                else f"use an image with Debian bookworm's python3 and python3-venv, or leave --base-image at "
                f"{DEFAULT_OS_IMAGE['cpu']}"
            )
            raise ImageError(
                f"prepare OS image: {tag} {lacks}: the cpu base makes a Python {OS_PYTHON} venv "
                f"there for the wheelhouse; {fix}"
            )

    def _lacks(self, tag: str) -> str | None:
        """What the OS image lacks for the cpu base (python3 at OS_PYTHON with venv), or None."""
        want = ".".join(map(str, OS_PYTHON))
        probe = "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])"
        try:
            out = self.client.containers.run(tag, ["python3", "-c", probe], network_mode="none", remove=True)
        except ContainerError as exc:
            if exc.exit_status == 127 or "executable file not found" in str(exc):
                return "has no python3"
            return f"has python3 without the venv module (python3 said: {_reason(exc)})"
        except APIError as exc:
            if "executable file not found" in str(exc) or "no such file" in str(exc).lower():
                return "has no python3"
            raise
        got = out.decode().strip()
        return None if got == want else f"has Python {got}, not {want}"

    # --------------------------------------------------------------------------------------- build

    def build(self, spec: ImageSpec, context: Path, network: str | None) -> Built:
        """Build one image from a staged context (Dockerfile inside); the classic builder's cache reuses
        every unchanged step. Logs stream to the console."""
        step = f"build {spec.kind} ({spec.ref})"
        start = time.monotonic()
        image_id = None
        with _step(step), self.console.status(f"building {spec.kind}") as status:
            for event in self.client.api.build(
                path=str(context), tag=spec.ref, rm=True, forcerm=True, decode=True, network_mode=network
            ):
                if "error" in event:
                    raise ImageError(f"{step}: {_reason(Exception(event['error']))}")
                line = event.get("stream", "").rstrip()
                if line.startswith("Step "):
                    status.update(f"building {spec.kind}: {line}")
                    self.console.print(f"[bold]{line}[/]", highlight=False)
                elif line:
                    self.console.print(f"  {line}", style="dim", highlight=False, markup=False)
                image_id = event.get("aux", {}).get("ID", image_id)
            if image_id is None:
                raise ImageError(f"{step}: the daemon finished without an image id")
            size = self.client.images.get(image_id).attrs["Size"]
        return Built(spec.ref, image_id, size, time.monotonic() - start)

    def existing(self, ref: str) -> Built | None:
        """An image built elsewhere (buildx), if the engine has it."""
        with _step(f"inspect {ref}"):
            try:
                image = self.client.images.get(ref)
            except ImageNotFound:
                return None
        return Built(ref, image.id, image.attrs["Size"], 0.0)

    # --------------------------------------------------------------------------------------- smoke

    def smoke(self, ref: str, timeout: float = 300) -> float:
        """Run the image with no network at all and wait until its own HEALTHCHECK command passes
        (/ready is 200 only after the server's self-test). Returns the seconds it took."""
        step = f"smoke test {ref}"
        with _step(step):
            test = self.client.images.get(ref).attrs["Config"]["Healthcheck"]["Test"]
            probe = test[1:] if test[0] == "CMD" else ["/bin/sh", "-c", test[1]]
            # As Kubernetes runs it (deploy/k8s): a read-only root filesystem, a writable /tmp.
            container = self.client.containers.run(
                ref, detach=True, network_mode="none", read_only=True, tmpfs={"/tmp": "rw,size=64m"}
            )
            start = time.monotonic()
            try:
                with self.console.status(f"waiting for {ref} to be ready"):
                    while True:
                        container.reload()
                        if container.status not in ("created", "running"):
                            lines = container.logs(tail=5).decode(errors="replace").strip().splitlines()
                            raise ImageError(
                                f"{step}: the server exited ({container.status}): {lines[-1] if lines else 'no output'}"
                            )
                        if container.exec_run(probe).exit_code == 0:
                            return time.monotonic() - start
                        state = self._ready_state(container)
                        if state.get("state") == "failed" or time.monotonic() - start > timeout:
                            raise ImageError(
                                f"{step}: /ready is not 200 after {time.monotonic() - start:.0f} s: "
                                f"{state.get('state', 'no answer')}: {state.get('reason', '')}"
                            )
                        time.sleep(1)
            finally:
                container.remove(force=True)

    @staticmethod
    def _ready_state(container) -> dict:
        """/ready's JSON body (state and reason), read from inside the container."""
        fetch = (
            "import urllib.request as u\ntry:\n print(u.urlopen('http://127.0.0.1:%s/ready' % "
            "__import__('os').environ['GEMMA4_PORT'], timeout=4).read().decode())\n"
            "except u.HTTPError as e:\n print(e.read().decode())"
        )
        try:
            return json.loads(container.exec_run(["python", "-c", fetch]).output)
        except ValueError:
            return {}

    # ---------------------------------------------------------------------------------------- push

    def push(self, spec: ImageSpec) -> Pushed:
        step = f"push {spec.ref}"
        start = time.monotonic()
        status: dict[str, str] = {}
        digest = None
        with (
            _step(step),
            Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(), console=self.console, transient=True
            ) as bars,
        ):
            tasks = {}
            for event in self.client.api.push(spec.repository, tag=spec.tag, stream=True, decode=True):
                if "error" in event:
                    raise ImageError(f"{step}: the registry refused: {_reason(Exception(event['error']))}")
                layer = event.get("id")
                if layer and "status" in event:
                    status[layer] = event["status"]
                    if layer not in tasks:
                        tasks[layer] = bars.add_task(layer, total=None)
                    detail = event.get("progressDetail") or {}
                    bars.update(
                        tasks[layer],
                        description=f"{layer} {event['status']}",
                        completed=detail.get("current"),
                        total=detail.get("total"),
                    )
                digest = event.get("aux", {}).get("Digest", digest)
            if digest is None:
                raise ImageError(f"{step}: the registry gave no digest")
            for layer, state in status.items():
                self.console.print(f"  {layer}  {state}", highlight=False)
            uploaded = {layer for layer, state in status.items() if state == "Pushed"}
            nbytes = self._uploaded_bytes(spec, digest, uploaded)
        return Pushed(spec.ref, digest, len(uploaded), len(status) - len(uploaded), nbytes, time.monotonic() - start)

    def _uploaded_bytes(self, spec: ImageSpec, digest: str, uploaded: set[str]) -> int | None:
        """Compressed size of the uploaded layers: the registry lists the blobs in the order of the
        image's diff ids, and the push events name layers by their short diff id."""
        sizes = layer_sizes(spec.repository, digest)
        if sizes is None:
            return None
        diff_ids = self.client.images.get(spec.ref).attrs["RootFS"]["Layers"]
        return sum(size for diff_id, size in zip(diff_ids, sizes) if diff_id[7:19] in uploaded)

    def repo_digest(self, spec: ImageSpec) -> str | None:
        """The registry digest of an image pushed before (what a slim image is FROM), if any."""
        try:
            digests = self.client.images.get(spec.ref).attrs.get("RepoDigests") or []
        except (ImageNotFound, NotFound, APIError):
            return None
        return next((d.split("@")[1] for d in digests if d.split("@")[0] == spec.repository), None)
