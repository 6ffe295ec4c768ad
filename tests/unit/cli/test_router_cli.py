"""`inferflux router`: exit 2 for a missing or invalid replica list, the flags in --help."""

from __future__ import annotations

from tests.unit.cli.test_serve import run_cli


def test_no_replica_exits_2_saying_where_to_give_them() -> None:
    result = run_cli("router")
    assert result.returncode == 2
    assert "--replica" in result.stderr and "Traceback" not in result.stderr


def test_a_replica_that_is_not_a_url_exits_2_naming_the_key() -> None:
    result = run_cli("router", "--replica", "localhost:8080")
    assert result.returncode == 2
    assert "router.replicas" in result.stderr and "http://" in result.stderr


def test_help_lists_the_flags() -> None:
    result = run_cli("router", "--help")
    assert result.returncode == 0
    for flag in ("--replica", "--redis", "--host", "--port", "--config"):
        assert flag in result.stdout
