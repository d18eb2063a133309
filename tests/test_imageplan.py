"""The image plan and its Dockerfiles, without a daemon: golden files under tests/golden/images/.

Regenerate after an intended change with GEMMA4_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_port.images.dockerfile import render_dockerfile
from gemma4_port.images.plan import pin_base, plan_images, served_variant
from gemma4_port.images.spec import ImageError, ImageOptions
from gemma4_port.source.manifest import load_manifest
from support import MANIFESTS, ROOT

GOLDEN = Path(__file__).parent / "golden" / "images"
# Everything that varies between runs is pinned here, so the Dockerfiles are byte-for-byte stable.
FIXED = dict(
    requirements=(
        "flask==3.1.3",
        "gunicorn==27.0.1",
        "pydantic==2.14.4",
        "pillow==13.0.0",
        "soundfile==0.14.0",
        "soxr==1.1.0",
    ),
    cpu_torch="2.13.0+cpu",
    source="https://example.invalid/gemma4-inf2",
    version="0.1.0",
    revision="0" * 40,
    created="2026-01-01T00:00:00Z",
)
BASE_DIGEST = "sha256:" + "ab" * 32
CASES = {  # golden name -> (manifest, options)
    "tiny-e2b-cpu": ("tiny-e2b", ImageOptions(flavour="cpu", registry="127.0.0.1:5000", **FIXED)),
    "gemma-4-e2b-neuron": (
        "gemma-4-e2b",
        ImageOptions(flavour="neuron", compile_swap_gib={"512-128": 0, "tp2-48k": 0}, **FIXED),
    ),
    "gemma-4-12b-neuron-copy": (
        "gemma-4-12b",
        ImageOptions(flavour="neuron", weights="copy", compile_swap_gib={"tp2-48k": 221}, **FIXED),
    ),
}


def manifest(name: str):
    return load_manifest(MANIFESTS / f"{name}.yaml")


def rendered(case: str) -> dict[str, str]:
    name, options = CASES[case]
    out = {}
    for spec in plan_images(manifest(name), options):
        if spec.depends_on:
            spec = pin_base(spec, BASE_DIGEST)
        out[f"{case}.{spec.kind}.Dockerfile"] = render_dockerfile(spec)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_dockerfiles_match_golden(case):
    files = rendered(case)
    if os.environ.get("GEMMA4_UPDATE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (GOLDEN / name).write_text(text)
    expected = sorted(p.name for p in GOLDEN.glob(f"{case}.*.Dockerfile"))
    assert sorted(files) == expected
    for name, text in files.items():
        assert text == (GOLDEN / name).read_text(), f"{name} changed; GEMMA4_UPDATE_GOLDEN=1 to accept"


def test_the_images_carry_what_the_media_processors_need():
    """The server decodes images with PIL and audio with soundfile (its wheel brings libsndfile) and
    soxr, as transformers' processors and load_audio do; the images install the host's versions."""
    from gemma4_port.images.project import host_requirements

    assert {"pillow", "soundfile", "soxr"} <= {r.split("==")[0].lower() for r in host_requirements()}


def test_slim_is_from_the_base_by_digest_and_adds_only_the_server():
    specs = plan_images(manifest("tiny-e2b"), CASES["tiny-e2b-cpu"][1], ("build.py",), ("runtime/serve.py",))
    assert [s.kind for s in specs] == ["base", "slim"]
    base, slim = specs
    assert base.ref == "127.0.0.1:5000/gemma4-inf2/tiny-e2b:latest" and slim.ref.endswith(":slim")
    assert slim.from_image == base.ref
    pinned = pin_base(slim, BASE_DIGEST)
    assert pinned.from_image == f"127.0.0.1:5000/gemma4-inf2/tiny-e2b@{BASE_DIGEST}"
    assert ("org.opencontainers.image.base.digest", BASE_DIGEST) in pinned.labels
    assert dict(slim.context) == {"server/runtime/serve.py": "code:runtime/serve.py"}  # no artifact, no wheel, no tool
    text = render_dockerfile(pinned)
    assert [ln.split()[0] for ln in text.splitlines() if ln.split() and ln.split()[0] in ("COPY", "RUN")] == [
        "RUN",
        "COPY",
    ]  # the user, then the server: two thin layers


def test_env_is_baked_from_the_manifest():
    name, options = CASES["gemma-4-e2b-neuron"]
    by_kind = {s.kind: s for s in plan_images(manifest(name), options)}
    slim, tp2 = dict(by_kind["slim"].env), dict(by_kind["tp2-slim"].env)
    assert slim["GEMMA4_ARTIFACT"] == "/opt/gemma4/artifacts/512-128" and slim["NEURON_RT_VISIBLE_CORES"] == "0"
    assert tp2["GEMMA4_ARTIFACT"] == "/opt/gemma4/artifacts/tp2-48k" and tp2["NEURON_RT_VISIBLE_CORES"] == "0,1"
    assert slim["GEMMA4_BACKEND"] == "neuron" and slim["GEMMA4_PORT"] == "8080" and slim["GEMMA4_HOST"] == "0.0.0.0"
    assert by_kind["base"].variants == ("512-128", "tp2-48k")


def test_tags_select_images_and_bring_their_base():
    m = manifest("gemma-4-e2b")

    def kinds(only):
        return [s.kind for s in plan_images(m, ImageOptions(flavour="neuron", only=only))]

    assert kinds(("tp2-slim",)) == ["base", "tp2-slim"]
    assert kinds(("latest",)) == ["base"]
    assert kinds(()) == ["base", "slim", "tp2-slim"]
    with pytest.raises(ImageError, match=r"--tags nope: not an image of this manifest; choose from base \(latest\)"):
        kinds(("nope",))


def test_a_slim_kind_without_a_matching_variant_is_one_clear_error():
    m = manifest("gemma-4-e4b")  # tp 2 and tp 1 variants; drop the tp 1 one
    m = m.model_copy(update={"variants": tuple(v for v in m.variants if v.tp == 2)})
    with pytest.raises(ImageError, match="slim needs a variant with tp 1; gemma-4-e4b has none"):
        served_variant(m, "slim")


def test_the_base_carries_the_build_tools_and_the_load_path_not_the_server():
    from gemma4_port.images.project import project_files

    base, server = map(set, project_files())
    assert {
        "build.py",
        "gemma4_port/compile/backends.py",
        "gemma4_port/verify/run.py",
        "contract/artifact.py",
        "runtime/model/loader.py",
        "runtime/__init__.py",
    } <= base
    assert not base & {"runtime/serve.py", "runtime/http/app.py", "runtime/generate/engine.py"}
    assert {"contract/artifact.py", "runtime/serve.py", "runtime/http/app.py", "runtime/model/loader.py"} <= server
    assert not any("__pycache__" in f or f.startswith("gemma4_port/") for f in base & server)


def test_dry_run_prints_neuron_dockerfiles_without_a_daemon():
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    run = subprocess.run(
        [sys.executable, "build.py", "images", "gemma4_port/manifests/gemma-4-e2b.yaml", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "FROM ubuntu:22.04 AS toolchain" in run.stdout and "aws-neuronx-runtime-lib" in run.stdout
    assert 'NEURONX_CC="2.23.6484.0"' in run.stdout and 'TORCH_NEURONX="2.8.0.2.12.22436"' in run.stdout
    assert 'NEURONX_DISTRIBUTED="0.17.26814"' in run.stdout
    assert '"neuronx-cc==${NEURONX_CC}" "torch-neuronx==${TORCH_NEURONX}"' in run.stdout
    assert "--mount=type=secret,id=hf_token" in run.stdout
    assert 'NEURON_RT_VISIBLE_CORES="0,1"' in run.stdout and '"runtime.serve"' in run.stdout


def test_kubernetes_manifests_fit_the_slim_image():
    import yaml

    from gemma4_port.images.spec import SERVER_PORT, SERVER_UID

    k8s = ROOT / "deploy" / "k8s"
    docs = {
        d["kind"]: d
        for f in ("deployment.yaml", "service.yaml", "hpa.yaml")
        for d in yaml.safe_load_all((k8s / f).read_text())
    }
    assert set(yaml.safe_load((k8s / "kustomization.yaml").read_text())["resources"]) == {
        "deployment.yaml",
        "service.yaml",
        "hpa.yaml",
    }
    pod = docs["Deployment"]["spec"]["template"]
    (server,) = pod["spec"]["containers"]
    assert server["ports"][0]["containerPort"] == SERVER_PORT
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    assert server["resources"]["limits"]["aws.amazon.com/neuron"] == 1
    assert pod["spec"]["securityContext"]["runAsUser"] == SERVER_UID
    assert docs["Service"]["spec"]["selector"] == pod["metadata"]["labels"]
    target = docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", docs["Deployment"]["metadata"]["name"])


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(keyword, the rest) per instruction, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in dockerfile.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.removesuffix("\\") + " "
        if not line.endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            out.append((keyword.upper(), rest))
            pending = ""
    return out


def shell_text(dockerfile: str) -> list[str]:
    """What a shell parses: every RUN in shell form (an exec-form RUN, a JSON array, runs no shell)."""
    texts = []
    for keyword, rest in instructions(dockerfile):
        if keyword != "RUN":
            continue
        while rest.startswith("--"):  # --mount=... and the like
            rest = rest.split(" ", 1)[1].lstrip()
        if not rest.startswith("["):
            texts.append(rest)
    return texts


def sentinel_manifest():
    """A manifest whose every string that reaches a Dockerfile is one no template or default holds."""
    import yaml

    from gemma4_port.source.manifest import parse_manifest
    from gemma4_port.source.toolchain import TOOLCHAIN

    data = yaml.safe_load((MANIFESTS / "gemma-4-e2b.yaml").read_text())
    data["name"] = "sentinel-name"
    data["model"] = {"source": "sentinel-owner/sentinel-model", "revision": "sentinel/rev"}
    data["toolchain"] = yaml.safe_load(TOOLCHAIN.read_text())  # the shared toolchain, as the manifest's own
    data["toolchain"].update(
        torch_neuronx="7.71.7.7.71.7171",
        neuronx_cc="7.72.7272.7",
        neuronx_distributed="0.73.7373",
        neuron_runtime="7.74.7474.7",
        neuron_collectives="7.75.7575.7",
        neuron_tools="7.76.7676.7",
        transformers="7.77.7777",
    )
    for v in data["variants"]:
        v["name"] = f"sentinel-{v['name']}"
    data["images"] = {"repository": "sentinel-repo/x", "variant": "sentinel-512-128", "tags": data["images"]["tags"]}
    return parse_manifest(data, "sentinel.yaml")


def test_no_manifest_string_is_ever_shell_text():
    """A revision like `main$(id>PWNED)` once ran in the shell of the RUN that mounts the hub token:
    the manifest's values now reach a RUN only as build arguments or exec-form arguments."""
    m = sentinel_manifest()
    sentinels = ["sentinel", "7.7", "0.73.7373", "7.71"]
    for options in (ImageOptions(flavour="neuron"), ImageOptions(flavour="neuron", weights="copy")):
        rendered = {s.kind: render_dockerfile(s) for s in plan_images(m, options)}
        base = rendered["base"]
        assert 'MODEL_REVISION="sentinel/rev"' in base or options.weights == "copy"
        assert 'TRANSFORMERS="7.77.7777"' in base and '"transformers==${TRANSFORMERS}"' in base
        assert '"--variant", "sentinel-512-128"' in base  # the compile RUN, exec form
        texts = [t for text in rendered.values() for t in shell_text(text)]
        assert len(texts) >= 3  # the apt, pip and user RUNs were found
        assert [t for t in texts if any(s in t for s in sentinels)] == []


def test_a_build_argument_a_dockerfile_would_interpret_is_refused():
    from gemma4_port.images.dockerfile import build_args

    assert build_args({"A": "refs/pr/1", "B": "2.8.*"}) == 'ARG A="refs/pr/1" \\\n    B="2.8.*"'
    for value in ("main$(id)", 'x" y', "a\nRUN id", "a`b`", "a\\b"):
        with pytest.raises(ImageError, match="a character a Dockerfile would interpret"):
            build_args({"REV": value})


def test_a_neuron_image_of_a_local_checkpoint_is_refused():
    m = manifest("gemma-4-e2b")
    m = m.model_copy(update={"model": m.model.model_copy(update={"source": "/data/gemma"})})
    with pytest.raises(ImageError, match="model.source '/data/gemma' is a local folder; .* give a hub repo id"):
        plan_images(m, ImageOptions(flavour="neuron"))


def test_the_neuron_base_installs_under_the_constraints_and_dispatches_by_command():
    from gemma4_port.images.project import project_files
    from gemma4_port.images.spec import ENTRYPOINT, NEURON_CONSTRAINTS

    text = rendered("gemma-4-e2b-neuron")["gemma-4-e2b-neuron.base.Dockerfile"]
    assert f"COPY app/{NEURON_CONSTRAINTS} /opt/neuron-constraints.txt" in text
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert len(installs) == 2 and all("-c /opt/neuron-constraints.txt" in line for line in installs)
    # the constraints reach the build context (app/) with the build tools, and doctor reads them there
    assert {NEURON_CONSTRAINTS, ENTRYPOINT} <= set(project_files()[0])
    assert text.rstrip().splitlines()[-1].startswith("    gemma4-inf2.compile-swap-gib")  # labels last
    assert f'ENTRYPOINT ["bash", "/opt/gemma4/{ENTRYPOINT}"]' in text


def test_the_entrypoint_runs_build_py_commands_by_name_and_anything_else_as_given(tmp_path):
    from gemma4_port.images.spec import ENTRYPOINT

    def run(*args):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
            "GEMMA4_APP": str(ROOT),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "GEMMA4_INF2_CACHE": str(tmp_path),
        }
        return subprocess.run(
            ["bash", str(ROOT / ENTRYPOINT), *args], capture_output=True, text=True, env=env, cwd=tmp_path
        )

    done = run("doctor", "--layouts", "tp3")
    assert (
        done.returncode == 2
        and "error: --layouts tp3: no such layout" in done.stderr
        and "Traceback" not in done.stderr
    )
    assert run("sh", "-c", "echo $PYTHONSAFEPATH; echo as-given").stdout == "\nas-given\n"  # untouched
    assert "compile" in run().stdout  # no command: build.py's help


def test_a_child_keeps_the_slim_images_server_ahead_of_the_base_copy():
    from gemma4_port import ROOT, child_env

    slim = os.pathsep.join(["/app", str(ROOT)])  # the entrypoint's PYTHONPATH in the slim image
    assert child_env({"PYTHONPATH": slim})["PYTHONPATH"] == slim
    assert child_env({"PYTHONPATH": "/x"})["PYTHONPATH"] == os.pathsep.join([str(ROOT), "/x"])
