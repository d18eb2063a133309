"""contract/versions.py and runtime/model/neuron_sdk.py: the load-time check of recorded against
installed builds, pins that admit one build each, and the host driver check."""

from pathlib import Path

import pytest

from contract.versions import (
    VersionMismatch,
    check_versions,
    driver_problem,
    matches_pin,
    pin_problems,
    version_problems,
)
from runtime.model.neuron_sdk import check_driver

RECORDED = {
    "neuronx-cc": "2.23.6484.0+3b612583",
    "torch-neuronx": "2.8.0.2.10.16998",
    "aws-neuronx-runtime-lib": "2.30.50.0-0d3ac3dfc",
    "torch": "2.8.0",
}


def test_version_check_compares_recorded_and_installed():
    assert version_problems(RECORDED, dict(RECORDED)) == []
    other = RECORDED | {"neuronx-cc": "2.24.5133.0+58f8de22"}
    (problem,) = version_problems(RECORDED, other)
    assert "neuronx-cc" in problem and "2.23.6484.0+3b612583" in problem and "2.24.5133.0+58f8de22" in problem
    missing_runtime = {k: v for k, v in RECORDED.items() if k != "aws-neuronx-runtime-lib"}
    assert [p.split(":")[0] for p in version_problems(RECORDED, missing_runtime)] == ["aws-neuronx-runtime-lib"]
    assert version_problems(RECORDED, RECORDED | {"torch": "2.9.0"}) == []  # torch is not part of the neff
    with pytest.raises(VersionMismatch, match="recompile"):
        check_versions(RECORDED, other)


def test_a_pin_admits_one_build_only():
    """A release prefix: "2.8.0" admitted the 2.26, 2.27 and 2.28 builds of torch-neuronx."""
    assert matches_pin("2.8.0.2.12.22436", "2.8.0.2.12.22436")
    assert matches_pin("2.23.6484.0", "2.23.6484.0+3b612583")  # the wheel's local label
    assert matches_pin("2.30.51.0", "2.30.51.0-0d3ac3dfc")  # the Debian revision
    assert not matches_pin("2.8.0.2.12.22436", "2.8.0.2.11.19912")  # SDK 2.27's build
    assert not matches_pin("2.8.0", "2.8.0.2.12.22436")
    assert pin_problems({"torch-neuronx": "2.8.0.2.12.22436"}, {"torch-neuronx": "2.8.0.2.10.16998"}) == [
        "torch-neuronx 2.8.0.2.10.16998 (manifest pins 2.8.0.2.12.22436)"
    ]


def test_the_driver_check_says_what_to_update():
    assert driver_problem("2.26.5.0", "2.26.5.0") is None and driver_problem("2.26.5.0", "2.27.1.0") is None
    assert "older than the 2.26.5.0" in driver_problem("2.26.5.0", "2.25.4.0")
    assert "no Neuron driver is loaded" in driver_problem("2.26.5.0", None)
    assert check_driver("2.26.5.0", Path("/nonexistent/neuron/version")).startswith("no Neuron driver is loaded")


def test_an_older_driver_is_a_warning_at_start_up(tmp_path, caplog):
    version = tmp_path / "version"
    version.write_text("2.25.4.0\n")
    assert "older than the 2.26.5.0" in check_driver("2.26.5.0", version)
    assert "update aws-neuronx-dkms" in caplog.text
    version.write_text("2.26.10.0\n")
    assert check_driver("2.26.5.0", version) is None
