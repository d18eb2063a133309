"""runtime.serve: what `build.py serve` and the images' `python -m runtime.serve` run: the settings
and the artifact checked first, then gunicorn configured from the same ServerSettings object."""

import os
import subprocess
import sys

import pytest

from contract.artifact import ArtifactError
from runtime.serve import GunicornServer, gunicorn_options, run
from runtime.settings import ServerSettings, SettingsError
from support import ROOT


def test_serve_checks_the_artifact_before_starting_gunicorn(compiled, tmp_path):
    with pytest.raises(ArtifactError, match="artifact.json is missing"):
        run({"GEMMA4_ARTIFACT": str(tmp_path)})
    with pytest.raises(SettingsError, match="GEMMA4_BACKEND=neuron.*compiled for the cpu backend"):
        run({"GEMMA4_ARTIFACT": str(compiled("tiny-e2b", "fp32")), "GEMMA4_BACKEND": "neuron"})


def test_gunicorn_takes_its_options_from_the_settings(compiled):
    settings = ServerSettings.from_env(
        {
            "GEMMA4_ARTIFACT": str(compiled("tiny-e2b", "fp32")),
            "GEMMA4_PORT": "8123",
            "GEMMA4_HOST": "127.0.0.1",
            "GEMMA4_QUEUE_MAX": "5",
        }
    )
    cfg = GunicornServer(settings).cfg
    assert cfg.bind == ["127.0.0.1:8123"] and cfg.workers == 1 and cfg.threads == 5 + 32
    assert cfg.worker_class_str == gunicorn_options(settings)["worker_class"] and not cfg.preload_app


def test_the_image_entry_point_refuses_a_bad_setting_in_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMA4_")} | {"GEMMA4_PORT": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "runtime.serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert (
        r.returncode == 2
        and r.stderr == "error: GEMMA4_ARTIFACT is not set: point it at an artifact directory from `build.py compile`\n"
    )
