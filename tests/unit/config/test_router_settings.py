"""The `router` section: replica URLs from flags, env (JSON or commas) and file; secrets."""

from __future__ import annotations

import pytest
import yaml

from inferflux.config.loader import load_settings
from inferflux.errors import ConfigError


def test_defaults_bind_loopback_on_8090():
    router = load_settings(env={}).router
    assert (router.host, router.port, router.routing) == ("127.0.0.1", 8090, "prefix_affinity")
    assert router.replicas == []


@pytest.mark.parametrize(
    "value", ['["http://a:8080", "http://b:8080/"]', "http://a:8080, http://b:8080"]
)
def test_replicas_from_env_as_json_or_commas(value):
    router = load_settings(env={"INFERFLUX_ROUTER__REPLICAS": value}).router
    assert router.replicas == ["http://a:8080", "http://b:8080"]


def test_replicas_from_the_config_file(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"router": {"replicas": ["http://a:1"], "port": 9000}}))
    router = load_settings(path, env={}).router
    assert router.replicas == ["http://a:1"] and router.port == 9000


@pytest.mark.parametrize(
    ("replicas", "says"),
    [(["a:8080"], "not an http(s) URL"), (["http://a:1", "http://a:1/"], "twice")],
)
def test_bad_replica_lists_name_the_key_and_the_fix(replicas, says):
    with pytest.raises(ConfigError) as raised:
        load_settings(env={}, overrides={"router.replicas": replicas})
    assert "router" in raised.value.message and says in raised.value.message


def test_secrets_are_never_quoted():
    env = {"INFERFLUX_ROUTER__REDIS_URL": "redis://:hunter2@h:6379/0",
           "INFERFLUX_ROUTER__STATS_API_KEY": "sk-canary",
           "INFERFLUX_ROUTER__PORT": "0"}  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        load_settings(env=env)
    assert "hunter2" not in raised.value.message and "sk-canary" not in raised.value.message
    settings = load_settings(env={k: v for k, v in env.items() if "PORT" not in k})
    assert "hunter2" not in repr(settings.router) and "sk-canary" not in repr(settings.router)
