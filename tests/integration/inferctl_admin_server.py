"""A real `inferflux serve` with authentication on and an encrypted policy store, and a
runner for `inferctl admin ...` against it: shared by the test_inferctl_admin* modules
(each module starts its own server: the fixture is module-scoped)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from inferflux.cli.inferctl import app
from tests.integration.server_process import ServerProcess

ADMIN_KEY = "sk-test-ctl-admin-0123456789"
GENERATE_KEY = "sk-test-ctl-generate-0123456789"
PASSPHRASE = "inferctl admin test passphrase"
runner = CliRunner()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`inferflux serve` with an admin and a generate-only key (config) and a policy store."""
    folder = tmp_path_factory.mktemp("inferctl-admin")
    config = {
        "auth": {
            "api_keys": [
                {"key": ADMIN_KEY, "id": "ops", "roles": ["admin"]},
                {"key": GENERATE_KEY, "id": "app", "scopes": ["generate", "read"]},
            ]
        }
    }
    (folder / "inferflux.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {
        "INFERFLUX_POLICY_STORE": str(folder / "policy.store"),
        "INFERFLUX_POLICY_PASSPHRASE": PASSPHRASE,
    }
    log = folder / "server.log"
    process = ServerProcess("--config", str(folder / "inferflux.yaml"), env=env, log_path=log)
    try:
        process.wait_ready(180.0)
    except (RuntimeError, TimeoutError) as exc:
        process.close()
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")
    yield process.url
    process.close()


def cli(server: str, *args: str, key: str = ADMIN_KEY) -> Result:
    """`inferctl admin ARGS --url SERVER` with INFERCTL_API_KEY=key; never a traceback."""
    result = runner.invoke(app, ["admin", *args, "--url", server], env={"INFERCTL_API_KEY": key})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def ok(server: str, *args: str, key: str = ADMIN_KEY) -> Result:
    """`cli`, which must exit 0."""
    result = cli(server, *args, key=key)
    assert result.exit_code == 0, result.output
    return result


def as_json(server: str, *args: str) -> dict:
    """`ok` with --json, decoded."""
    return json.loads(ok(server, *args, "--json").stdout)


def status_with(server: str, key: str, path: str = "/v1/models") -> int:
    return httpx.get(f"{server}{path}", headers={"authorization": f"Bearer {key}"}).status_code
