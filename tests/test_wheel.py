"""The package as a wheel: it carries the manifests, the Dockerfile templates and the chat template,
declares the `gemma4-inf2` console script, and runs a command from the unpacked wheel outside the
checkout: `plan`, the project's facts the images read (from the wheel's own metadata), and `images`,
which needs build.py from a checkout and says so."""

import configparser
import os
import subprocess
import sys
import tomllib
import zipfile

from support import ROOT


def test_the_wheel_carries_its_data_and_runs_outside_the_checkout(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("gemma4_inf2-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (entry,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = configparser.ConfigParser()
        scripts.read_string(z.read(entry).decode())
        z.extractall(tmp_path / "site")
    shipped = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "gemma4_port").rglob("*")
        if p.suffix in (".yaml", ".template", ".jinja")
    }
    assert "gemma4_port/manifests/toolchain.yaml" in shipped and "gemma4_port/source/chat_template.jinja" in shipped
    assert shipped <= names, sorted(shipped - names)
    checkpoint = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gemma4_port/checkpoints").rglob("*") if p.is_file()}
    assert "gemma4_port/checkpoints/tiny-chat/target/model.safetensors" in checkpoint and checkpoint <= names
    assert scripts["console_scripts"]["gemma4-inf2"] == "gemma4_port.cli:main"
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = os.environ | {"PYTHONPATH": str(tmp_path / "site"), "COLUMNS": "200"}
    code = "import gemma4_port, runtime, contract; print(gemma4_port.__file__, runtime.__file__, contract.__file__)"
    where = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.split() and all(p.startswith(str(tmp_path / "site")) for p in where.stdout.split()), where
    run = subprocess.run(
        [sys.executable, "-m", "gemma4_port", "plan", "tiny-e2b", "--variant", "fp32"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "fp32" in run.stdout, run.stderr[-2000:]
    facts = (
        "from gemma4_port import checkout; from gemma4_port.images.project import project; p = project(); "
        "print(checkout(), p.version, sorted(d.split('>')[0].split('=')[0] for d in p.dependencies))"
    )
    about = subprocess.run([sys.executable, "-c", facts], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert about.returncode == 0, about.stderr[-2000:]
    none, version, deps = about.stdout.split(" ", 2)
    assert none == "None" and version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    # installed, not a checkout: the wheel's METADATA speaks
    assert all(f"'{name}'" in deps for name in ("flask", "llguidance", "soundfile")), deps
    images = subprocess.run(
        [sys.executable, "-m", "gemma4_port", "images", "tiny-e2b", "--dry-run"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = images.stdout + images.stderr
    assert images.returncode != 0 and "build.py" in said and "from a checkout" in said, said[-2000:]
    assert "Traceback" not in said
