"""`build.py images` against a real Docker engine and registry (the fixtures start both, on loopback).

The tiny manifest on the cpu flavour: the base is built and pushed alone first, then the whole set,
so the registry's growth during the second push is what the slim image alone costs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from gemma4_port.bench.server import free_port
from gemma4_port.images.registry import MANIFEST_TYPES
from support import MANIFESTS, ROOT
from support.docker_env import docker_engine, registry  # noqa: F401 (fixtures)

pytestmark = pytest.mark.docker

MANIFEST = MANIFESTS / "tiny-e2b.yaml"
REPO = "gemma4-inf2/tiny-e2b"


def images_cli(cwd: Path, *args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "images", str(MANIFEST), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def registry_manifest(reg, tag: str) -> dict:
    r = requests.get(f"http://{reg.address}/v2/{REPO}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES}, timeout=10)
    r.raise_for_status()
    return r.json()


@pytest.fixture(scope="module")
def pushed(docker_engine, registry, compiled, tmp_path_factory):
    """Base pushed alone, then base + slim; the registry's stored bytes measured around each push."""
    work = tmp_path_factory.mktemp("images")
    # build.py images reuses artifacts/NAME-VARIANT in its working directory: the session's compile.
    shutil.copytree(compiled("tiny-e2b", "fp32"), work / "artifacts" / "tiny-e2b-fp32")
    before = registry.stored_bytes()
    first = images_cli(work, "--registry", registry.address, "--push", "--tags", "base")
    assert first.returncode == 0, first.stderr[-3000:]
    after_base = registry.stored_bytes()
    second = images_cli(work, "--registry", registry.address, "--push")
    assert second.returncode == 0, second.stderr[-3000:]
    return {
        "work": work,
        "base_bytes": after_base - before,
        "slim_bytes": registry.stored_bytes() - after_base,
        "first": first,
        "second": second,
    }


def test_every_base_layer_is_a_slim_layer_and_the_slim_push_is_thin(pushed, registry):
    base, slim = registry_manifest(registry, "latest"), registry_manifest(registry, "slim")
    base_layers = [layer["digest"] for layer in base["layers"]]
    slim_layers = [layer["digest"] for layer in slim["layers"]]
    assert slim_layers[: len(base_layers)] == base_layers  # same digests, same order: FROM the base
    own = slim["layers"][len(base_layers) :]
    assert 1 <= len(own) <= 2 and sum(layer["size"] for layer in own) < 1_000_000  # user + server code
    assert pushed["base_bytes"] > 100_000_000  # venv + artifact + code
    # The second push re-sent the base's new config (its `created` label) and the slim's thin layers only.
    assert pushed["slim_bytes"] < 1_000_000, pushed["slim_bytes"]
    summary = pushed["second"].stdout
    slim_row = next(line for line in summary.splitlines() if f"{REPO}:slim" in line)
    assert re.search(r"\b\d+ new, \d+ reused\b", slim_row) and re.search(r"\d+(\.\d)? kB", slim_row), summary


def test_the_slim_image_says_what_it_is(pushed, registry):
    import docker

    client = docker.from_env()
    base = client.images.get(f"{registry.address}/{REPO}:latest")
    slim = client.images.get(f"{registry.address}/{REPO}:slim")
    config = slim.attrs["Config"]
    labels = config["Labels"]
    for key in ("source", "version", "revision", "created", "base.name", "base.digest"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    base_digest = next(d.split("@")[1] for d in base.attrs["RepoDigests"])
    assert labels["org.opencontainers.image.base.digest"] == base_digest
    assert labels["org.opencontainers.image.base.name"] == f"{registry.address}/{REPO}:latest"
    assert config["User"] == "10001:10001"
    assert config["Healthcheck"]["Test"][0] == "CMD" and "/ready" in config["Healthcheck"]["Test"][-1]
    assert config["Healthcheck"]["StartPeriod"] >= 60 * 10**9
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["GEMMA4_ARTIFACT"] == "/opt/gemma4/artifacts/fp32" and env["GEMMA4_BACKEND"] == "cpu"
    assert env["NEURON_RT_VISIBLE_CORES"] == "0" and env["GEMMA4_PORT"] == "8080"
    assert "8080/tcp" in config["ExposedPorts"]


MEDIA_CHECK = """
import io
import numpy as np
import soundfile
from PIL import Image
from transformers.models.gemma4 import Gemma4ImageProcessorPil
from runtime.api import media_decode
from runtime.settings import MediaLimits
clip = io.BytesIO()
soundfile.write(clip, np.zeros(22050, np.float32), 22050, format="MP3")
print(round(len(media_decode.audio(clip.getvalue(), "mp3", MediaLimits(), 16000)), -3))
png = io.BytesIO()
Image.new("RGB", (61, 45)).save(png, format="PNG")
image = media_decode.image(png.getvalue(), MediaLimits())
processor = Gemma4ImageProcessorPil(patch_size=4, pooling_kernel_size=3, max_soft_tokens=70)
print(processor(images=[image])["num_soft_tokens_per_image"][0])
"""


def test_the_slim_container_serves_the_reference_tokens_as_a_non_root_user(pushed, registry, compiled):
    import docker

    from contract.artifact import load_meta
    from contract.tokenizer import load_tokenizer

    port = free_port()
    client = docker.from_env()
    container = client.containers.run(
        f"{registry.address}/{REPO}:slim",
        detach=True,
        network_mode="host",
        environment={"GEMMA4_HOST": "127.0.0.1", "GEMMA4_PORT": str(port)},  # loopback only
    )
    try:
        deadline = time.monotonic() + 180
        status = None
        while time.monotonic() < deadline and status != 200:
            try:
                status = requests.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code
            except requests.RequestException:
                pass
            time.sleep(0.5)
        assert status == 200, container.logs(tail=30).decode()
        assert container.exec_run(["id", "-u"]).output.decode().strip() == "10001"
        # what the media processors need is in the image: an mp3 through soundfile (its wheel's
        # libsndfile), load_audio and soxr; a PNG through PIL and Gemma-4's image processor
        media = container.exec_run(["python", "-c", MEDIA_CHECK])
        assert media.exit_code == 0 and media.output.decode().split() == ["16000", "63"], media.output.decode()

        artifact = compiled("tiny-e2b", "fp32")
        golden = next(g for g in load_meta(artifact).golden if g.name == "chat")
        r = requests.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=60,
            json={
                "model": "tiny-e2b",
                "messages": [{"role": "user", "content": "Capital of France?"}],
                "max_tokens": len(golden.tokens),
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["prompt_tokens"] == len(golden.ids)
        assert body["usage"]["completion_tokens"] == len(golden.tokens)
        tok = load_tokenizer(artifact / "tokenizer")
        assert body["choices"][0]["message"]["content"] == tok.decode(list(golden.tokens))
    finally:
        container.remove(force=True)


def one_error_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode != 0
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.stderr[-2000:]
    return errors[0]


def test_a_daemon_that_is_not_running_is_one_clear_line(tmp_path):
    run = images_cli(tmp_path, "--push", env={"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}, timeout=300)
    line = one_error_line(run)
    assert line.startswith("error: connect: cannot reach the Docker daemon at unix://") and "DOCKER_HOST" in line


def test_a_registry_that_refuses_is_one_clear_line(pushed):
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    run = images_cli(pushed["work"], "--registry", closed, "--push", "--tags", "base")
    line = one_error_line(run)
    assert line.startswith(f"error: push {closed}/{REPO}:latest: the registry refused:"), line
    assert "connection refused" in line


def bare_image(tag: str = "local/bare:1"):
    """An OS image of one file: no shell, no python."""
    import io
    import tarfile

    import docker

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("etc/os-release")
        info.size = len(b"ID=bare\n")
        tar.addfile(info, io.BytesIO(b"ID=bare\n"))
    repository, _, version = tag.partition(":")
    docker.from_env().api.import_image_from_data(layer.getvalue(), repository=repository, tag=version)
    return docker.from_env().images.get(tag)


def test_a_base_image_without_python_is_named_before_anything_is_built(docker_engine, tmp_path):
    """It failed deep in the build with "returned a non-zero code: 127"."""
    bare_image()
    run = images_cli(tmp_path, "--base-image", "local/bare:1", "--tags", "base", timeout=300)
    line = one_error_line(run)
    assert line.startswith("error: prepare OS image: local/bare:1 has no python3") and "python3-venv" in line, line


def test_a_stale_default_os_image_is_checked_before_it_is_trusted(docker_engine, tmp_path):
    """An existing local/debian:bookworm was used as it was; one without python3 is named, with the fix."""
    from gemma4_port.images.docker_driver import Driver
    from gemma4_port.images.host_inputs import image_cache
    from gemma4_port.images.spec import DEFAULT_OS_IMAGE

    default = DEFAULT_OS_IMAGE["cpu"]
    Driver().ensure_os_image(default, image_cache())  # the real one (made once, from the cached rootfs)
    real = Driver().client.images.get(default)
    bare_image().tag(*default.split(":"))
    try:
        line = one_error_line(images_cli(tmp_path, "--tags", "base", timeout=300))
    finally:
        real.tag(*default.split(":"))
    assert line.startswith(f"error: prepare OS image: {default} has no python3") and f"docker rmi {default}" in line
