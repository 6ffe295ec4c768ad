"""The pure parts of `inferctl admin ...`: limit and duration values, merging limits,
editing the guardrail policy, and `admin config --set` nesting and its dotted view.
Against a real server: tests/integration/test_inferctl_admin*.py."""

from __future__ import annotations

import hashlib

import pytest
import typer

from inferflux.cli.inferctl.admin import mmproj_fields
from inferflux.cli.inferctl.admin_config import _config_lines, flatten, nest
from inferflux.cli.inferctl.admin_keys import parse_duration
from inferflux.cli.inferctl.admin_policy import (
    UNLIMITED,
    GuardrailChange,
    merge_limits,
    parse_limit,
)


def test_a_limit_is_a_positive_number_or_unlimited():
    assert parse_limit("200") == 200
    assert parse_limit("Unlimited") == UNLIMITED
    for bad in ("0", "-3", "2.5", "lots", ""):
        with pytest.raises(typer.BadParameter, match="unlimited"):
            parse_limit(bad)


def test_durations():
    assert parse_duration("3600") == 3600
    assert parse_duration("90s") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("12h") == 12 * 3600
    assert parse_duration("30d") == 30 * 86_400
    for bad in ("0", "soon", "3w", "-1d"):
        with pytest.raises(typer.BadParameter, match="duration"):
            parse_duration(bad)


def test_merge_keeps_what_is_not_given_and_unlimited_drops_a_limit():
    current = {"requests_per_minute": 10, "tokens_per_minute": None, "max_concurrent": 4}
    assert merge_limits(current, None, 500, None) == {
        "requests_per_minute": 10,
        "tokens_per_minute": 500,
        "max_concurrent": 4,
    }
    assert merge_limits(current, UNLIMITED, None, None) == {"max_concurrent": 4}
    assert merge_limits(None, None, None, None) == {}


def change(**given) -> GuardrailChange:
    fields = dict.fromkeys(("add_word", "remove_word", "add_regex", "remove_regex"), [])
    fields.update(pii=None, opa=None, no_opa=False, opa_fail_open=None)
    return GuardrailChange(**{**fields, **given})


CURRENT = {
    "blocklist": ["alpha", "beta"],
    "blocklist_regex": ["x+"],
    "invalid_blocklist_regex": [],
    "pii_action": "redact",
    "opa_endpoint": "http://opa:8181/v1/data/x",
    "opa_fail_open": True,
}


def test_a_guardrail_change_edits_only_what_it_names():
    assert not change().any()
    body = change(add_word=["gamma", "alpha", "gamma"], remove_word=["beta"]).apply(CURRENT)
    assert body["blocklist"] == ["alpha", "gamma"]
    assert body["blocklist_regex"] == ["x+"] and body["pii_action"] == "redact"
    assert body["opa_endpoint"] == CURRENT["opa_endpoint"] and body["opa_fail_open"] is True
    assert "invalid_blocklist_regex" not in body
    off = change(no_opa=True, opa_fail_open=False, pii="off").apply(CURRENT)
    assert off["opa_endpoint"] is None and off["opa_fail_open"] is False
    assert off["pii_action"] == "off"


def test_removing_what_is_not_there_is_a_usage_error():
    with pytest.raises(typer.Exit) as exc:
        change(remove_regex=["y+"]).apply(CURRENT)
    assert exc.value.exit_code == 2


def test_set_values_nest_like_the_config_file():
    body = nest(["scheduler.stream_interval=2", "scheduler.fairness.enable_preemption=false",
                 "observability.log_level=debug", "observability.tenant_logging={}"])  # fmt: skip
    assert body == {
        "scheduler": {"stream_interval": 2, "fairness": {"enable_preemption": False}},
        "observability": {"log_level": "debug", "tenant_logging": {}},
    }
    assert nest(["a.b=null", "a.c=[1, 2]", "a.d=x=y"]) == {
        "a": {"b": None, "c": [1, 2], "d": "x=y"}
    }


@pytest.mark.parametrize(
    "sets", [["a"], ["a=1"], [".a=1"], ["a..b=1"], ["a.b=1", "a.b=2"], ["a.b=1", "a.b.c=2"]]
)
def test_malformed_or_clashing_sets_are_usage_errors(sets):
    with pytest.raises(typer.Exit) as exc:
        nest(sets)
    assert exc.value.exit_code == 2


def test_the_view_is_dotted_with_live_keys_and_entries_marked():
    answer = {
        "config": {
            "scheduler": {"stream_interval": 1, "prefix_cache": {"enabled": True}},
            "observability": {"tenant_logging": {"acme": {"log_level": "debug"}}, "x": {}},
        },
        "live": ["scheduler.stream_interval", "observability.tenant_logging"],
        "changed": [],
    }
    assert list(flatten(answer["config"]))[1] == ("scheduler.prefix_cache.enabled", True)
    assert _config_lines(answer) == [
        "changed: nothing (same values)",
        "scheduler.stream_interval = 1  (live)",
        "scheduler.prefix_cache.enabled = true",
        'observability.tenant_logging.acme.log_level = "debug"  (live)',
        "observability.x = {}",
    ]


def test_mmproj_fields_hash_a_local_file_and_leave_urls_to_the_server(tmp_path):
    projector = tmp_path / "mmproj.gguf"
    projector.write_bytes(b"projector")
    digest = hashlib.sha256(b"projector").hexdigest()
    assert mmproj_fields(None, None) == {}
    assert mmproj_fields(str(projector), None) == {
        "mmproj": str(projector),
        "mmproj_sha256": digest,
    }
    assert mmproj_fields("p.gguf", "ab" * 32) == {"mmproj": "p.gguf", "mmproj_sha256": "ab" * 32}
    assert mmproj_fields("hf://o/r/p.gguf", None) == {"mmproj": "hf://o/r/p.gguf"}
    with pytest.raises(typer.Exit):  # not a file here and no hash: a usage error
        mmproj_fields(str(tmp_path / "elsewhere.gguf"), None)
