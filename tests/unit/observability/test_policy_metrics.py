"""The policy gauges: the running version always, replication's only with replication."""

from __future__ import annotations

from prometheus_client import generate_latest

from inferflux.observability.metrics import Metrics
from inferflux.security.policy_sync import PolicySyncStatus


def _metrics() -> Metrics:
    return Metrics(model="m", info={"backend": "llama.cpp"}, workers=list)


def _status(*, redis_up: bool, lag_s: float | None) -> PolicySyncStatus:
    return PolicySyncStatus(7, redis_up, None, lag_s, 0, 0, 0)


def test_the_version_alone_without_replication():
    metrics = _metrics()
    metrics.watch_policy(lambda: 4, None)
    text = generate_latest(metrics.registry).decode()
    assert "inferflux_policy_version 4.0" in text
    assert "inferflux_policy_sync_redis_up" not in text


def test_replication_gauges_follow_the_status():
    metrics = _metrics()
    state = {"status": _status(redis_up=True, lag_s=None)}
    metrics.watch_policy(lambda: 7, lambda: state["status"])
    text = generate_latest(metrics.registry).decode()
    assert "inferflux_policy_sync_redis_up 1.0" in text
    assert "inferflux_policy_replication_lag_seconds" not in text  # nothing applied yet
    state["status"] = _status(redis_up=False, lag_s=0.25)
    text = generate_latest(metrics.registry).decode()
    assert "inferflux_policy_sync_redis_up 0.0" in text
    assert "inferflux_policy_replication_lag_seconds 0.25" in text
