"""The `multimodal` section: safe defaults, env names, the allow-list's checks."""

from __future__ import annotations

import pytest

from inferflux.config.loader import load_settings
from inferflux.errors import ConfigError


def test_defaults_are_closed():
    multimodal = load_settings(env={}).multimodal
    assert multimodal.allow_urls is False
    assert multimodal.url_allowlist == []
    assert multimodal.max_image_bytes == 20 * 1024 * 1024
    assert multimodal.max_pixels == 7680 * 4320
    assert multimodal.max_images_per_request == 16
    assert multimodal.fetch_timeout_s == 10.0


def test_env_names_and_a_comma_separated_allowlist():
    env = {
        "INFERFLUX_MULTIMODAL__ALLOW_URLS": "true",
        "INFERFLUX_MULTIMODAL__URL_ALLOWLIST": "Images.Example.com, 10.0.0.0/8,::1",
        "INFERFLUX_MULTIMODAL__MAX_PIXELS": "1000000",
    }
    multimodal = load_settings(env=env).multimodal
    assert multimodal.allow_urls is True
    assert multimodal.url_allowlist == ["images.example.com", "10.0.0.0/8", "::1"]
    assert multimodal.max_pixels == 1_000_000


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("URL_ALLOWLIST", "10.0.0.0/99", "is not a network"),
        ("MAX_PIXELS", "500000000", "multimodal.max_pixels"),
        ("FETCH_TIMEOUT_S", "0", "multimodal.fetch_timeout_s"),
    ],
)
def test_bad_values_name_the_key(name, value, needle):
    with pytest.raises(ConfigError) as caught:
        load_settings(env={f"INFERFLUX_MULTIMODAL__{name}": value})
    assert needle in str(caught.value)
