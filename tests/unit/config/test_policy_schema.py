"""One declaration per policy concept: the config file and the admin API accept and refuse
the same rate limits and guardrail rules (config/policy_schema.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferflux.api.admin.protocol import GuardrailsBody, LimitsBody
from inferflux.api.errors import invalid_request_from
from inferflux.config.auth_settings import ApiKeySettings, TenantSettings
from inferflux.config.policy_schema import GuardrailRules, LimitFields
from inferflux.config.security_settings import GuardrailSettings, RateLimitSettings
from inferflux.errors import Unprocessable

LIMITS = [
    {"requests_per_minute": 1},
    {"requests_per_minute": 0},
    {"requests_per_minute": 10_000_000},
    {"requests_per_minute": 10_000_001},
    {"tokens_per_minute": 10_000_000_000},
    {"tokens_per_minute": 10_000_000_001},
    {"max_concurrent": 100_000},
    {"max_concurrent": 100_001},
    {"max_concurrent": None},
]
RULES = [
    {"blocklist": ["launch codes"]},
    {"blocklist": ["   "]},
    {"blocklist": ["x" * 257]},
    {"blocklist_regex": [r"\bpwd\d+"]},
    {"blocklist_regex": [r"(a)\1"]},
    {"blocklist_regex": ["a(?=b)"]},
    {"blocklist_regex": ["("]},
    {"pii_action": "redact"},
    {"pii": "block"},
    {"pii_action": "maybe"},
    {"opa_endpoint": "http://127.0.0.1:8181/v1/data/x"},
    {"opa_endpoint": "file:///etc/passwd"},
    {"opa_endpoint": "http://"},
]


def _accepts(model: type, values: dict) -> bool:
    try:
        model.model_validate(values)
    except ValidationError:
        return False
    return True


def _key(values: dict) -> dict:
    return {"key": "a-long-enough-key", "scopes": ["read"], **values}


@pytest.mark.parametrize("values", LIMITS)
def test_every_path_takes_the_same_limits(values: dict) -> None:
    expected = _accepts(LimitFields, values)
    assert _accepts(LimitsBody, values) == expected
    assert _accepts(RateLimitSettings, values) == expected
    assert _accepts(RateLimitSettings, {"tiers": {"gold": values}}) == expected
    assert _accepts(ApiKeySettings, _key(values)) == expected
    assert _accepts(TenantSettings, {"name": "acme", **values}) == expected


@pytest.mark.parametrize("values", RULES)
def test_the_config_file_and_the_admin_api_take_the_same_guardrail_rules(values: dict) -> None:
    expected = _accepts(GuardrailRules, values)
    assert _accepts(GuardrailsBody, values) == expected
    assert _accepts(GuardrailSettings, values) == expected


def test_the_bodies_and_sections_derive_from_the_one_declaration() -> None:
    for model in (LimitsBody, RateLimitSettings, ApiKeySettings, TenantSettings):
        assert issubclass(model, LimitFields)
    for model in (GuardrailsBody, GuardrailSettings):
        assert issubclass(model, GuardrailRules)


@pytest.mark.parametrize("pattern", [r"(a)\1", "a(?=b)", "(?<=a)b", "("])
def test_a_pattern_re2_cannot_run_is_a_422_naming_it(pattern: str) -> None:
    with pytest.raises(ValidationError) as caught:
        GuardrailsBody.model_validate({"blocklist_regex": ["fine", pattern]})
    error = invalid_request_from(caught.value.errors())
    assert isinstance(error, Unprocessable)
    assert error.param == "blocklist_regex[1]" and repr(pattern) in error.message


def test_a_malformed_field_beside_an_unusable_pattern_is_a_400() -> None:
    with pytest.raises(ValidationError) as caught:
        GuardrailsBody.model_validate({"blocklist_regex": [r"(a)\1"], "pii_action": 3})
    error = invalid_request_from(caught.value.errors())
    assert error.http_status == 400 and error.param == "pii_action"


def test_the_admin_body_stays_strict() -> None:
    assert not _accepts(LimitsBody, {"requests_per_minute": "60"})
    assert not _accepts(LimitsBody, {"requests_per_minute": 60, "extra": 1})
    assert not _accepts(GuardrailsBody, {"opa_fail_open": "true"})
    assert _accepts(RateLimitSettings, {"requests_per_minute": "60"})  # env vars are strings
