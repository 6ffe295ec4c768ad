"""Live config replication's pure parts: a snapshot read back, refused when it is not one
of this version or holds keys that are not live here, and turned into a PATCH body that
also removes the map entries the publisher no longer has."""

from __future__ import annotations

import pytest

from inferflux.api.config_sync import _as_patch, _decode, _encode
from inferflux.security.replication import SnapshotError


def test_a_snapshot_reads_back_only_as_its_version():
    values = {"scheduler.queue_timeout_s": 12.0}
    assert _decode(_encode(values, 3), 3) == values
    with pytest.raises(SnapshotError, match="version 4"):
        _decode(_encode(values, 3), 4)
    with pytest.raises(SnapshotError, match="not live"):
        _decode(_encode({"server.port": 1}, 1), 1)
    with pytest.raises(SnapshotError, match="not JSON"):
        _decode(b"\x00", 1)


def test_values_become_a_nested_patch_that_drops_missing_map_entries():
    values = {
        "scheduler.queue_timeout_s": 12.0,
        "scheduler.fairness.enable_preemption": False,
        "observability.tenant_logging": {"acme": {"log_level": "info"}},
    }
    held = {"observability.tenant_logging": {"acme": {}, "globex": {"log_level": "debug"}}}
    assert _as_patch(values, held) == {
        "scheduler": {"queue_timeout_s": 12.0, "fairness": {"enable_preemption": False}},
        "observability": {"tenant_logging": {"globex": None, "acme": {"log_level": "info"}}},
    }
