"""`inferctl admin api-keys|tenants|rate-limit|guardrails` against one real server with
authentication on and an encrypted policy store: each change is checked by what the
server then does (a created key works, a rotated or revoked one gets 401, a tenant over
its limit gets 429, a blocklisted word is refused), and the exit codes (0 ok, 1 API
error, 2 usage error) come without a traceback.

`inferctl admin config`: test_inferctl_admin_config.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result

from inferflux.cli.inferctl import app
from tests.integration.inferctl_admin_server import (
    GENERATE_KEY,
    as_json,
    cli,
    ok,
    runner,
    server,
    status_with,
)

pytestmark = [pytest.mark.model, pytest.mark.server]
__all__ = ["server"]  # the module-scoped fixture


def printed_key(result: Result) -> str:
    keys = [line.removeprefix("key: ") for line in result.stdout.splitlines() if "key: " in line]
    assert len(keys) == 1, result.stdout
    return keys[0]


def test_create_prints_the_key_once_and_it_works(server):
    created = ok(server, "api-keys", "create", "--scope", "read", "--name", "ci", "--rpm", "600")
    key = printed_key(created)
    assert key.startswith("sk-") and "only time the key is shown" in created.stdout
    assert "requests/min 600" in created.stdout
    assert status_with(server, key) == 200
    key_id = created.stdout.splitlines()[1].split()[0]
    listed = ok(server, "api-keys", "list")
    shown = ok(server, "api-keys", "show", key_id)
    assert key_id in listed.stdout and "'ci'" in shown.stdout
    for output in (listed.stdout, shown.stdout, json.dumps(as_json(server, "api-keys", "list"))):
        assert key not in output and key[-12:] not in output
    assert as_json(server, "api-keys", "show", key_id)["limits"]["requests_per_minute"] == 600


def test_create_json_carries_the_key_and_the_options(server):
    answer = as_json(
        server, "api-keys", "create", "--role", "user", "--priority-cap", "low",
        "--expires-in", "30d", "--model", "some-model",
    )  # fmt: skip
    assert answer["key"].startswith("sk-")
    assert answer["priority_cap"] == "low" and answer["allowed_models"] == ["some-model"]
    assert answer["expires_at"] - answer["created_at"] == pytest.approx(30 * 86_400, abs=5)
    assert set(answer["scopes"]) >= {"generate", "read"}


def test_rotate_gives_a_new_key_and_the_old_one_gets_401(server):
    created = as_json(server, "api-keys", "create", "--scope", "read")
    old, old_id = created["key"], created["id"]
    rotated_text = ok(server, "api-keys", "rotate", old_id)
    assert f"replaces {old_id}" in rotated_text.stdout
    new_id = rotated_text.stdout.splitlines()[1].split()[0]
    rotated = {"id": new_id, "key": printed_key(rotated_text)}
    assert rotated["id"] != old_id
    assert status_with(server, old) == 401
    assert status_with(server, rotated["key"]) == 200
    again = cli(server, "api-keys", "rotate", old_id)
    assert again.exit_code == 1 and "409" in again.output and "revoked" in again.output


def test_revoke_makes_the_key_fail_with_401(server):
    created = as_json(server, "api-keys", "create", "--scope", "read")
    assert status_with(server, created["key"]) == 200
    revoked = ok(server, "api-keys", "revoke", created["id"])
    assert f"revoked {created['id']}" in revoked.stdout
    assert status_with(server, created["key"]) == 401
    assert "REVOKED" in ok(server, "api-keys", "show", created["id"]).stdout
    config_key = cli(server, "api-keys", "revoke", "ops")
    assert config_key.exit_code == 1 and "config" in config_key.output


def test_tenants_create_show_update_delete(server):
    created = ok(
        server, "tenants", "create", "ctl-acme", "--rpm", "100", "--priority-cap", "normal"
    )
    assert "created tenant ctl-acme" in created.stdout and "requests/min 100" in created.stdout
    assert "ctl-acme" in ok(server, "tenants", "list").stdout
    ok(server, "tenants", "update", "ctl-acme", "--tpm", "5000", "--share-prefix-cache")
    shown = as_json(server, "tenants", "show", "ctl-acme")
    assert shown["limits"]["requests_per_minute"] == 100  # kept
    assert shown["limits"]["tokens_per_minute"] == 5000
    assert shown["share_prefix_cache"] is True and shown["priority_cap"] == "normal"
    ok(server, "tenants", "update", "ctl-acme", "--rpm", "unlimited")
    assert as_json(server, "tenants", "show", "ctl-acme")["limits"]["requests_per_minute"] is None
    duplicate = cli(server, "tenants", "create", "ctl-acme")
    assert duplicate.exit_code == 1 and "409" in duplicate.output
    key = as_json(server, "api-keys", "create", "--scope", "read", "--tenant", "ctl-acme")
    busy = cli(server, "tenants", "delete", "ctl-acme")
    assert busy.exit_code == 1 and "active key" in busy.output
    ok(server, "api-keys", "revoke", key["id"])
    assert "deleted tenant ctl-acme" in ok(server, "tenants", "delete", "ctl-acme").stdout
    gone = cli(server, "tenants", "show", "ctl-acme")
    assert gone.exit_code == 1 and "404" in gone.output


def test_a_tenant_limit_set_here_refuses_the_next_request_with_429(server):
    ok(server, "tenants", "create", "ctl-limited")
    key = as_json(server, "api-keys", "create", "--scope", "read", "--tenant", "ctl-limited")["key"]
    changed = ok(server, "rate-limit", "--tenant", "ctl-limited", "--set", "2")
    assert "tenant ctl-limited: requests/min 2" in changed.stdout
    assert [status_with(server, key) for _ in range(3)] == [200, 200, 429]
    shown = as_json(server, "rate-limit")
    assert shown["tenants"]["ctl-limited"]["requests_per_minute"] == 2


def test_default_and_tier_limits(server):
    ok(server, "rate-limit", "--tier", "ctl-gold", "--tpm", "100000", "--concurrent", "8")
    ok(server, "rate-limit", "--tier", "ctl-gold", "--rpm", "600")
    tiers = as_json(server, "rate-limit")["tiers"]
    assert tiers["ctl-gold"] == {
        "requests_per_minute": 600,
        "tokens_per_minute": 100000,
        "max_concurrent": 8,
    }
    tiered = as_json(server, "api-keys", "create", "--scope", "read", "--tier", "ctl-gold")
    assert tiered["rate_limit_tier"] == "ctl-gold"
    removed = ok(server, "rate-limit", "--tier", "ctl-gold", "--remove")
    assert "ctl-gold" not in removed.stdout
    ok(server, "rate-limit", "--default", "--concurrent", "64")
    assert as_json(server, "rate-limit")["default"]["max_concurrent"] == 64
    ok(server, "rate-limit", "--concurrent", "unlimited")
    assert "default: requests/min unlimited  tokens/min unlimited  concurrent unlimited" in (
        ok(server, "rate-limit").stdout
    )


def test_a_blocklisted_word_is_refused_then_allowed_again(server):
    prompt = [
        "chat",
        "--url",
        server,
        "--message",
        "user:Tell me about zorblax",
        "--max-tokens",
        "2",
    ]
    env = {"INFERCTL_API_KEY": GENERATE_KEY}
    added = ok(server, "guardrails", "--add-word", "zorblax", "--add-regex", r"\bctl\d+")
    assert "blocklist: zorblax" in added.stdout
    refused = runner.invoke(app, prompt, env=env)
    assert refused.exit_code == 1 and "400" in refused.output
    ok(server, "guardrails", "--remove-word", "zorblax", "--remove-regex", r"\bctl\d+")
    assert runner.invoke(app, prompt, env=env).exit_code == 0
    missing = cli(server, "guardrails", "--remove-word", "zorblax")
    assert missing.exit_code == 2 and "not in the blocklist" in missing.output


def test_guardrails_pii_and_opa_settings(server):
    answer = as_json(
        server, "guardrails", "--set", "pii", "--opa", "http://127.0.0.1:9/v1/data/x",
        "--opa-fail-open",
    )  # fmt: skip
    assert answer["pii_action"] == "block"
    assert answer["opa_endpoint"] == "http://127.0.0.1:9/v1/data/x" and answer["opa_fail_open"]
    shown = ok(server, "guardrails", "--pii", "redact", "--no-opa", "--opa-fail-closed").stdout
    assert "pii: redact" in shown and "opa: off" in shown
    ok(server, "guardrails", "--pii", "off")
    bad_url = cli(server, "guardrails", "--opa", "ftp://example")
    assert bad_url.exit_code == 1 and "http" in bad_url.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["guardrails", "--set", "secret,pii"], "no guardrail of that name"),
        (["guardrails", "--pii", "sometimes"], "off, redact, block"),
        (["rate-limit", "--rpm", "0"], "'unlimited'"),
        (["rate-limit", "--tenant", "a", "--tier", "b", "--rpm", "1"], "one of"),
        (["rate-limit", "--tenant", "a"], "give the limits"),
        (["rate-limit", "--default", "--remove"], "--remove goes with --tier"),
        (["api-keys", "create", "--name", "x"], "--scope"),
        (["api-keys", "create", "--scope", "write"], "generate, read, admin"),
        (["api-keys", "create", "--role", "user", "--priority-cap", "top"], "high, normal, low"),
        (["api-keys", "create", "--scope", "read", "--expires-in", "soon"], "duration"),
        (["api-keys", "show", "a/b"], "not an id"),
        (["tenants", "update", "x", "--model", "m", "--any-model"], "not both"),
    ],
)
def test_bad_input_exits_2_with_a_message(server, args, message):
    result = cli(server, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_bad_input_in_a_real_process_has_no_traceback(server):
    inferctl = str(Path(sys.executable).with_name("inferctl"))
    done = subprocess.run(
        [inferctl, "admin", "rate-limit", "--set", "lots", "--url", server],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "'lots'" in done.stderr and "Traceback" not in done.stderr


def test_a_key_without_the_admin_scope_exits_1_with_403(server):
    for args in (["api-keys", "list"], ["rate-limit", "--set", "5"], ["guardrails"]):
        result = cli(server, *args, key=GENERATE_KEY)
        assert result.exit_code == 1, result.output
        assert "403" in result.output
    missing = cli(server, "tenants", "list", key="")
    assert missing.exit_code == 1 and "401" in missing.output
