"""The Inf2 platform override a compile sets on a host without a Neuron device, and only there."""

from gemma4_port.compile.platform import INF2, OVERRIDE, pin_platform, platform_override


def test_no_device_and_no_override_pins_inferentia2_as_trn1():
    assert platform_override({}, []) == {OVERRIDE: "trn1"}
    assert INF2 == "trn1"  # the docs' value for Inf2; "inf2" would be NxD's hardware.CUSTOM


def test_a_device_or_the_users_own_value_is_left_alone():
    assert platform_override({}, ["/dev/neuron0"]) == {}
    assert platform_override({OVERRIDE: "trn2"}, []) == {}


def test_pin_platform_writes_the_environment_it_is_given(caplog):
    env = {}
    assert pin_platform(env, devices=[]) == {OVERRIDE: "trn1"}
    assert env == {OVERRIDE: "trn1"}
    on_device = {}
    assert pin_platform(on_device, devices=["/dev/neuron0"]) == {} and on_device == {}
    kept = {OVERRIDE: "inf2"}
    assert pin_platform(kept, devices=[]) == {} and kept == {OVERRIDE: "inf2"}
    assert "hardware.CUSTOM" in caplog.text
