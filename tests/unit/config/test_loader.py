"""load_settings: YAML < env < CLI precedence, env names, and errors that name key/value/source."""

from __future__ import annotations

import pytest

from inferflux.config.loader import ENV_ALIASES, load_settings
from inferflux.config.settings import Settings
from inferflux.errors import ConfigError


@pytest.fixture
def write_yaml(tmp_path):
    def write(text: str, name: str = "inferflux.yaml"):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


def _error(**kwargs) -> str:
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as info:
        load_settings(**kwargs)
    return str(info.value)


def test_no_layers_gives_schema_defaults():
    assert load_settings(env={}) == Settings()


def test_os_environ_is_read_when_env_not_given(monkeypatch):
    monkeypatch.setenv("INFERFLUX_SERVER__PORT", "9123")
    assert load_settings().server.port == 9123


def test_yaml_file_sets_values(write_yaml):
    path = write_yaml("server:\n  port: 9000\nscheduler:\n  max_num_seqs: 4\n")
    settings = load_settings(path, env={})
    assert settings.server.port == 9000
    assert settings.scheduler.max_num_seqs == 4
    assert settings.server.host == "127.0.0.1"  # untouched keys keep their defaults


def test_env_overrides_file_and_cli_overrides_env(write_yaml):
    path = write_yaml("server:\n  port: 9000\n  host: 0.0.0.0\nruntime:\n  workers: 2\n")
    env = {"INFERFLUX_SERVER__PORT": "9001", "INFERFLUX_RUNTIME__WORKERS": "3"}
    settings = load_settings(path, env=env, overrides={"server.port": 9002})
    assert settings.server.port == 9002  # CLI > env > file
    assert settings.runtime.workers == 3  # env > file
    assert settings.server.host == "0.0.0.0"  # file > default


def test_none_overrides_are_skipped():
    settings = load_settings(
        env={"INFERFLUX_SERVER__PORT": "9001"}, overrides={"server.port": None}
    )
    assert settings.server.port == 9001


def test_nested_env_names_are_case_insensitive_after_prefix_and_coerced():
    env = {
        "INFERFLUX_SERVER__PORT": "9100",
        "INFERFLUX_RUNTIME__IN_PROCESS": "true",
        "INFERFLUX_RUNTIME__WORKER_START_TIMEOUT_S": "12.5",
        "INFERFLUX_OBSERVABILITY__DEBUG_PROMPTS": "1",
    }
    settings = load_settings(env=env)
    assert settings.server.port == 9100
    assert settings.runtime.in_process is True
    assert settings.runtime.worker_start_timeout_s == 12.5
    assert settings.observability.debug_prompts is True


@pytest.mark.parametrize(
    ("name", "value", "attr", "expected"),
    [
        ("INFERFLUX_MODEL_PATH", "/models/a.gguf", ("model", "path"), "/models/a.gguf"),
        ("INFERFLUX_MODEL_ID", "smol", ("model", "id"), "smol"),
        ("INFERFLUX_HOST", "0.0.0.0", ("server", "host"), "0.0.0.0"),
        ("INFERFLUX_PORT", "8181", ("server", "port"), 8181),
        ("INFERFLUX_WORKERS", "2", ("runtime", "workers"), 2),
        ("INFERFLUX_LOG_LEVEL", "debug", ("observability", "log_level"), "debug"),
        ("INFERFLUX_LOG_FORMAT", "json", ("observability", "log_format"), "json"),
    ],
)
def test_env_aliases(name, value, attr, expected):
    section, key = attr
    settings = load_settings(env={name: value})
    assert getattr(getattr(settings, section), key) == expected


def test_every_alias_names_a_schema_key():
    for dotted in ENV_ALIASES.values():
        *sections, key = dotted.split(".")
        node: object = Settings()
        for section in sections:
            node = getattr(node, section)
        assert key in type(node).model_fields


@pytest.mark.parametrize("order", ["alias_first", "nested_first"])
def test_nested_env_name_beats_alias_whatever_the_order(order):
    pairs = [("INFERFLUX_PORT", "7001"), ("INFERFLUX_SERVER__PORT", "7002")]
    if order == "nested_first":
        pairs.reverse()
    assert load_settings(env=dict(pairs)).server.port == 7002


def test_unrelated_env_vars_are_ignored():
    env = {"PORT": "1", "INFERFLUXPORT": "2", "INFERFLUX_UNKNOWN": "3", "HOME": "/root"}
    assert load_settings(env=env) == Settings()


def test_alias_is_overridden_by_cli():
    settings = load_settings(
        env={"INFERFLUX_MODEL_PATH": "/a.gguf"}, overrides={"model.path": "/b"}
    )
    assert settings.model.path == "/b"


def test_unknown_key_in_file_is_named(write_yaml):
    path = write_yaml("server:\n  prot: 9000\n")
    message = _error(config_file=path)
    assert "server.prot" in message
    assert f"file {path}" in message
    assert "unknown key" in message


def test_unknown_section_in_file_names_section_and_source(write_yaml):
    path = write_yaml("serer:\n  port: 9000\n")
    message = _error(config_file=path)
    assert "serer" in message
    assert f"file {path}" in message


def test_unknown_key_in_env_names_key_and_env_var():
    message = _error(env={"INFERFLUX_SERVER__PROT": "9000"})
    assert "server.prot" in message
    assert "env INFERFLUX_SERVER__PROT" in message


def test_unknown_section_in_env_names_env_var():
    message = _error(env={"INFERFLUX_NOPE__X": "1"})
    assert "nope" in message
    assert "env INFERFLUX_NOPE__X" in message


def test_unknown_cli_override_is_named():
    message = _error(overrides={"server.bogus": 1})
    assert "server.bogus" in message
    assert "command line" in message


def test_wrong_type_from_env_names_key_value_and_source():
    message = _error(env={"INFERFLUX_SERVER__PORT": "eighty"})
    assert "server.port" in message
    assert "'eighty'" in message
    assert "env INFERFLUX_SERVER__PORT" in message


def test_out_of_range_from_file_names_key_value_and_source(write_yaml):
    path = write_yaml("server:\n  port: 70000\n")
    message = _error(config_file=path)
    assert "server.port = 70000" in message
    assert f"file {path}" in message
    assert "65535" in message


def test_out_of_range_from_alias_names_alias():
    message = _error(env={"INFERFLUX_WORKERS": "0"})
    assert "runtime.workers = '0'" in message
    assert "env INFERFLUX_WORKERS" in message


def test_bad_literal_from_cli_names_key_value_and_source():
    message = _error(overrides={"observability.log_level": "verbose"})
    assert "observability.log_level = 'verbose'" in message
    assert "command line" in message


def test_every_error_is_reported_at_once(write_yaml):
    path = write_yaml("server:\n  port: 0\n")
    message = _error(config_file=path, env={"INFERFLUX_SCHEDULER__MAX_NUM_SEQS": "0"})
    assert "server.port" in message
    assert "scheduler.max_num_seqs" in message


def test_value_overridden_by_a_valid_layer_is_not_an_error(write_yaml):
    path = write_yaml("server:\n  port: 0\n")
    assert load_settings(path, env={"INFERFLUX_PORT": "8081"}).server.port == 8081


def test_missing_file_is_a_config_error(tmp_path):
    message = _error(config_file=tmp_path / "absent.yaml")
    assert "absent.yaml" in message
    assert "does not exist" in message


def test_directory_as_file_is_a_config_error(tmp_path):
    assert "cannot be read" in _error(config_file=tmp_path)


def test_invalid_yaml_is_a_config_error(write_yaml):
    path = write_yaml("server:\n  port: [9000\n")
    message = _error(config_file=path)
    assert "not valid YAML" in message
    assert str(path) in message


def test_non_mapping_yaml_is_a_config_error(write_yaml):
    path = write_yaml("- server\n- port\n")
    assert "must hold a mapping" in _error(config_file=path)


def test_empty_file_and_empty_section_mean_defaults(write_yaml):
    assert load_settings(write_yaml(""), env={}) == Settings()
    commented = write_yaml("server:\n  # port: 9000\nruntime:\n", name="sections.yaml")
    assert load_settings(commented, env={}) == Settings()


def test_section_given_as_scalar_is_a_config_error(write_yaml):
    path = write_yaml("server: 8080\n")
    message = _error(config_file=path)
    assert "server" in message
    assert f"file {path}" in message


def test_env_key_under_scalar_section_is_a_config_error(write_yaml):
    path = write_yaml("server: 8080\n")
    message = _error(config_file=path, env={"INFERFLUX_SERVER__PORT": "1"})
    assert "server.port" in message
    assert "env INFERFLUX_SERVER__PORT" in message


def test_security_sections_validate_and_never_quote_secrets():
    from inferflux.errors import ConfigError

    settings = load_settings(
        env={"INFERFLUX_REDIS_URL": "redis://:pw@h:6379/0", "INFERFLUX_AUDIT_HMAC_KEY": "k" * 32}
    )
    assert settings.redis.url is not None and "pw" not in repr(settings.redis)
    assert settings.rate_limit.redis_failure_mode == "local"
    for env, key in (
        ({"INFERFLUX_AUDIT_HMAC_KEY": "short-secret"}, "audit.hmac_key"),
        ({"INFERFLUX_REDIS_URL": "http://secret-host"}, "redis.url"),
        ({"INFERFLUX_GUARDRAILS__PII": "maybe"}, "guardrails.pii"),
        (
            {"INFERFLUX_RATE_LIMIT__REDIS_FAILURE_MODE": "sometimes"},
            "rate_limit.redis_failure_mode",
        ),
    ):
        with pytest.raises(ConfigError) as error:
            load_settings(env=env)
        assert key in error.value.message
        assert "short-secret" not in error.value.message
        assert "secret-host" not in error.value.message
    with pytest.raises(ConfigError, match="blocklist_regex"):
        load_settings(overrides={"guardrails.blocklist_regex": ["(a)\\1"]}, env={})


def test_api_keys_come_from_the_environment_as_a_json_list() -> None:
    digest = "ab" * 32
    env = {
        "INFERFLUX_AUTH__API_KEYS": f'[{{"id": "ops", "sha256": "{digest}", "roles": ["admin"]}}]'
    }
    keys = load_settings(env=env).auth.api_keys
    assert [(k.id, k.sha256, k.roles) for k in keys] == [("ops", digest, ["admin"])]
    with pytest.raises(ConfigError, match="JSON list of keys") as caught:
        load_settings(env={"INFERFLUX_AUTH__API_KEYS": "sk-not-json-secret"})
    assert "sk-not-json-secret" not in caught.value.message  # a key is never quoted


def test_the_gpu_fault_injection_is_off_unless_set(tmp_path) -> None:
    """INFERFLUX_FAULT_GPU_INIT (docs/reliability.md) is inert by default; a bare YAML
    `off` (false to YAML 1.1) is `off` too."""
    assert load_settings(env={}).runtime.fault_gpu_init == "off"
    env = {"INFERFLUX_FAULT_GPU_INIT": "crash"}
    assert load_settings(env=env).runtime.fault_gpu_init == "crash"
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\n  fault_gpu_init: off\n  gpu_fallback_after_crashes: 2\n")
    runtime = load_settings(path, env={}).runtime
    assert runtime.fault_gpu_init == "off" and runtime.gpu_fallback
    with pytest.raises(ConfigError, match="fault_gpu_init"):
        load_settings(env={"INFERFLUX_FAULT_GPU_INIT": "explode"})
