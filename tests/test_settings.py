"""runtime.settings: the environment read once into one frozen object, a bad value one line naming
its variable."""

import pytest
from pydantic import ValidationError

from runtime.settings import ServerSettings, SettingsError


def test_settings_from_the_environment(tmp_path):
    s = ServerSettings.from_env({"GEMMA4_ARTIFACT": str(tmp_path), "GEMMA4_API_KEY": "", "GEMMA4_QUEUE_MAX": "3"})
    assert (s.queue_max, s.api_key, s.backend, s.port, s.max_body_bytes) == (3, None, "auto", 8080, 1 << 20)
    with pytest.raises(ValidationError, match="Instance is frozen"):
        s.queue_max = 4  # frozen: parsed once at the edge


@pytest.mark.parametrize(
    "var,value",
    [
        ("GEMMA4_ARTIFACT", None),
        ("GEMMA4_ARTIFACT", "/no/such/dir"),
        ("GEMMA4_QUEUE_MAX", "lots"),
        ("GEMMA4_QUEUE_MAX", "0"),
        ("GEMMA4_PORT", "70000"),
        ("GEMMA4_BACKEND", "gpu"),
        ("GEMMA4_MAX_BODY_BYTES", "10"),
        ("GEMMA4_SPEC_METHOD", "eagle"),
        ("GEMMA4_SPEC_K", "0"),
        ("GEMMA4_SPEC_LOOKUP_MAX", "1"),  # below the lookup's minimum n (2)
    ],
)
def test_a_bad_setting_is_one_error_naming_the_variable(tmp_path, var, value):
    env = {"GEMMA4_ARTIFACT": str(tmp_path)} | {var: value}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(SettingsError, match=f"^{var}") as info:
        ServerSettings.from_env(env)
    assert "\n" not in str(info.value)


def test_media_limits_from_the_environment(tmp_path):
    env = {
        "GEMMA4_ARTIFACT": str(tmp_path),
        "GEMMA4_MEDIA_ALLOWED_DOMAINS": "images.example.com, cdn.example.org",
        "GEMMA4_MEDIA_MAX_IMAGES": "3",
        "GEMMA4_MEDIA_FETCH_PRIVATE_ADDRESSES": "true",
    }
    media = ServerSettings.from_env(env).media
    assert media.allowed_domains == ("images.example.com", "cdn.example.org")
    assert (media.max_images, media.fetch_private_addresses, media.max_audio_seconds) == (3, True, 30.0)
    with pytest.raises(SettingsError, match="^GEMMA4_MEDIA_MAX_AUDIO_SECONDS='60'"):  # the feature extractor's 30 s
        ServerSettings.from_env(env | {"GEMMA4_MEDIA_MAX_AUDIO_SECONDS": "60"})


def test_speculative_decoding_settings(tmp_path):
    s = ServerSettings.from_env({"GEMMA4_ARTIFACT": str(tmp_path)}).speculative
    assert (s.method, s.k, s.lookup_min, s.lookup_max) == ("auto", None, 2, 4)
    env = {"GEMMA4_ARTIFACT": str(tmp_path), "GEMMA4_SPEC_METHOD": "lookup", "GEMMA4_SPEC_K": "6"}
    s = ServerSettings.from_env(env | {"GEMMA4_SPEC_LOOKUP_MIN": "3", "GEMMA4_SPEC_LOOKUP_MAX": "3"}).speculative
    assert (s.method, s.k, s.lookup_min, s.lookup_max) == ("lookup", 6, 3, 3)
